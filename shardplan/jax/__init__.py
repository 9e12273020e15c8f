"""Run a plain JAX function under a plan: `shard(fn, plan, mesh)` and `partition_specs(plan,
axis_names)`. Importing this package does not import jax; calling does.
"""

from __future__ import annotations

from shardplan.jax.shard import axis_layouts, partition_specs, shard

__all__ = ["axis_layouts", "partition_specs", "shard"]
