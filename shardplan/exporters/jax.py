"""A plan as JAX shardings: one JAX mesh axis per ROUND, a Layout as a PartitionSpec.

- `jax_mesh(mesh)`: a `jax.sharding.Mesh` with one axis per round (`r0`, `r1`, ..., sizes q,
  devices row-major over the rounds, i.e. outermost mesh axis first); `axis_names` its names.
- `partition_spec(layout, rank, mesh)`: entry j is the tuple of round axes split along tensor dim
  j (replicated and partial rounds contribute nothing).
- `named_sharding` / `shardings_for`: `NamedSharding`s per tensor, checked (rank, divisibility).
- `partition_specs(plan, axis_names=None)`: the PartitionSpec of every tensor of a plan (inputs,
  activations as their producers leave them, parameters at their homes), over round axes or,
  when expressible, over the mesh's own axis names (`axis_layouts` says whether it is).

The round mesh is the same as the DTensor exporter's (`shardplan.exporters.dtensor.mesh_shape`).
jax is imported inside the functions that need it; without it they raise MissingDependencyError.
Everything is O(|tensors| * rounds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shardplan.errors import BackendError, PlanError
from shardplan.exporters.axes import collapse
from shardplan.ir.graph import Graph
from shardplan.ir.op import Tensor
from shardplan.lazy import require
from shardplan.mesh import Mesh, parse_mesh
from shardplan.plans import Plan
from shardplan.sharding import REPLICATED, Layout

Layouts = Mapping[str, Layout]


def _require_jax() -> Any:
    return require("jax", extra="jax", user="JAX shardings")


def _as_mesh(mesh: Mesh | str | int) -> Mesh:
    return parse_mesh(mesh)


def axis_names(mesh: Mesh | str | int) -> tuple[str, ...]:
    """The JAX axis names of `mesh`'s rounds: `("r0", "r1", ...)`."""
    return tuple(f"r{r.index}" for r in _as_mesh(mesh).rounds)


def jax_mesh(mesh: Mesh | str | int) -> Any:
    """A `jax.sharding.Mesh` with one Auto axis per round (`r0`, `r1`, ...; sizes q).

    Devices are the first `mesh.size` of `jax.devices()`, laid out row-major over the rounds, so
    round 0 (outermost mesh axis) varies slowest.
    """
    jax = _require_jax()
    from jax.sharding import AxisType
    from jax.sharding import Mesh as JaxMesh

    mesh = _as_mesh(mesh)
    devices = jax.devices()
    if len(devices) < mesh.size:
        raise BackendError(
            f"mesh {mesh.text()} needs {mesh.size} devices but JAX sees {len(devices)}; on CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={mesh.size} before jax is imported"
        )
    rounds = mesh.rounds
    names = axis_names(mesh)
    if not rounds:  # a mesh of one device: one trivial axis
        return JaxMesh(np.array(devices[:1]), ("r0",), axis_types=(AxisType.Auto,))
    grid = np.array(devices[: mesh.size], dtype=object).reshape(tuple(r.q for r in rounds))
    return JaxMesh(grid, names, axis_types=(AxisType.Auto,) * len(rounds))


def _check_layout(layout: Layout, shape: tuple[int, ...], mesh: Mesh, what: str) -> None:
    rounds = mesh.rounds
    if len(layout) != len(rounds):
        raise BackendError(
            f"{what}: layout {tuple(layout)} has {len(layout)} entries but mesh "
            f"{mesh.text()} has {len(rounds)} rounds"
        )
    counts = [1] * len(shape)
    for r, s in zip(rounds, layout, strict=True):
        if s >= len(shape):
            raise BackendError(
                f"{what}: layout {tuple(layout)} splits tensor dim {s} but the "
                f"tensor has rank {len(shape)} (shape {shape})"
            )
        if s >= 0:
            counts[s] *= r.q
    for j, (size, count) in enumerate(zip(shape, counts, strict=True)):
        if size % count:
            raise BackendError(
                f"{what}: dim {j} of size {size} is not divisible into {count} "
                f"parts (layout {tuple(layout)} on mesh {mesh.text()})"
            )


def partition_spec(layout: Layout, rank: int, mesh: Mesh | str | int | None = None) -> Any:
    """PartitionSpec of `layout`: entry j is the tuple of round axes split along tensor dim j
    (None when no round splits it); REPLICATED and PARTIAL rounds contribute nothing."""
    _require_jax()
    from jax.sharding import PartitionSpec

    names = axis_names(mesh) if mesh is not None else tuple(f"r{i}" for i in range(len(layout)))
    if len(names) != len(layout):
        raise BackendError(
            f"layout {tuple(layout)} has {len(layout)} entries but the mesh has {len(names)} rounds"
        )
    entries: list[tuple[str, ...] | None] = []
    for j in range(rank):
        axes = tuple(name for name, s in zip(names, layout, strict=True) if s == j)
        entries.append(axes or None)
    for s in layout:
        if s >= rank:
            raise BackendError(
                f"layout {tuple(layout)} splits tensor dim {s} of a rank-{rank} tensor"
            )
    return PartitionSpec(*entries)


def named_sharding(jmesh: Any, mesh: Mesh, layout: Layout | None, tensor: Tensor) -> Any:
    """`NamedSharding` of `tensor` under `layout` on `jmesh` (replicated when layout is None)."""
    from jax.sharding import NamedSharding, PartitionSpec

    if layout is None:
        return NamedSharding(jmesh, PartitionSpec())
    _check_layout(layout, tensor.shape, mesh, f"tensor {tensor.name!r}")
    return NamedSharding(jmesh, partition_spec(layout, len(tensor.shape), mesh))


def shardings_for(graph: Graph, mesh: Mesh | str | int, tensor_layouts: Layouts) -> dict[str, Any]:
    """`NamedSharding` per tensor of `tensor_layouts` (tensor name -> Layout) on `jax_mesh(mesh)`.

    Raises BackendError naming the tensor for an unknown tensor, a layout of the wrong length,
    a split dim beyond the tensor's rank or a dim not divisible by its split count.
    """
    _require_jax()
    mesh = _as_mesh(mesh)
    jmesh = jax_mesh(mesh)
    out: dict[str, Any] = {}
    for name, layout in tensor_layouts.items():
        if name not in graph.tensors:
            raise BackendError(
                f"layout given for tensor {name!r}, which graph {graph.name!r} does not have"
            )
        out[name] = named_sharding(jmesh, mesh, layout, graph.tensors[name])
    return out


def partition_specs(plan: Plan, axis_names: Sequence[str] | None = None) -> dict[str, Any]:
    """JAX PartitionSpecs per tensor of `plan` (graph inputs as their first reader reads them).

    Args:
        axis_names: None: specs over `jax_mesh(plan.mesh)`, one axis per round (`r0`, ...). One
            name per MESH axis (e.g. `("data", "model")` for mesh 2x8): specs over those names,
            possible when every round of each axis splits the same tensor dim (or none) for
            every tensor (`shardplan.exporters.axes`); else PlanError naming the tensor.
    """
    layouts = {**plan.input_layouts(), **plan.tensor_layouts()}
    if axis_names is None:
        return {
            name: partition_spec(layout, len(plan.graph.tensors[name].shape), plan.mesh)
            for name, layout in layouts.items()
        }
    _require_jax()
    from jax.sharding import PartitionSpec

    names = tuple(axis_names)
    if len(names) != len(plan.mesh.shape):
        raise PlanError(
            f"partition_specs: {len(names)} axis names {names} for the "
            f"{len(plan.mesh.shape)} axes of mesh {plan.mesh.text()}"
        )
    out: dict[str, Any] = {}
    for name, layout in layouts.items():
        collapsed = collapse(layout, plan.mesh, REPLICATED)
        if collapsed is None:
            rounds = [f"r{r.index}:{r.axis_name}" for r in plan.mesh.rounds]
            raise PlanError(
                f"partition_specs: tensor {name!r} has layout {layout} over rounds {rounds}: "
                "the rounds of one mesh axis split different dims, which no PartitionSpec over "
                "the mesh's own axes says; use axis_names=None (round axes)"
            )
        dims: list[Any] = []
        for j in range(len(plan.graph.tensors[name].shape)):
            axes = tuple(a for a, s in zip(names, collapsed, strict=True) if s == j)
            dims.append(None if not axes else axes[0] if len(axes) == 1 else axes)
        out[name] = PartitionSpec(*dims)
    return out


def axis_layouts(plan: Plan) -> dict[str, tuple[int, ...]] | None:
    """Tensor -> split dim (or REPLICATED) per mesh AXIS, or None if some tensor's rounds of one
    axis disagree (the plan then needs a round-shaped mesh). O(|tensors| * rounds)."""
    out: dict[str, tuple[int, ...]] = {}
    for name, layout in {**plan.input_layouts(), **plan.tensor_layouts()}.items():
        collapsed = collapse(layout, plan.mesh, REPLICATED)
        if collapsed is None:
            return None
        out[name] = collapsed
    return out


__all__ = [
    "axis_layouts",
    "axis_names",
    "jax_mesh",
    "named_sharding",
    "partition_spec",
    "partition_specs",
    "shardings_for",
]
