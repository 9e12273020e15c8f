"""More ATen rows of the torch.export importer: strided views, scatters, histograms, convs.

- `as_strided` is translated only when it is a view the catalogue already has: the same
  elements (ignoring size-1 dims) in the same order (a reshape) or permuted (a transpose, then
  a reshape); anything else (overlapping windows, offsets) raises UnsupportedOpError naming it.
  `strided_view` decides which, in O(rank log rank).
- scatter / scatter_add / scatter_reduce / index_put / slice_scatter / select_scatter: the
  result has the destination's shape; the written axis and every index/source dim that does not
  line up with the destination are FROZEN, the destination's other dims stay PARALLEL. They are
  approximations (the form keeps shapes and which dims can be cut, not the function) and are
  counted in the import report.
- histc: `x.., b -> b`, every input dim REDUCE(sum): a histogram is a sum of one-hot rows
  (approximated: the binning itself is not modelled), read against a CONSTANT of bin edges.
- conv1d / conv2d as export's IR keeps them (before the decomposition to `convolution`): the
  same lowering (`_build.conv`), arguments by schema name with their defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from shardplan.errors import UnsupportedOpError
from shardplan.importers._aten_views import _arg, _pair
from shardplan.importers._build import conv

if TYPE_CHECKING:
    from torch.fx import Node

    from shardplan.importers.torch import _Context


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _contiguous(dims: Sequence[tuple[int, int]]) -> bool:
    expect = 1
    for size, stride in reversed(dims):
        if stride != expect:
            return False
        expect *= size
    return True


def strided_view(
    shape: Sequence[int],
    strides: Sequence[int],
    size: Sequence[int],
    stride: Sequence[int],
    offset: int = 0,
) -> tuple[int, ...] | None:
    """How `as_strided(x, size, stride, offset)` reads `x` (shape, strides): the permutation of
    x's non-unit dims to apply before reshaping to `size`, or None if it is not such a view."""
    src = [(n, s) for n, s in zip(shape, strides, strict=True) if n != 1]
    dst = [(n, s) for n, s in zip(size, stride, strict=True) if n != 1]
    if offset or _numel(size) != _numel(shape):
        return None
    if src == dst or (_contiguous(src) and _contiguous(dst)):
        return tuple(range(len(src)))
    if sorted(src) == sorted(dst) and len(set(src)) == len(src):
        return tuple(src.index(d) for d in dst)
    return None


def _as_strided(ctx: _Context, node: Node) -> Any:
    x = node.args[0]
    size, stride = tuple(node.args[1]), tuple(node.args[2])
    offset = node.args[3] if len(node.args) > 3 and node.args[3] is not None else 0
    val = x.meta["val"]
    shape, strides = tuple(int(s) for s in val.shape), tuple(int(s) for s in val.stride())
    perm = strided_view(shape, strides, size, stride, int(offset))
    if perm is None:
        raise UnsupportedOpError(
            f"as_strided(size={list(size)}, stride={list(stride)}, offset={offset}) of a "
            f"{list(shape)} tensor with strides {list(strides)} is not a reshape or transpose "
            "of it (overlapping or offset windows); rewrite the model with unfold/view, or "
            "import with unknown='replicate'"
        )
    value: Any = x
    if perm != tuple(range(len(perm))):
        squeezed = tuple(n for n in shape if n != 1)
        if squeezed != shape:
            value = ctx.emit("reshape", [value], node, part="squeeze", shape=squeezed)
        value = ctx.emit("transpose", [value], node, part="permute", perm=perm)
        return ctx.emit("reshape", [value], node, shape=tuple(size))
    if tuple(size) == shape:
        return ctx.value(x)
    return ctx.emit("reshape", [value], node, shape=tuple(size))


def _written(
    ctx: _Context, node: Node, dest: Node, operands: Sequence[Any], axes: Sequence[int]
) -> Any:
    """The destination-shaped form of a write into `dest` at `axes` (see the module doc)."""
    out = ctx.shape(dest)
    names = [f"c{j}" if j in axes else f"a{j}" for j in range(len(out))]
    frozen = [names[j] for j in axes]
    specs, tensors = [" ".join(names)], [ctx.tensor(dest)]
    for t, operand in enumerate(operands):
        shape = ctx.shape(operand)
        lead = len(out) - len(shape)
        own = []
        for j, n in enumerate(shape):
            k = j + lead
            if 0 <= k < len(out) and k not in axes and n == out[k]:
                own.append(names[k])
            else:  # a dim that does not line up with the destination's: never cut
                own.append(f"u{t}_{j}")
                frozen.append(own[-1])
        specs.append(" ".join(own))
        tensors.append(ctx.tensor(operand))
    spec = f"{', '.join(specs)} -> {' '.join(names)}"
    return ctx.emitter.op(
        "einsum",
        tensors,
        **ctx.target(node, "", None),
        flops=_numel(out),
        approx=str(node.target),
        source=str(node.target),
        spec=spec,
        frozen=tuple(frozen),
    )


def _scatter(ctx: _Context, node: Node) -> Any:
    """scatter(x, dim, index, value|src), scatter_add, scatter_reduce: written axis FROZEN."""
    x, dim, index = node.args[:3]
    axis = dim % len(ctx.shape(x))
    src = [a for a in node.args[3:4] if hasattr(a, "meta")]
    return _written(ctx, node, x, [index, *src], [axis])


def _index_put(ctx: _Context, node: Node) -> Any:
    """x[indices] = values (or +=): the indexed axes FROZEN."""
    x, indices, values = node.args[:3]
    axes = [j for j, t in enumerate(indices) if t is not None]
    operands = [t for t in indices if t is not None] + ([values] if hasattr(values, "meta") else [])
    return _written(ctx, node, x, operands, axes)


def _slice_scatter(ctx: _Context, node: Node) -> Any:
    """slice_scatter(x, src, dim, ...) / select_scatter: x with a slice replaced; axis FROZEN."""
    x, src = node.args[:2]
    dim = node.args[2] if len(node.args) > 2 else 0
    return _written(ctx, node, x, [src], [dim % len(ctx.shape(x))])


def _histc(ctx: _Context, node: Node) -> Any:
    x = node.args[0]
    bins = ctx.shape(node)[0]
    names = [f"x{j}" for j in range(len(ctx.shape(x)))]
    edges = ctx.index_constant(node, (bins,), "bins")
    return ctx.emitter.op(
        "einsum",
        [ctx.tensor(x), edges],
        **ctx.target(node, "", None),
        flops=_numel(ctx.shape(x)),
        approx=str(node.target),
        source=str(node.target),
        spec=f"{' '.join(names)}, b -> b",
    )


def _conv_nd(ctx: _Context, node: Node) -> Any:
    """conv1d / conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1)."""
    x, w = node.args[:2]
    rank = len(ctx.shape(x))
    padding = _arg(node, 4, 0)
    if isinstance(padding, str):
        raise UnsupportedOpError(f"convolution with padding={padding!r}")
    dilation = _arg(node, 5, 1)
    if any(d != 1 for d in (dilation if isinstance(dilation, (list, tuple)) else [dilation])):
        raise UnsupportedOpError(f"dilated convolution (dilation={dilation})")
    if rank not in (3, 4):
        raise UnsupportedOpError(f"{rank - 2}-D convolution; the catalogue has conv2d only")
    bias = _arg(node, 2)
    stride, groups = _pair(_arg(node, 3, 1)), int(_arg(node, 6, 1))
    return conv(ctx, node, x, w, bias, stride, _pair(padding), groups)


def _pad(ctx: _Context, node: Node) -> Any:
    """aten.pad (export's IR before decomposition) in constant mode: as constant_pad_nd."""
    from shardplan.importers._aten_select import _constant_pad

    mode = _arg(node, 2, "constant")
    if mode != "constant":
        raise UnsupportedOpError(f"aten.pad mode {mode!r}: only constant padding has a rule")
    return _constant_pad(ctx, node, fill_arg=3)


def _cross_entropy_loss(ctx: _Context, node: Node) -> Any:
    """aten.cross_entropy_loss (export's IR before decomposition) with the mean reduction: the
    catalogue's cross_entropy (ignored labels and class weights change values, not the work)."""
    reduction = _arg(node, 3, 1)
    if reduction != 1:
        raise UnsupportedOpError(
            f"aten.cross_entropy_loss reduction {reduction}: only the mean (1) has a rule"
        )
    approx = _arg(node, 2) is not None or bool(_arg(node, 5, 0.0))  # weights, label smoothing
    return ctx.emit("cross_entropy", node.args[:2], node, approx=approx)


def register_more(reg: Callable[..., Callable[[Any], Any]]) -> None:
    """Add this module's rows to the ATen table (`reg` is `TranslationTable.register`)."""
    reg("aten.as_strided.default")(_as_strided)
    reg("aten.pad.default")(_pad)
    reg("aten.cross_entropy_loss.default")(_cross_entropy_loss)
    reg(
        "aten.scatter.value",
        "aten.scatter.src",
        "aten.scatter_add.default",
        "aten.scatter_reduce.two",
    )(_scatter)
    reg("aten.index_put.default")(_index_put)
    reg("aten.slice_scatter.default", "aten.select_scatter.default")(_slice_scatter)
    reg("aten.histc.default")(_histc)
    reg("aten.conv1d.default", "aten.conv2d.default")(_conv_nd)
