"""The ATen -> catalogue translation table of the torch.export importer: `aten_table()`.

One row per ATen op (keyed by `str(OpOverload)`); a row is a function `(ctx, node) -> value` that
emits one or more catalogue ops through the importer's context (`shardplan.importers.torch`) and
returns the node's value: a tensor name, a list for multi-result nodes, or a pending `Lazy`.
Rows raise `UnsupportedOpError` before emitting anything when a case is outside the catalogue, so
the importer can fall back to an opaque op. Approximate rows (comments and `_ELEMENTWISE_*`) keep
result shapes and dim kinds exact and are counted in `ImportResult.approximated`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from shardplan.errors import UnsupportedOpError
from shardplan.importers._aten_select import (  # selection rows
    _cat,
    _constant_pad,
    _embedding,
    _gather,
    _index,
    _index_select,
    _narrow,
    _select,
    _slice,
    _split,
    _split_with_sizes,
    _stack,
    _topk,
    _unbind,
)
from shardplan.importers._aten_views import (  # the shared helpers and view rules
    Rule,
    _alias,
    _arg,
    _axes,
    _axis,
    _copy,
    _dropout,
    _expand,
    _extra,
    _is_node,
    _pair,
    _permute,
    _reshape,
    _t,
    _to_copy,
    _transpose,
)
from shardplan.importers._build import Lazy, TranslationTable, conv
from shardplan.ir.op import Role

if TYPE_CHECKING:
    from torch.fx import Node

    from shardplan.importers.torch import _Context


# -- rules: elementwise ---------------------------------------------------------------------------
def _unary(kind: str, approx: bool = False) -> Rule:
    def rule(ctx: _Context, node: Node) -> Any:
        return ctx.emit(kind, [node.args[0]], node, approx=approx, **_extra(node))

    return rule

_TENSOR_SPLIT = ("aten.tensor_split.indices", "aten.tensor_split.sections")
_ALIASES = (  # values that do not change
    "aten.clone.default",
    "aten.alias.default",
    "aten.detach.default",
    "aten.lift_fresh_copy.default",
    "aten.contiguous.default",
)


def _binary(kind: str, approx: bool = False) -> Rule:
    """Two tensors broadcast; a Python scalar operand becomes the `scalar` attribute
    (`scale` for a product or a quotient by a scalar)."""

    def rule(ctx: _Context, node: Node) -> Any:
        a, b = node.args[:2]
        attrs = {k: v for k, v in node.kwargs.items() if k == "alpha" and v != 1}
        if _is_node(a) and _is_node(b):
            return ctx.emit(kind, [a, b], node, approx=approx, **attrs)
        tensor, scalar = (a, b) if _is_node(a) else (b, a)
        if not approx and isinstance(scalar, (int, float)) and not isinstance(scalar, bool):
            if kind == "mul":
                return ctx.emit("scale", [tensor], node, value=scalar)
            if kind == "div" and _is_node(a) and scalar != 0:
                return ctx.emit("scale", [tensor], node, value=1 / scalar)
        return ctx.emit(
            kind, [tensor], node, approx=approx, scalar=scalar, reverse=not _is_node(a), **attrs
        )

    return rule


def _rsub(ctx: _Context, node: Node) -> Any:
    a, b = node.args[:2]
    if _is_node(b):
        return ctx.emit("sub", [b, a], node)
    return ctx.emit("sub", [a], node, scalar=b, reverse=True)


def _pow(ctx: _Context, node: Node) -> Any:
    x, p = node.args[:2]
    if not _is_node(x):  # scalar ** tensor = exp(tensor * log scalar)
        return ctx.emit("exp", [p], node, approx=True, base=x)
    if _is_node(p):
        return ctx.emit("mul", [x, p], node, approx=True)
    if p == 1:
        return ctx.value(x)
    if p == 2:
        return ctx.emit("mul", [x, x], node)
    if p in (0.5, -0.5):
        return ctx.emit("sqrt" if p == 0.5 else "rsqrt", [x], node)
    return ctx.emit("exp", [x], node, approx=True, exponent=p)


def _clamp(ctx: _Context, node: Node) -> Any:
    """clamp(x, lo, hi) = minimum(maximum(x, lo), hi), tensor or scalar bounds (exact)."""
    x = node.args[0]
    key = str(node.target)
    if key.startswith("aten.hardtanh"):
        lo, hi = _arg(node, 1, -1.0), _arg(node, 2, 1.0)
    elif key.startswith("aten.clamp_max"):
        lo, hi = None, _arg(node, 1)
    else:
        lo, hi = _arg(node, 1), _arg(node, 2)
    value: Any = x
    for kind, bound, last in (("maximum", lo, hi is None), ("minimum", hi, True)):
        if bound is None:
            continue
        part = "" if last else "lower"
        if _is_node(bound):
            value = ctx.emit(kind, [value, bound], node, part=part)
        else:
            value = ctx.emit(kind, [value], node, part=part, scalar=bound)
    return value if value is not x else ctx.value(x)


def _select_where(ctx: _Context, node: Node) -> Any:
    """where(c, a, b) / masked_fill(x, m, v): a broadcast select -> `maximum` of the operands."""
    tensors = [a for a in node.args if _is_node(a)]
    scalars = tuple(a for a in node.args if not _is_node(a))
    return ctx.emit("maximum", tensors, node, approx=True, scalars=scalars)


# -- rules: reductions and ops along one axis -----------------------------------------------------
def _reduce(
    kind: str, dims_at: int | None = 1, keep_at: int | None = 2, approx: bool = False
) -> Rule:
    def rule(ctx: _Context, node: Node) -> Any:
        x = node.args[0]
        rank = len(ctx.shape(x))
        axes = _axes(_arg(node, dims_at) if dims_at is not None else None, rank)
        keep = _arg(node, keep_at, False) if keep_at is not None else node.kwargs.get("keepdim")
        return ctx.per_result(
            node,
            lambda i: ctx.emit(
                kind, [x], node, index=i, approx=approx or bool(i), axes=axes, keepdims=bool(keep)
            ),
        )

    return rule


def _along(kind: str, approx: bool = False, default_dim: int = -1) -> Rule:
    """Shape-preserving ops along one FROZEN axis: softmax; scans and sorts approximated by it."""

    def rule(ctx: _Context, node: Node) -> Any:
        x = node.args[0]
        axis = _axis(_arg(node, 1, default_dim), len(ctx.shape(x)))
        return ctx.per_result(
            node, lambda i: ctx.emit(kind, [x], node, index=i, approx=approx, axis=axis)
        )

    return rule


# -- rules: normalization -------------------------------------------------------------------------
def _layer_norm(ctx: _Context, node: Node) -> Any:
    x, normalized, weight, bias = node.args[0], node.args[1], _arg(node, 2), _arg(node, 3)
    if len(normalized) != 1:
        raise UnsupportedOpError(
            f"layer norm over the last {len(normalized)} dims; the "
            "catalogue's layer_norm normalizes the last dim only"
        )
    inputs = [x] + [t for t in (weight, bias) if t is not None]
    return [ctx.emit("layer_norm", inputs, node, index=0, eps=_arg(node, 4)), None, None]


def _norm_params(ctx: _Context, node: Node, channels: int) -> list[Any]:
    params: list[Any] = []
    for position, fill in ((1, "ones"), (2, "zeros")):
        t = _arg(node, position)
        params.append(
            t
            if t is not None
            else ctx.emitter.tensor(
                f"{node.name}/{fill}", (channels,), ctx.dtype_bytes(node), Role.CONSTANT
            )
        )
    return params


def _batch_norm(ctx: _Context, node: Node) -> Any:
    """Every batch-norm variant: (x, weight, bias, ...) -> batch_norm; statistics dropped."""
    x = node.args[0]
    params = _norm_params(ctx, node, ctx.shape(x)[1])
    out = ctx.emit("batch_norm", [x, *params], node, index=0)
    return [out] + [None] * (len(node.meta["val"]) - 1)


def _group_norm(ctx: _Context, node: Node) -> Any:
    """Group norm keeps batch norm's form (n, c and spatial dims free; statistics dropped)."""
    x = node.args[0]
    params = _norm_params(ctx, node, ctx.shape(x)[1])
    return [
        ctx.emit("batch_norm", [x, *params], node, index=0, approx=True, groups=_arg(node, 6)),
        None,
        None,
    ]


# -- rules: contractions, convolution, pooling ----------------------------------------------------
def _matmul(ctx: _Context, node: Node, a: Node, b: Node, part: str = "") -> str:
    pending = ctx.value(b)
    if isinstance(pending, Lazy) and pending.transpose_of is not None:
        return ctx.emit("linear", [a, pending.transpose_of], node, part=part)
    return ctx.emit("matmul", [a, b], node, part=part)


def _mm(ctx: _Context, node: Node) -> Any:
    return _matmul(ctx, node, node.args[0], node.args[1])


def _with_bias(ctx: _Context, node: Node, y: str, bias: Node, axis: int = -1) -> str:
    attrs = (
        {k: v for k, v in (("beta", _arg(node, 3, 1)), ("alpha", _arg(node, 4, 1))) if v != 1}
        if str(node.target) != "aten.convolution.default"
        else {}
    )
    out = ctx.shape(node)
    if ctx.shape(bias) == (out[axis],):
        return ctx.emit("bias_add", [y, bias], node, axis=axis, **attrs)
    return ctx.emit("add", [y, bias], node, **attrs)


def _addmm(ctx: _Context, node: Node) -> Any:
    bias, a, b = node.args[:3]
    return _with_bias(ctx, node, _matmul(ctx, node, a, b, part="mm"), bias)


def _matmul_nd(ctx: _Context, node: Node) -> Any:
    """aten.matmul kept whole (see torch.py): a 2-D right operand -> matmul/linear; equal-rank
    batched operands -> one bmm over all batch dims, so heads stay a separate loop dim instead
    of being merged with the batch by ATen's reshape-bmm-reshape decomposition; a 2-D left
    operand applied to every matrix of a batched right one (Mamba's `dt_proj.weight @ x`) ->
    the exact einsum `m k, b.. k n -> b.. m n` (no broadcast copy of the left operand)."""
    a, b = node.args[:2]
    ra, rb = len(ctx.shape(a)), len(ctx.shape(b))
    if rb == 2 and ra >= 2:
        return _matmul(ctx, node, a, b)
    if ra == rb >= 3 and ctx.shape(a)[:-2] == ctx.shape(b)[:-2]:
        return ctx.emit("bmm", [a, b], node)
    if ra == 2 and rb >= 3:
        batch = " ".join(f"b{i}" for i in range(rb - 2))
        return ctx.emit("einsum", [a, b], node, spec=f"m k, {batch} k n -> {batch} m n")
    raise UnsupportedOpError(f"matmul of shapes {ctx.shape(a)} x {ctx.shape(b)}")


def _linear(ctx: _Context, node: Node) -> Any:
    """aten.linear kept whole: `linear` on the [out, in] weight over all leading dims, then the
    bias (ATen's decomposition would flatten the tokens into one dim around an addmm)."""
    x, w = node.args[:2]
    bias = _arg(node, 2)
    if len(ctx.shape(w)) != 2:
        raise UnsupportedOpError(f"linear with a {len(ctx.shape(w))}-D weight")
    if bias is None:
        return ctx.emit("linear", [x, w], node)
    y = ctx.emit("linear", [x, w], node, part="mm")
    return _with_bias(ctx, node, y, bias)


def simple_matmul(a_shape: Sequence[int], b_shape: Sequence[int]) -> bool:
    """Shapes `_matmul_nd` translates (torch.py keeps aten.matmul only when all are)."""
    ra, rb = len(a_shape), len(b_shape)
    same_batch = ra == rb >= 3 and tuple(a_shape[:-2]) == tuple(b_shape[:-2])
    return (rb == 2 and ra >= 2) or same_batch or (ra == 2 and rb >= 3)


def _bmm(ctx: _Context, node: Node) -> Any:
    return ctx.emit("bmm", node.args[:2], node)


def _baddbmm(ctx: _Context, node: Node) -> Any:
    bias, a, b = node.args[:3]
    return _with_bias(ctx, node, ctx.emit("bmm", [a, b], node, part="bmm"), bias)


def _convolution(ctx: _Context, node: Node) -> Any:
    """conv2d (any `groups`); conv1d as a conv2d over a height-1 image (exact). Bias -> bias_add
    on axis 1."""
    x, w, bias, stride, padding, dilation, transposed, _, groups = node.args[:9]
    rank = len(ctx.shape(x))
    if transposed:
        raise UnsupportedOpError("transposed convolution is not in the catalogue")
    if any(d != 1 for d in dilation):
        raise UnsupportedOpError(f"dilated convolution (dilation={list(dilation)})")
    if rank not in (3, 4):
        raise UnsupportedOpError(f"{rank - 2}-D convolution; the catalogue has conv2d only")
    return conv(ctx, node, x, w, bias, _pair(stride), _pair(padding), int(groups))


def _pool(ctx: _Context, node: Node) -> Any:
    """max_pool2d_with_indices / avg_pool2d -> pool2d (floor mode, no dilation)."""
    x = node.args[0]
    kernel = _pair(node.args[1])
    stride, padding = _pair(_arg(node, 2), kernel), _pair(_arg(node, 3), (0, 0))
    is_max = "max_pool" in str(node.target)
    if is_max and _pair(_arg(node, 4), (1, 1)) != (1, 1):
        raise UnsupportedOpError("dilated max pooling")
    shape = ctx.shape(x)
    if len(shape) != 4:
        raise UnsupportedOpError(f"pooling of a rank-{len(shape)} input (need [n, c, h, w])")
    floor = tuple((shape[2 + j] + 2 * padding[j] - kernel[j]) // stride[j] + 1 for j in (0, 1))
    out = ctx.shape(node, 0 if is_max else None)
    if floor != out[2:]:
        raise UnsupportedOpError(f"ceil-mode pooling (output {out[2:]}, floor mode gives {floor})")
    y = ctx.emit(
        "pool2d",
        [x],
        node,
        index=0 if is_max else None,
        kernel=kernel,
        stride=stride,
        padding=padding,
        mode="max" if is_max else "avg",
    )
    return [y, None] if is_max else y


def _adaptive_avg_pool(ctx: _Context, node: Node) -> Any:
    x, (oh, ow) = node.args[0], _pair(node.args[1])
    shape = ctx.shape(x)
    if len(shape) != 4:
        raise UnsupportedOpError(f"adaptive pooling of a rank-{len(shape)} input")
    if (oh, ow) == (1, 1):
        return ctx.emit("reduce_mean", [x], node, axes=(2, 3), keepdims=True)
    if shape[2] % oh or shape[3] % ow:
        raise UnsupportedOpError(f"adaptive pooling {shape[2:]} -> {(oh, ow)} with uneven windows")
    kernel = (shape[2] // oh, shape[3] // ow)
    return ctx.emit("pool2d", [x], node, kernel=kernel, stride=kernel, padding=(0, 0), mode="avg")


# -- the table ------------------------------------------------------------------------------------
# Elementwise ops: ATen op -> (catalogue kind, approximated?). Approximations keep shapes, the
# broadcast and the dim kinds (all elementwise forms are identical); only the function differs.
_ELEMENTWISE_UNARY: dict[str, tuple[str, bool]] = {
    "aten.relu.default": ("relu", False),
    "aten.gelu.default": ("gelu", False),
    "aten.silu.default": ("silu", False),
    "aten.tanh.default": ("tanh", False),
    "aten.sigmoid.default": ("sigmoid", False),
    "aten.exp.default": ("exp", False),
    "aten.neg.default": ("neg", False),
    "aten.sqrt.default": ("sqrt", False),
    "aten.rsqrt.default": ("rsqrt", False),
    "aten.abs.default": ("relu", True),  # |x|: piecewise linear like relu
    "aten.log.default": ("exp", True),  # the inverse of exp, same cost class
    "aten.log1p.default": ("exp", True),
    "aten.expm1.default": ("exp", True),
    "aten.sin.default": ("tanh", True),  # bounded smooth functions
    "aten.cos.default": ("tanh", True),
    "aten.erf.default": ("tanh", True),  # erf has tanh's shape
    "aten.sign.default": ("tanh", True),
    "aten.reciprocal.default": ("rsqrt", True),  # a reciprocal-like power
    "aten.hardswish.default": ("silu", True),  # x * gate(x), like silu
    "aten.mish.default": ("silu", True),
    "aten.softplus.default": ("silu", True),
    "aten.hardsigmoid.default": ("sigmoid", True),
    "aten.leaky_relu.default": ("relu", True),
    "aten.elu.default": ("relu", True),
    "aten.floor.default": ("identity", True),  # rounding keeps the value's scale
    "aten.ceil.default": ("identity", True),
    "aten.round.default": ("identity", True),
    "aten.trunc.default": ("identity", True),
    "aten.logical_not.default": ("neg", True),  # boolean negation
    "aten.bitwise_not.default": ("neg", True),
    "aten.isnan.default": ("identity", True),  # predicates: a bool of the same shape
    "aten.isinf.default": ("identity", True),
}
_ELEMENTWISE_BINARY: dict[str, tuple[str, bool]] = {
    **{
        f"aten.{op}.{o}": (op, False)
        for op in ("add", "sub", "mul", "div")
        for o in ("Tensor", "Scalar")
    },
    "aten.maximum.default": ("maximum", False),
    "aten.minimum.default": ("minimum", False),
    # comparisons are the sign of a difference; bool results (1 byte)
    **{
        f"aten.{op}.{o}": ("sub", True)
        for op in ("eq", "ne", "lt", "le", "gt", "ge")
        for o in ("Tensor", "Scalar")
    },
    "aten.logical_and.default": ("mul", True),  # boolean and = product of {0, 1}
    "aten.bitwise_and.Tensor": ("mul", True),
    "aten.bitwise_and.Scalar": ("mul", True),
    "aten.logical_or.default": ("maximum", True),  # boolean or = maximum of {0, 1}
    "aten.bitwise_or.Tensor": ("maximum", True),
    "aten.logical_xor.default": ("sub", True),
    "aten.bitwise_xor.Tensor": ("sub", True),
    "aten.div.Tensor_mode": ("div", True),  # floor/trunc division
    "aten.floor_divide.default": ("div", True),
    "aten.remainder.Tensor": ("div", True),  # x - y * floor(x / y)
    "aten.remainder.Scalar": ("div", True),
    "aten.fmod.Tensor": ("div", True),
    "aten.fmod.Scalar": ("div", True),
    "aten.atan2.default": ("div", True),
}


def aten_table() -> TranslationTable[str, Rule]:
    """The ATen -> catalogue translation table, keyed by `str(OpOverload)`.

    Exact rows translate the function; rows marked approximate (see the comments and the
    `_ELEMENTWISE_*` dicts) keep result shapes and dim kinds and are counted in
    `ImportResult.approximated`.
    """
    t: TranslationTable[str, Rule] = TranslationTable("torch.export importer (ATen)")
    reg = t.register
    for key, (kind, approx) in _ELEMENTWISE_UNARY.items():
        reg(key)(_unary(kind, approx))
    for key, (kind, approx) in _ELEMENTWISE_BINARY.items():
        reg(key)(_binary(kind, approx))
    # values that do not change: no op
    reg(*_ALIASES)(_alias)
    reg(
        "aten._to_copy.default",
        "prims.convert_element_type.default",
        "aten.to.dtype",  # export's IR before decomposition: a cast if the dtype changes
        "aten.to.device",
        "aten.to.dtype_layout",
    )(_to_copy)
    reg("aten.copy.default")(_copy)
    reg("aten.native_dropout.default", "aten.dropout.default")(_dropout)
    # layout: reshape / transpose (exact)
    reg(
        "aten.view.default",
        "aten._unsafe_view.default",
        "aten.reshape.default",
        "aten.squeeze.default",
        "aten.squeeze.dim",
        "aten.squeeze.dims",
        "aten.unsqueeze.default",
        "aten.flatten.using_ints",
        "aten.unflatten.int",
    )(_reshape)
    reg("aten.permute.default")(_permute)
    reg("aten.transpose.int")(_transpose)
    reg("aten.t.default")(_t)
    reg("aten.expand.default")(_expand)  # exact einsum with a ones constant
    # selections: gather-like einsum, indexed axis REDUCE(sum) (approximate: see `_build`)
    reg("aten.slice.Tensor")(_slice)
    reg("aten.narrow.default")(_narrow)
    reg("aten.select.int")(_select)
    reg("aten.split_with_sizes.default")(_split_with_sizes)
    # sizes read off the results (tensor_split, transformers 5's Mamba: its dim is split's)
    reg("aten.split.Tensor", "aten.chunk.default", *_TENSOR_SPLIT)(_split)
    reg("aten.unbind.int")(_unbind)
    reg("aten.index.Tensor")(_index)  # a 2-D table on axis 0 -> embedding
    reg("aten.index_select.default")(_index_select)
    reg("aten.gather.default")(_gather)
    reg("aten.topk.default")(_topk)  # selected axis FROZEN
    reg("aten.constant_pad_nd.default")(_constant_pad)  # one gather per padded axis
    reg("aten.embedding.default")(_embedding)
    reg("aten.cat.default")(_cat)
    reg("aten.stack.default")(_stack)
    # elementwise with structure
    reg("aten.rsub.Scalar", "aten.rsub.Tensor")(_rsub)
    reg("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")(_pow)
    reg(
        "aten.clamp.default",
        "aten.clamp.Tensor",
        "aten.clamp_min.default",
        "aten.clamp_max.default",
        "aten.hardtanh.default",
    )(_clamp)
    reg("aten.where.self", "aten.masked_fill.Scalar", "aten.masked_fill.Tensor")(_select_where)
    # reductions (mean is a sum then a local scale)
    reg("aten.sum.dim_IntList")(_reduce("reduce_sum"))
    reg("aten.sum.default")(_reduce("reduce_sum", None, None))
    reg("aten.mean.dim")(_reduce("reduce_mean"))
    reg("aten.mean.default")(_reduce("reduce_mean", None, None))
    reg("aten.amax.default", "aten.max.dim")(_reduce("reduce_max"))  # max.dim: indices approx.
    reg("aten.amin.default", "aten.min.dim")(_reduce("reduce_max", approx=True))  # min as max
    reg("aten.max.default")(_reduce("reduce_max", None, None))
    reg("aten.argmax.default", "aten.argmin.default")(_reduce("reduce_max", approx=True))
    reg("aten.any.dim", "aten.any.dims", "aten.all.dim")(_reduce("reduce_max", approx=True))
    reg("aten.any.default", "aten.all.default")(_reduce("reduce_max", None, None, approx=True))
    reg("aten.prod.dim_int")(_reduce("reduce_sum", approx=True))  # a product-reduction
    reg("aten.var.correction", "aten.var_mean.correction")(  # mean of squares
        _reduce("reduce_mean", 1, None, approx=True)
    )
    reg("aten.logsumexp.default")(_reduce("reduce_max", approx=True))
    # along one FROZEN axis
    reg("aten._softmax.default", "aten._safe_softmax.default")(_along("softmax"))
    reg("aten.softmax.int")(_along("softmax"))  # export's IR before decomposition
    reg("aten._log_softmax.default")(_along("softmax", approx=True))  # log of a softmax
    reg("aten.cumsum.default", "aten.cumprod.default")(_along("softmax", approx=True))  # scans
    reg("aten.sort.default")(_along("softmax", approx=True))  # values and indices
    # normalization
    reg("aten.native_layer_norm.default")(_layer_norm)
    reg("aten.layer_norm.default")(lambda ctx, node: _layer_norm(ctx, node)[0])  # undecomposed
    reg(
        "aten._native_batch_norm_legit_no_training.default",
        "aten._native_batch_norm_legit.default",
        "aten._native_batch_norm_legit_functional.default",
        "aten.native_batch_norm.default",
    )(_batch_norm)
    reg("aten.native_group_norm.default")(_group_norm)
    # contractions, convolution, pooling
    reg("aten.mm.default")(_mm)  # mm(x, t(W)) -> linear(x, W)
    reg("aten.addmm.default")(_addmm)  # matmul/linear + bias_add
    reg("aten.bmm.default")(_bmm)
    reg("aten.matmul.default")(_matmul_nd)
    reg("aten.linear.default")(_linear)
    reg("aten.baddbmm.default")(_baddbmm)
    reg("aten.convolution.default")(_convolution)
    reg("aten.max_pool2d_with_indices.default", "aten.avg_pool2d.default")(_pool)
    reg("aten._adaptive_avg_pool2d.default")(_adaptive_avg_pool)
    from shardplan.importers._aten_attention import register_attention
    from shardplan.importers._aten_more import register_more

    register_attention(reg)  # fused attention (shardplan/importers/_aten_attention.py)
    register_more(reg)  # as_strided views, scatters, histogram (shardplan/importers/_aten_more.py)
    return t
