"""Selection rows of the ATen table (`shardplan.importers._aten.aten_table`): slices, splits,
indexing, gathers, top-k, padding, embedding lookups and concatenation.

Each is a gather-like einsum form of `shardplan.importers._build` (the indexed axis REDUCE(sum),
or FROZEN where the selection needs the whole axis) except `embedding` and `concat`, which the
catalogue names. Same row contract as `_aten`: `(ctx, node) -> value`, `UnsupportedOpError`
before emitting anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shardplan.errors import UnsupportedOpError
from shardplan.importers._aten_views import _arg, _axis

if TYPE_CHECKING:
    from torch.fx import Node

    from shardplan.importers.torch import _Context


# -- rules: selections (gather-like einsum forms, see `_build`) -----------------------------------
def _slice_positions(
    ctx: _Context,
    node: Node,
    x: Node,
    axis: int,
    start: Any,
    end: Any,
    step: Any,
    part: str = "",
    result: int | None = None,
) -> Any:
    size = ctx.shape(x)[axis]
    positions = range(size)[slice(start, end, step or 1)]
    if len(positions) == size:
        return ctx.value(x)
    index = ctx.index_constant(node, (len(positions),), f"index{'' if result is None else result}")
    return ctx.gather(
        node, x, [index], axis, part=part, result=result, start=positions.start, step=positions.step
    )


def _slice(ctx: _Context, node: Node) -> Any:
    x = node.args[0]
    axis = _axis(_arg(node, 1, 0), len(ctx.shape(x)))
    return _slice_positions(ctx, node, x, axis, _arg(node, 2), _arg(node, 3), _arg(node, 4, 1))


def _narrow(ctx: _Context, node: Node) -> Any:
    x, dim, start, length = node.args[:4]
    axis = _axis(dim, len(ctx.shape(x)))
    return _slice_positions(ctx, node, x, axis, start, start + length, 1)


def _select(ctx: _Context, node: Node) -> Any:
    x, dim, position = node.args[:3]
    axis = _axis(dim, len(ctx.shape(x)))
    return ctx.gather(node, x, [ctx.index_constant(node, ())], axis, position=position)


def _split_sizes(ctx: _Context, node: Node, sizes: Sequence[int], dim: int) -> Any:
    x = node.args[0]
    axis = _axis(dim, len(ctx.shape(x)))
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    used = ctx.used(node)
    return [
        _slice_positions(ctx, node, x, axis, offsets[i], offsets[i] + sizes[i], 1, result=i)
        if i in used and sizes[i] > 0
        else None
        for i in range(len(sizes))
    ]  # empty: dropped


def _split_with_sizes(ctx: _Context, node: Node) -> Any:
    return _split_sizes(ctx, node, list(node.args[1]), _arg(node, 2, 0))


def _split(ctx: _Context, node: Node) -> Any:
    sizes = [
        ctx.shape(node, i)[_axis(_arg(node, 2, 0), len(ctx.shape(node.args[0])))]
        for i in range(len(node.meta["val"]))
    ]
    return _split_sizes(ctx, node, sizes, _arg(node, 2, 0))


def _unbind(ctx: _Context, node: Node) -> Any:
    x = node.args[0]
    axis = _axis(_arg(node, 1, 0), len(ctx.shape(x)))
    return ctx.per_result(
        node,
        lambda i: ctx.gather(
            node, x, [ctx.index_constant(node, (), f"index{i}")], axis, result=i, position=i
        ),
    )


def _index(ctx: _Context, node: Node) -> Any:
    """x[..., idx, ...] with one or several adjacent index tensors; a 2-D table -> embedding."""
    x, indices = node.args[0], list(node.args[1])
    at = [i for i, t in enumerate(indices) if t is not None]
    if not at:
        return ctx.value(x)
    if at != list(range(at[0], at[-1] + 1)):
        raise UnsupportedOpError(f"advanced indices at non-adjacent positions {at}")
    if any(str(indices[i].meta["val"].dtype) == "torch.bool" for i in at):
        raise UnsupportedOpError("boolean-mask indexing has a data-dependent shape")
    if len(ctx.shape(x)) == 2 and at == [0]:
        return ctx.emit("embedding", [x, indices[0]], node)  # exact: same lookup
    return ctx.gather(node, x, [indices[i] for i in at], at[0])


def _index_select(ctx: _Context, node: Node) -> Any:
    x, dim, index = node.args[:3]
    axis = _axis(dim, len(ctx.shape(x)))
    if axis == 0 and len(ctx.shape(x)) == 2 and len(ctx.shape(index)) == 1:
        return ctx.emit("embedding", [x, index], node)
    return ctx.gather(node, x, [index], axis)


def _gather(ctx: _Context, node: Node) -> Any:
    x, dim, index = node.args[:3]
    return ctx.emitter.gather_elements(
        ctx.tensor(x),
        ctx.tensor(index),
        _axis(dim, len(ctx.shape(x))),
        **ctx.target(node, "", None),
        approx=str(node.target),
        source=str(node.target),
    )


def _topk(ctx: _Context, node: Node) -> Any:
    """values and indices: a selection of k along a FROZEN axis (topk needs the whole axis)."""
    x, k = node.args[:2]
    axis = _axis(_arg(node, 2, -1), len(ctx.shape(x)))
    index = ctx.index_constant(node, (k,))
    return ctx.per_result(
        node, lambda i: ctx.gather(node, x, [index], axis, result=i, frozen=True, k=k)
    )


def _constant_pad(ctx: _Context, node: Node, fill_arg: int = 2) -> Any:
    """Padding grows one axis at a time: a gather-like read of positions (pad -> the fill, read
    from argument `fill_arg`: 2 in constant_pad_nd, 3 in pad)."""
    x, pad = node.args[0], list(node.args[1])
    fill = _arg(node, fill_arg, 0)
    fill = 0 if fill is None else fill  # aten.pad's value=None pads with zeros
    shape, out = list(ctx.shape(x)), ctx.shape(node)
    value: Any = x
    changed = [j for j in range(len(shape)) if shape[j] != out[j]]
    for n, j in enumerate(changed):
        index = ctx.index_constant(node, (out[j],), f"index{j}")
        last = n == len(changed) - 1
        value = ctx.gather(
            node,
            value,
            [index],
            j,
            part="" if last else f"pad{j}",
            pad=tuple(pad),
            fill=fill,
        )
    return value if changed else ctx.value(x)


def _embedding(ctx: _Context, node: Node) -> Any:
    return ctx.emit("embedding", node.args[:2], node)


def _cat(ctx: _Context, node: Node) -> Any:
    tensors = [t for t in node.args[0] if min(ctx.shape(t), default=1) > 0]
    if len(tensors) == 1:
        return ctx.value(tensors[0])
    return ctx.emit("concat", tensors, node, axis=_axis(_arg(node, 1, 0), len(ctx.shape(node))))


def _stack(ctx: _Context, node: Node) -> Any:
    out = ctx.shape(node)
    axis = _axis(_arg(node, 1, 0), len(out))
    parts = [
        ctx.emit(
            "reshape", [t], node, part=f"unsqueeze{i}", shape=out[:axis] + (1,) + out[axis + 1 :]
        )
        for i, t in enumerate(node.args[0])
    ]
    return ctx.emit("concat", parts, node, axis=axis)
