"""A plan as torch DTensor placements: one `Shard(d)` / `Replicate()` / `Partial()` per ROUND.

The DeviceMesh is shaped like the plan's rounds, not like its mesh axes: one mesh dim per round
(`mesh_shape(plan)`, sizes q, named `r0`, `r1`, ...), devices in row-major order. A mesh `2x4`
(rounds 2 | 2, 2) becomes a DeviceMesh of shape (2, 2, 2); the rounds of one mesh axis are
contiguous and outer axes come first, so the device at mesh coordinates (a0, a1) has the same
rank a0 * 4 + a1 in both meshes (the round mesh is a reshape of the plan's mesh). This choice is
what makes every plan expressible: a plan may cut different loop dims in the rounds of one axis
(e.g. batch in round 1 and hidden in round 2 of an axis of 4), which placements over the axis
itself could not say. Several rounds may split the same tensor dim (`(Shard(0), Shard(0))`);
DTensor then shards in mesh-dim order, i.e. round order, which is exactly shardplan's meaning
(a later round splits the block an earlier round left): the block index along the dim is
`c_r0 * q_r1 + c_r1` for rounds r0 < r1 with coordinates c.

What each tensor gets (`placements(plan)`), per round:
- an activation: its producer's raw output layout, so a REDUCE cut (partial sums) is `Partial()`
  (`Partial("max")` for a max-reduction), a split is `Shard(d)`, no cut or a cut that does not
  index it is `Replicate()`;
- a parameter: its home (`Plan.tensor_layouts()`: an FSDP/ZeRO storage layout if the plan has
  one, else the layout its first consumer reads);
- a graph input or constant: the layout its first consumer reads (`Plan.input_layouts()`);
- a tensor nobody reads: `Replicate()` everywhere.

A mesh of one device has no rounds: every tuple is empty (`run_distributed` then uses a trivial
DeviceMesh of shape (1,)). `placement_texts` gives the same as strings (`"S(0)"`, `"R"`,
`"P(sum)"`, `"P(max)"`: `shardplan.sharding.Placement`) and needs no torch; `placements`
returns real `torch.distributed.tensor` objects when torch is importable. Everything is
O(|tensors| + |ops| * rounds).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from shardplan.errors import MissingDependencyError, PlanError
from shardplan.ir.op import Role
from shardplan.lazy import require
from shardplan.mesh import Mesh
from shardplan.plans import Plan
from shardplan.sharding import (
    Layout,
    Placement,
    operand_layout,
    partial_reducers,
)
from shardplan.sharding import placements as sharding_placements

Form = Literal["auto", "torch", "text"]


def mesh_shape(plan_or_mesh: Plan | Mesh) -> tuple[int, ...]:
    """The DeviceMesh shape of a plan: q of every round, outermost first (`()` for 1 device)."""
    mesh = plan_or_mesh.mesh if isinstance(plan_or_mesh, Plan) else plan_or_mesh
    return tuple(r.q for r in mesh.rounds)


def mesh_dim_names(plan_or_mesh: Plan | Mesh) -> tuple[str, ...]:
    """The DeviceMesh dim names: `("r0", "r1", ...)` (the JAX backend's round axis names)."""
    mesh = plan_or_mesh.mesh if isinstance(plan_or_mesh, Plan) else plan_or_mesh
    return tuple(f"r{r.index}" for r in mesh.rounds)


def layout_texts(layout: Layout, reducers: Sequence[str | None] | None = None) -> tuple[str, ...]:
    """A Layout as placement strings (`shardplan.sharding.Placement`): `S(d)`, `R`, `P(sum)`,
    `P(max)` / `P(min)`."""
    return tuple(str(p) for p in sharding_placements(layout, reducers))


def _require_placements() -> Any:
    hint = "or use placement_texts(plan) / placements(plan, form='text'), which need no torch"
    return require("torch.distributed.tensor", extra="torch", user="DTensor placements", hint=hint)


def to_placements(texts: Sequence[str]) -> tuple[Any, ...]:
    """Placement strings (`S(d)`, `R`, `P`, `P(sum)`, `P(max)`) -> `torch.distributed.tensor`
    placement objects (needs torch)."""
    dt = _require_placements()
    out: list[Any] = []
    for text in texts:
        p = Placement.parse(text)
        if p.dim is not None:
            out.append(dt.Shard(p.dim))
        elif p.reducer is not None:
            out.append(dt.Partial(p.reducer))
        else:
            out.append(dt.Replicate())
    return tuple(out)


def placement_texts(plan: Plan) -> dict[str, tuple[str, ...]]:
    """Tensor name -> per-round placement strings, for every tensor of the plan's graph.

    Order: graph tensors in declaration order. See the module docstring for what each role gets.
    """
    graph = plan.graph
    rounds = plan.mesh.rounds
    produced: dict[str, tuple[str, ...]] = {}
    for op in graph.ops:
        strategy = tuple(plan.strategies[op.name])
        for i, name in enumerate(op.outputs):
            layout = operand_layout(op, strategy, i, True)
            produced[name] = layout_texts(layout, partial_reducers(op, strategy, i))
    homes = plan.tensor_layouts()
    inputs = plan.input_layouts()
    replicated = (str(Placement.replicate()),) * len(rounds)
    out: dict[str, tuple[str, ...]] = {}
    for name, tensor in graph.tensors.items():
        if name in produced:
            out[name] = produced[name]
        elif tensor.role is Role.PARAMETER and name in homes:
            out[name] = layout_texts(homes[name])
        elif name in inputs:
            out[name] = layout_texts(inputs[name])
        else:
            out[name] = replicated
    return out


def placements(plan: Plan, form: Form = "auto") -> dict[str, tuple[Any, ...]]:
    """Tensor name -> per-round DTensor placements for every tensor of `plan.graph`.

    Args:
        form: "torch" returns `torch.distributed.tensor` `Shard`/`Replicate`/`Partial` objects
            (MissingDependencyError without torch); "text" returns the strings of
            `placement_texts`; "auto" (default) returns objects when torch is importable and
            strings otherwise.

    Use them on a DeviceMesh of shape `mesh_shape(plan)` (see `device_mesh`):
        >>> p = placements(plan)                                            # doctest: +SKIP
        >>> w = distribute_tensor(weight, device_mesh(plan), p["fc0.weight"])  # doctest: +SKIP
    """
    if form not in ("auto", "torch", "text"):
        raise PlanError(f"placements: form must be 'auto', 'torch' or 'text', not {form!r}")
    texts = placement_texts(plan)
    if form == "text":
        return dict(texts)
    if form == "auto":
        try:
            _require_placements()
        except MissingDependencyError:
            return dict(texts)
    return {name: to_placements(t) for name, t in texts.items()}


def device_mesh(plan_or_mesh: Plan | Mesh, device_type: str = "cpu") -> Any:
    """`init_device_mesh(device_type, mesh_shape(plan), mesh_dim_names=("r0", ...))`.

    Needs torch and a torch.distributed world of exactly the plan's device count (it initializes
    the default process group from the environment if none is). A 1-device plan gets shape (1,).
    """
    _require_placements()
    from torch.distributed.device_mesh import init_device_mesh

    shape = mesh_shape(plan_or_mesh) or (1,)
    names = mesh_dim_names(plan_or_mesh) or ("r0",)
    return init_device_mesh(device_type, shape, mesh_dim_names=names)


def layouts_by_round(texts: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """`{"x": ("S(0)", "R")}` -> `{"x": "S(0) R"}` (for tables and JSON)."""
    return {name: " ".join(t) for name, t in texts.items()}


__all__ = [
    "device_mesh",
    "layout_texts",
    "layouts_by_round",
    "mesh_dim_names",
    "mesh_shape",
    "placement_texts",
    "placements",
    "to_placements",
]
