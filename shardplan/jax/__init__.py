"""Run a plain JAX function under a plan: `shard(fn, plan, mesh)`, and the plan's PartitionSpecs
over your own mesh axes: `partition_specs(plan, axis_names)` (`axis_layouts(plan)` is None when
the plan needs round axes). The code lives in `shardplan.engines.jaxpr` and
`shardplan.exporters.jax`; importing this package does not import jax, calling does.
"""

from __future__ import annotations

from shardplan.engines.jaxpr import shard
from shardplan.exporters.jax import axis_layouts, partition_specs

__all__ = ["axis_layouts", "partition_specs", "shard"]
