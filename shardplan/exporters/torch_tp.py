"""A plan as PyTorch tensor-parallel styles: `to_torch_tp(plan)` -> the `parallelize_plan` dict of
`torch.distributed.tensor.parallel.parallelize_module`, keyed by module path.

PyTorch's styles describe one mesh axis (a 1-D DeviceMesh) and the Megatron pattern on it: a
`ColwiseParallel` linear splits its output features, the ops after it run on the local shards,
and a `RowwiseParallel` linear takes the split features and all-reduces its result. So a plan is
expressible on axis `a` (default: the innermost axis) exactly when, on the rounds of `a`:
1. every op cuts the same loop dim in all rounds of `a` (one placement per axis);
2. a parameter is split only as the weight of a `linear` op (dim 0: Colwise, dim 1: Rowwise) or
   of an `embedding` (vocabulary dim 0: Rowwise, hidden dim 1: Colwise), owned by the module the
   op belongs to (`<op.layer>.weight`);
3. no activation is redistributed on `a`: every consumer reads each input in the layout its
   producer leaves (graph inputs replicated), so the local shards between a Colwise and a
   Rowwise layer are exactly what the plan computes, and nothing the styles do not insert
   (all-gathers, slices, all-to-alls) would be needed;
4. partial sums on `a` come only from Rowwise layers (which all-reduce them), and graph outputs
   are replicated on `a`.
The other mesh axes are left to data parallelism (DDP/FSDP over them): they may not split a
parameter (a split of activations there is a batch split the styles do not need to know).
Anything else raises PlanError naming the op and what to do. `torch_tp_styles` gives the same
as strings and needs no torch. Cost: O(|ops| * rounds + |edges|).
"""

from __future__ import annotations

from typing import Any

from shardplan.errors import PlanError
from shardplan.ir.op import Role
from shardplan.lazy import require
from shardplan.plans import Plan
from shardplan.sharding import PARTIAL, REPLICATED, operand_layout, resolved

_WEIGHT_STYLES = {
    ("linear", 0): "colwise",
    ("linear", 1): "rowwise",
    ("embedding", 0): "rowwise",
    ("embedding", 1): "colwise",
}
"""(op kind, split weight dim) -> the style of the module owning the weight."""


def _axis_of(plan: Plan, axis: int | str | None) -> int:
    names = plan.mesh.names
    if axis is None:
        return len(plan.mesh.shape) - 1
    if isinstance(axis, str):
        if axis not in names:
            raise PlanError(f"to_torch_tp: mesh {plan.mesh.text()} has axes {names}, not {axis!r}")
        return names.index(axis)
    if not 0 <= axis < len(names):
        raise PlanError(f"to_torch_tp: axis {axis} is not an axis of mesh {plan.mesh.text()}")
    return axis


def torch_tp_styles(plan: Plan, axis: int | str | None = None) -> dict[str, str]:
    """Module path -> `"colwise"`, `"colwise_gather"` (a column-parallel layer whose result is a
    graph output: `ColwiseParallel(output_layouts=Replicate())`) or `"rowwise"` for the plan on
    mesh axis `axis` (see the module docstring for when a plan is expressible; PlanError naming
    the op otherwise)."""
    a = _axis_of(plan, axis)
    mesh, graph = plan.mesh, plan.graph
    rounds = [r.index for r in mesh.rounds if r.mesh_axis == a]
    others = [r.index for r in mesh.rounds if r.mesh_axis != a]
    if not rounds:
        raise PlanError(f"to_torch_tp: axis {mesh.names[a]!r} of {mesh.text()} has size 1")

    def on_axis(layout: tuple[int, ...], what: str) -> int:
        picked = [layout[r] for r in rounds]
        if len(set(picked)) > 1:
            raise PlanError(
                f"to_torch_tp: {what} is laid out {picked} in the rounds of axis "
                f"{mesh.names[a]!r}; a 1-D tensor-parallel style needs one placement per axis "
                "(use shardplan.torch.parallelize, which runs any plan)"
            )
        return picked[0]

    styles: dict[str, str] = {}
    produced: dict[str, int] = {}
    for op in graph.ops:
        strategy = tuple(plan.strategies[op.name])
        if len({strategy[r] for r in rounds}) > 1:
            raise PlanError(
                f"to_torch_tp: op {op.name!r} ({op.kind}) cuts {[strategy[r] for r in rounds]} "
                f"in the rounds of axis {mesh.names[a]!r}; a tensor-parallel style cuts one "
                "dim per axis (use shardplan.torch.parallelize)"
            )
        style = None
        for i, name in enumerate(op.inputs):
            tensor = graph.tensors[name]
            read = operand_layout(op, strategy, i)
            here = on_axis(read, f"operand {name!r} of op {op.name!r}")
            if tensor.role is Role.PARAMETER:
                if any(read[r] >= 0 for r in others):
                    raise PlanError(
                        f"to_torch_tp: op {op.name!r} reads parameter {name!r} split on another "
                        f"axis than {mesh.names[a]!r}; torch TP styles cover one axis (shard "
                        "the others with FSDP, or use shardplan.torch.parallelize)"
                    )
                if here < 0:
                    continue
                if name == f"{op.layer}.bias" and here == 0 and styles.get(op.layer) == "colwise":
                    continue  # a column-parallel layer's bias is split with its output features
                style = _WEIGHT_STYLES.get((op.kind, here))
                if style is None or name != f"{op.layer}.weight":
                    raise PlanError(
                        f"to_torch_tp: op {op.name!r} ({op.kind}, module {op.layer!r}) splits "
                        f"parameter {name!r} along dim {here}; ColwiseParallel/RowwiseParallel "
                        "only split the weight of an nn.Linear (dim 0 or 1) or nn.Embedding "
                        "(use shardplan.torch.parallelize)"
                    )
                styles[op.layer] = style
                continue
            source = produced.get(name, REPLICATED)
            if here != source:
                raise PlanError(
                    f"to_torch_tp: op {op.name!r} ({op.kind}) reads {name!r} as "
                    f"{_text(here)} on axis {mesh.names[a]!r} but it is {_text(source)} there; "
                    "torch TP styles insert no redistribution between layers (use "
                    "shardplan.torch.parallelize)"
                )
        for i, name in enumerate(op.outputs):
            raw = on_axis(operand_layout(op, strategy, i, True), f"result {name!r}")
            if raw == PARTIAL and style != "rowwise":
                raise PlanError(
                    f"to_torch_tp: op {op.name!r} ({op.kind}) leaves partial sums on axis "
                    f"{mesh.names[a]!r}; only a RowwiseParallel layer all-reduces them"
                )
            produced[name] = resolved((raw,))[0]
    consumed = {t for op in graph.ops for t in op.inputs}
    layer_of = {name: op.layer for op in graph.ops for name in op.outputs}
    for name, layout in produced.items():
        if name in consumed or layout == REPLICATED:
            continue
        if styles.get(layer_of[name]) == "colwise":
            styles[layer_of[name]] = "colwise_gather"  # e.g. an LM head: gather the logits
        else:
            raise PlanError(
                f"to_torch_tp: graph output {name!r} is split on axis {mesh.names[a]!r} by "
                f"a layer that is not column-parallel; the module would return a local shard"
            )
    return styles


def _text(layout: int) -> str:
    return (
        "replicated"
        if layout == REPLICATED
        else "partial"
        if layout == PARTIAL
        else (f"split along dim {layout}")
    )


def to_torch_tp(plan: Plan, axis: int | str | None = None) -> dict[str, Any]:
    """`{module path: ColwiseParallel() | RowwiseParallel()}` for `parallelize_module(module,
    device_mesh[axis_name], ...)` (see `torch_tp_styles`; needs torch)."""
    styles = torch_tp_styles(plan, axis)
    require("torch.distributed.tensor.parallel", extra="torch", user="to_torch_tp")
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    kinds = {op.layer: op.kind for op in plan.graph.ops if op.layer in styles}
    out: dict[str, Any] = {}
    for path, style in styles.items():
        if style == "colwise":
            out[path] = ColwiseParallel()
        elif style == "colwise_gather":
            out[path] = ColwiseParallel(output_layouts=Replicate())
        elif kinds.get(path) == "embedding":  # vocabulary-split lookup: the input ids are whole
            out[path] = RowwiseParallel(input_layouts=Replicate())
        else:
            out[path] = RowwiseParallel()
    return out


__all__ = ["to_torch_tp", "torch_tp_styles"]
