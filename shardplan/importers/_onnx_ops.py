"""The ONNX -> catalogue translation table of the ONNX importer: `onnx_table()`.

One row per `(domain, op_type)` (default domain ""); a row is a function `(ctx, node) -> [value per
result]` that emits catalogue ops through the importer's context (`shardplan.importers.onnx`).
Rows raise `UnsupportedOpError` before emitting anything when a case is outside the catalogue.
Approximate rows (see the comments and `_UNARY`/`_BINARY`) keep shapes and dim kinds exact and are
counted in `ImportResult.approximated`; the forms are those of the torch importer (`_build`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shardplan.errors import UnsupportedOpError
from shardplan.importers._build import Lazy, TranslationTable, conv
from shardplan.ir.op import Role

if TYPE_CHECKING:
    from shardplan.importers.onnx import _Context

Key = tuple[str, str]
Rule = Callable[["_Context", Any], list[Any]]


def _axis(axis: int, rank: int) -> int:
    return int(axis) % rank if rank else 0


def _pair(values: Any, default: int) -> tuple[int, int]:
    if not values:
        return default, default
    values = list(values)
    return (int(values[0]), int(values[-1])) if len(values) >= 2 else (int(values[0]),) * 2


def _symmetric_pads(pads: Any, spatial: int) -> tuple[int, ...]:
    """ONNX pads are [begin..., end...]; the catalogue needs begin == end."""
    pads = list(pads or [0] * (2 * spatial))
    begin, end = pads[:spatial], pads[spatial:]
    if begin != end:
        raise UnsupportedOpError(f"asymmetric padding {pads}")
    return tuple(int(p) for p in begin)


# -- views ----------------------------------------------------------------------------------------
def _identity(ctx: _Context, node: Any) -> list[Any]:
    return [ctx.env[node.input[0]]] + [None] * (len(node.output) - 1)


def _reshape(ctx: _Context, node: Any) -> list[Any]:
    """Reshape, Flatten, Squeeze, Unsqueeze: the target is the inferred result shape."""
    x, out = node.input[0], ctx.shape(node.output[0])
    if ctx.shape(x) == out:
        return [ctx.env[x]]
    return [ctx.emit("reshape", [x], node, shape=out)]


def _transpose(ctx: _Context, node: Any) -> list[Any]:
    x = node.input[0]
    rank = ctx.rank(x)
    perm = tuple(int(p) for p in ctx.attr(node, "perm", list(range(rank))[::-1]))
    if perm == tuple(range(rank)):
        return [ctx.env[x]]
    if perm == (1, 0):  # pending: MatMul reads it as a linear weight, others materialize it
        return [Lazy(lambda: ctx.emit("transpose", [x], node, perm=perm), ctx.tensor(x))]
    return [ctx.emit("transpose", [x], node, perm=perm)]


def _expand(ctx: _Context, node: Any) -> list[Any]:
    """Exact: a broadcast is an einsum with a CONSTANT ones tensor."""
    x, out = node.input[0], ctx.shape(node.output[0])
    if ctx.shape(x) == out:
        return [ctx.env[x]]
    return [
        ctx.emitter.broadcast(ctx.tensor(x), out, **ctx.target(node, 0, ""), source=node.op_type)
    ]


def _cast(ctx: _Context, node: Any) -> list[Any]:
    x = node.input[0]
    if ctx.dtype_bytes(x) == ctx.dtype_bytes(node.output[0]):
        return [ctx.env[x]]
    return [ctx.emit("cast", [x], node)]


def _dropout(ctx: _Context, node: Any) -> list[Any]:
    """Inference-mode dropout is the identity (the mask result is not translated)."""
    training = ctx.scalar(node.input[2]) if len(node.input) > 2 and node.input[2] else 0
    if training:
        return [ctx.emit("dropout", [node.input[0]], node), None]
    return [ctx.env[node.input[0]], None]


# -- selections -----------------------------------------------------------------------------------
def _gather(ctx: _Context, node: Any) -> list[Any]:
    """Gather on axis 0 of a 2-D table -> embedding (exact); otherwise the gather-like form."""
    data, indices = node.input[:2]
    axis = _axis(ctx.attr(node, "axis", 0), ctx.rank(data))
    if axis == 0 and ctx.rank(data) == 2:
        return [ctx.emit("embedding", [data, indices], node)]
    return [ctx.gather(node, data, [indices], axis)]


def _gather_elements(ctx: _Context, node: Any) -> list[Any]:
    data, indices = node.input[:2]
    return [
        ctx.emitter.gather_elements(
            ctx.tensor(data),
            ctx.tensor(indices),
            _axis(ctx.attr(node, "axis", 0), ctx.rank(data)),
            **ctx.target(node, 0, ""),
            approx=node.op_type,
            source=node.op_type,
        )
    ]


def _resize_axes(ctx: _Context, node: Any, src: str, out: int = 0, **attrs: Any) -> str:
    """Slice / Pad / one Split result: one gather per axis whose size changes (last is final)."""
    shape, target = list(ctx.shape(src)), ctx.shape(node.output[out])
    changed = [j for j in range(len(shape)) if shape[j] != target[j]]
    value = src
    for n, j in enumerate(changed):
        index = ctx.index_constant(node, (target[j],), f"index{out}_{j}")
        last = n == len(changed) - 1
        value = ctx.gather(
            node, value, [index], j, out=out, part="" if last else f"axis{j}", **attrs
        )
    return value if changed else ctx.env[src]


def _slice(ctx: _Context, node: Any) -> list[Any]:
    return [_resize_axes(ctx, node, node.input[0])]


def _pad(ctx: _Context, node: Any) -> list[Any]:
    mode = ctx.attr(node, "mode", "constant")
    if mode != "constant":
        raise UnsupportedOpError(f"Pad mode {mode!r} (only 'constant' is translated)")
    return [_resize_axes(ctx, node, node.input[0], mode=mode)]


def _split(ctx: _Context, node: Any) -> list[Any]:
    return [
        _resize_axes(ctx, node, node.input[0], out=i) if out else None
        for i, out in enumerate(node.output)
    ]


def _topk(ctx: _Context, node: Any) -> list[Any]:
    """Values and indices: a selection of k along a FROZEN axis (topk needs the whole axis)."""
    x = node.input[0]
    axis = _axis(ctx.attr(node, "axis", -1), ctx.rank(x))
    k = ctx.shape(node.output[0])[axis]
    index = ctx.index_constant(node, (k,), "index")
    return [
        ctx.gather(node, x, [index], axis, out=i, frozen=True) if out else None
        for i, out in enumerate(node.output)
    ]


def _concat(ctx: _Context, node: Any) -> list[Any]:
    inputs = [i for i in node.input if i]
    if len(inputs) == 1:
        return [ctx.env[inputs[0]]]
    axis = _axis(ctx.attr(node, "axis", 0), ctx.rank(node.output[0]))
    return [ctx.emit("concat", inputs, node, axis=axis)]


# -- elementwise ----------------------------------------------------------------------------------
def _unary(kind: str, approx: bool = False) -> Rule:
    def rule(ctx: _Context, node: Any) -> list[Any]:
        attrs = {
            a.name: ctx.attr(node, a.name)
            for a in node.attribute
            if isinstance(ctx.attr(node, a.name), (int, float, str))
        }
        return [ctx.emit(kind, [node.input[0]], node, approx=approx, **attrs)]

    return rule


def _binary(kind: str, approx: bool = False) -> Rule:
    """Broadcast binary (variadic for Max/Min/Sum/Mean); Add of a 1-D parameter along the last
    dim is a bias_add; a product or quotient by a one-element constant is a scale (exact)."""

    def rule(ctx: _Context, node: Any) -> list[Any]:
        inputs = [i for i in node.input if i]
        out = ctx.shape(node.output[0])
        if not approx and len(inputs) == 2:
            a, b = inputs
            if kind == "add":
                for x, bias in ((a, b), (b, a)):
                    if (
                        ctx.role(bias) is Role.PARAMETER
                        and ctx.shape(x) == out
                        and ctx.shape(bias) == (out[-1],)
                    ):
                        return [ctx.emit("bias_add", [x, bias], node, axis=-1)]
            if kind in ("mul", "div"):
                for x, c in ((a, b), (b, a)) if kind == "mul" else ((a, b),):
                    value = ctx.scalar(c)
                    if value is not None and value != 0 and ctx.shape(x) == out:
                        return [
                            ctx.emit(
                                "scale", [x], node, value=value if kind == "mul" else 1 / value
                            )
                        ]
        return [ctx.emit(kind, inputs, node, approx=approx)]

    return rule


def _pow(ctx: _Context, node: Any) -> list[Any]:
    x, p = node.input[:2]
    exponent = ctx.scalar(p)
    same = ctx.shape(x) == ctx.shape(node.output[0])
    if same and exponent == 2:
        return [ctx.emit("mul", [x, x], node)]
    if same and exponent in (0.5, -0.5):
        return [ctx.emit("sqrt" if exponent == 0.5 else "rsqrt", [x], node)]
    if same and exponent == 1:
        return [ctx.env[x]]
    return [ctx.emit("exp", [x], node, approx=True, exponent=exponent)]  # x**p ~ exp(p log x)


def _clip(ctx: _Context, node: Any) -> list[Any]:
    """Clip(x, lo, hi) = minimum(maximum(x, lo), hi): constant bounds as attributes (exact)."""
    x = node.input[0]
    bounds = list(node.input[1:3]) + [""] * (3 - len(node.input))
    lo_name, hi_name = bounds[0], bounds[1]
    lo = ctx.scalar(lo_name) if lo_name else ctx.attr(node, "min")
    hi = ctx.scalar(hi_name) if hi_name else ctx.attr(node, "max")
    value = x
    for kind, bound, name, last in (
        ("maximum", lo, lo_name, hi is None and not hi_name),
        ("minimum", hi, hi_name, True),
    ):
        part = "" if last else "lower"
        if bound is not None:
            value = ctx.emit(kind, [value], node, part=part, scalar=bound)
        elif name:
            value = ctx.emit(kind, [value, name], node, part=part)
    return [ctx.env[x] if value is x else value]


def _where(ctx: _Context, node: Any) -> list[Any]:
    """Where(c, a, b): a broadcast select -> `maximum` of the three operands."""
    return [ctx.emit("maximum", list(node.input), node, approx=True)]


# -- reductions and ops along one axis ------------------------------------------------------------
def _reduce(kind: str, approx: bool = False) -> Rule:
    def rule(ctx: _Context, node: Any) -> list[Any]:
        x = node.input[0]
        rank = ctx.rank(x)
        axes = ctx.attr(node, "axes")
        if axes is None and len(node.input) > 1 and node.input[1]:
            value = ctx.value(node.input[1])
            if value is None:
                raise UnsupportedOpError("reduction axes computed at run time")
            axes = value.reshape(-1).tolist()
        if axes is None or len(axes) == 0:
            if ctx.attr(node, "noop_with_empty_axes", 0):
                return [ctx.env[x]]
            axes = None
        else:
            axes = tuple(sorted(_axis(a, rank) for a in axes))
        keep = bool(ctx.attr(node, "keepdims", 1))
        return [ctx.emit(kind, [x], node, approx=approx, axes=axes, keepdims=keep)]

    return rule


def _arg_reduce(ctx: _Context, node: Any) -> list[Any]:
    x = node.input[0]
    axis = _axis(ctx.attr(node, "axis", 0), ctx.rank(x))
    return [
        ctx.emit(
            "reduce_max",
            [x],
            node,
            approx=True,
            axes=(axis,),
            keepdims=bool(ctx.attr(node, "keepdims", 1)),
        )
    ]


def _softmax(approx: bool = False) -> Rule:
    def rule(ctx: _Context, node: Any) -> list[Any]:
        x = node.input[0]
        rank = ctx.rank(x)
        default = -1 if ctx.opset[""] >= 13 else 1
        axis = _axis(ctx.attr(node, "axis", default), rank)
        if ctx.opset[""] < 13 and axis != rank - 1:  # old softmax flattens from `axis` on
            raise UnsupportedOpError(f"opset {ctx.opset['']} Softmax over axes {axis}..")
        return [ctx.emit("softmax", [x], node, approx=approx, axis=axis)]

    return rule


def _cumsum(ctx: _Context, node: Any) -> list[Any]:
    """A scan along a FROZEN axis: softmax's form."""
    x, axis_name = node.input[:2]
    value = ctx.value(axis_name)
    if value is None:
        raise UnsupportedOpError("CumSum axis computed at run time")
    axis = _axis(int(value.reshape(-1)[0]), ctx.rank(x))
    return [ctx.emit("softmax", [x], node, approx=True, axis=axis)]


# -- normalization --------------------------------------------------------------------------------
def _layer_norm(kind: str) -> Rule:
    def rule(ctx: _Context, node: Any) -> list[Any]:
        x = node.input[0]
        rank = ctx.rank(x)
        if _axis(ctx.attr(node, "axis", -1), rank) != rank - 1:
            raise UnsupportedOpError("normalization over more than the last axis")
        inputs = [i for i in node.input if i]
        out = ctx.emit(kind, inputs, node, eps=ctx.attr(node, "epsilon", 1e-5))
        return [out] + [None] * (len(node.output) - 1)

    return rule


def _batch_norm(approx: bool = False) -> Rule:
    """BatchNormalization (statistics dropped); Instance/Group norm approximated by its form."""

    def rule(ctx: _Context, node: Any) -> list[Any]:
        x, scale, bias = node.input[:3]
        channels = ctx.shape(x)[1]
        if ctx.shape(scale) != (channels,) or ctx.shape(bias) != (channels,):
            raise UnsupportedOpError(
                f"normalization parameters {ctx.shape(scale)} are not per channel ({channels},)"
            )
        out = ctx.emit(
            "batch_norm", [x, scale, bias], node, approx=approx, eps=ctx.attr(node, "epsilon", 1e-5)
        )
        return [out] + [None] * (len(node.output) - 1)

    return rule


# -- contractions, convolution, pooling -----------------------------------------------------------
def _matmul(ctx: _Context, node: Any) -> list[Any]:
    """2-D right operand -> matmul (linear if it is a pending transpose); batched -> bmm."""
    a, b = node.input[:2]
    ra, rb = ctx.rank(a), ctx.rank(b)
    pending = ctx.env.get(b)
    if rb == 2 and ra >= 1:
        if isinstance(pending, Lazy) and pending.transpose_of is not None:
            return [
                ctx.emitter.op(
                    "linear",
                    [ctx.tensor(a), pending.transpose_of],
                    **ctx.target(node, 0, ""),
                    source=node.op_type,
                )
            ]
        return [ctx.emit("matmul", [a, b], node)]
    if ra < 2 or rb < 2:
        raise UnsupportedOpError(f"MatMul of ranks {ra} and {rb} (a vector operand)")
    out = ctx.shape(node.output[0])
    batch = out[:-2]
    operands = []
    for name, tag in ((a, "a"), (b, "b")):
        shape = ctx.shape(name)
        want = batch + shape[-2:]
        operands.append(
            ctx.tensor(name)
            if shape == want
            else ctx.emitter.broadcast(
                ctx.tensor(name),
                want,
                **ctx.target(node, 0, f"broadcast_{tag}"),
                source=node.op_type,
            )
        )
    return [ctx.emitter.op("bmm", operands, **ctx.target(node, 0, ""), source=node.op_type)]


def _gemm(ctx: _Context, node: Any) -> list[Any]:
    """Y = alpha * A' B' + beta * C: transB -> linear on the stored [n, k] weight."""
    a, b = node.input[:2]
    c = node.input[2] if len(node.input) > 2 and node.input[2] else None
    if ctx.attr(node, "transA", 0):
        a = ctx.emit("transpose", [a], node, part="transA", perm=(1, 0))
    kind = "linear" if ctx.attr(node, "transB", 0) else "matmul"
    attrs = {k: v for k in ("alpha", "beta") if (v := ctx.attr(node, k, 1.0)) != 1.0}
    if c is None:
        return [ctx.emit(kind, [a, b], node, **attrs)]
    y = ctx.emit(kind, [a, b], node, part="mm")
    n = ctx.shape(node.output[0])[-1]
    if ctx.shape(c) == (n,):
        return [ctx.emit("bias_add", [y, c], node, axis=-1, **attrs)]
    return [ctx.emit("add", [y, c], node, **attrs)]


def _conv(ctx: _Context, node: Any) -> list[Any]:
    """Conv (any `group`) -> conv2d (+ bias_add on axis 1); 1-D as a height-1 conv2d (exact)."""
    x, w = node.input[:2]
    bias = node.input[2] if len(node.input) > 2 and node.input[2] else None
    rank = ctx.rank(x)
    if rank not in (3, 4):
        raise UnsupportedOpError(f"{rank - 2}-D convolution; the catalogue has conv2d only")
    spatial = rank - 2
    group = int(ctx.attr(node, "group", 1))
    if any(d != 1 for d in ctx.attr(node, "dilations", [1] * spatial)):
        raise UnsupportedOpError("dilated convolution")
    if ctx.attr(node, "auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise UnsupportedOpError(f"auto_pad={ctx.attr(node, 'auto_pad')!r}")
    pads = _symmetric_pads(ctx.attr(node, "pads"), spatial)
    strides = list(ctx.attr(node, "strides", [1] * spatial))
    return [conv(ctx, node, x, w, bias, _pair(strides, 1), _pair(pads, 0), group)]


def _pool(ctx: _Context, node: Any) -> list[Any]:
    """MaxPool / AveragePool over [n, c, h, w] -> pool2d (floor mode, symmetric pads)."""
    x = node.input[0]
    shape = ctx.shape(x)
    if len(shape) != 4:
        raise UnsupportedOpError(f"pooling of a rank-{len(shape)} input (need [n, c, h, w])")
    if any(d != 1 for d in ctx.attr(node, "dilations", [1, 1])):
        raise UnsupportedOpError("dilated pooling")
    if ctx.attr(node, "auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        raise UnsupportedOpError(f"auto_pad={ctx.attr(node, 'auto_pad')!r}")
    kernel = _pair(ctx.attr(node, "kernel_shape"), 1)
    stride = _pair(ctx.attr(node, "strides"), 1)
    padding = _pair(_symmetric_pads(ctx.attr(node, "pads"), 2), 0)
    out = ctx.shape(node.output[0])
    floor = tuple((shape[2 + j] + 2 * padding[j] - kernel[j]) // stride[j] + 1 for j in (0, 1))
    if floor != out[2:]:
        raise UnsupportedOpError(f"ceil-mode pooling (output {out[2:]}, floor mode gives {floor})")
    mode = "max" if node.op_type == "MaxPool" else "avg"
    return [
        ctx.emit("pool2d", [x], node, kernel=kernel, stride=stride, padding=padding, mode=mode),
        None,
    ]


def _global_pool(kind: str) -> Rule:
    def rule(ctx: _Context, node: Any) -> list[Any]:
        x = node.input[0]
        axes = tuple(range(2, ctx.rank(x)))
        return [ctx.emit(kind, [x], node, axes=axes, keepdims=True)]

    return rule


def _einsum(ctx: _Context, node: Any) -> list[Any]:
    """Einsum with an explicit result and no ellipsis -> the catalogue einsum (exact)."""
    equation = str(ctx.attr(node, "equation")).replace(" ", "")
    if "->" not in equation or "." in equation:
        raise UnsupportedOpError(f"einsum {equation!r} (needs '->' and no ellipsis)")
    lhs, rhs = equation.split("->")
    terms = lhs.split(",")
    if any(len(set(t)) != len(t) for t in terms):
        raise UnsupportedOpError(f"einsum {equation!r} repeats an index within an operand")
    spec = ", ".join(" ".join(t) for t in terms) + " -> " + " ".join(rhs)
    return [ctx.emit("einsum", list(node.input), node, spec=spec)]


# -- the table ------------------------------------------------------------------------------------
# ONNX op -> (catalogue kind, approximated?); approximations keep shapes and the broadcast.
_UNARY: dict[str, tuple[str, bool]] = {
    "Relu": ("relu", False),
    "Gelu": ("gelu", False),
    "Tanh": ("tanh", False),
    "Sigmoid": ("sigmoid", False),
    "Exp": ("exp", False),
    "Neg": ("neg", False),
    "Sqrt": ("sqrt", False),
    "Erf": ("tanh", True),  # erf has tanh's shape (GELU before opset 20)
    "Reciprocal": ("rsqrt", True),  # a reciprocal-like power
    "Log": ("exp", True),  # the inverse of exp, same cost class
    "Abs": ("relu", True),  # piecewise linear like relu
    "Softplus": ("silu", True),
    "Mish": ("silu", True),
    "HardSwish": ("silu", True),
    "LeakyRelu": ("relu", True),
    "Elu": ("relu", True),
    "Selu": ("relu", True),
    "HardSigmoid": ("sigmoid", True),
    "Sin": ("tanh", True),
    "Cos": ("tanh", True),  # bounded smooth functions
    "Floor": ("identity", True),
    "Ceil": ("identity", True),
    "Round": ("identity", True),
    "Sign": ("tanh", True),
    "Not": ("neg", True),  # boolean negation
    "IsNaN": ("identity", True),
    "IsInf": ("identity", True),  # predicates, same shape
}
_BINARY: dict[str, tuple[str, bool]] = {
    "Add": ("add", False),
    "Sub": ("sub", False),
    "Mul": ("mul", False),
    "Div": ("div", False),
    "Max": ("maximum", False),
    "Min": ("minimum", False),
    "Sum": ("add", False),  # variadic sum
    "Mean": ("add", True),  # variadic mean = sum then scale
    "Equal": ("sub", True),
    "Less": ("sub", True),
    "LessOrEqual": ("sub", True),  # sign of a
    "Greater": ("sub", True),
    "GreaterOrEqual": ("sub", True),  # difference
    "And": ("mul", True),  # boolean and = product of {0, 1}
    "Or": ("maximum", True),  # boolean or = maximum of {0, 1}
    "Xor": ("sub", True),
    "Mod": ("div", True),  # x - y * floor(x / y)
}


def onnx_table() -> TranslationTable[Key, Rule]:
    """The ONNX -> catalogue translation table, keyed by `(domain, op_type)`."""
    t: TranslationTable[Key, Rule] = TranslationTable("ONNX importer")

    def reg(*op_types: str) -> Callable[[Rule], Rule]:
        return t.register(*[("", op) for op in op_types])

    for op, (kind, approx) in _UNARY.items():
        reg(op)(_unary(kind, approx))
    for op, (kind, approx) in _BINARY.items():
        reg(op)(_binary(kind, approx))
    reg("Identity")(_identity)
    reg("Cast", "CastLike")(_cast)
    reg("Dropout")(_dropout)
    reg("Reshape", "Flatten", "Squeeze", "Unsqueeze")(_reshape)  # exact
    reg("Transpose")(_transpose)
    reg("Expand")(_expand)  # exact, ones constant
    reg("Gather")(_gather)  # 2-D table on axis 0 -> embedding (exact)
    reg("GatherElements")(_gather_elements)  # gather-like einsum (approximate)
    reg("Slice")(_slice)  # one gather-like einsum per sliced axis
    reg("Split")(_split)
    reg("Pad")(_pad)
    reg("TopK")(_topk)  # selected axis FROZEN
    reg("Concat")(_concat)
    reg("Pow")(_pow)
    reg("Clip")(_clip)
    reg("Where")(_where)
    reg("ReduceMean")(_reduce("reduce_mean"))
    reg("ReduceSum")(_reduce("reduce_sum"))
    reg("ReduceMax")(_reduce("reduce_max"))
    reg("ReduceMin")(_reduce("reduce_max", approx=True))  # min as max
    reg("ReduceProd", "ReduceL1", "ReduceL2", "ReduceSumSquare")(_reduce("reduce_sum", approx=True))
    reg("ReduceLogSumExp")(_reduce("reduce_max", approx=True))
    reg("ArgMax", "ArgMin")(_arg_reduce)  # approximate
    reg("Softmax")(_softmax())
    reg("LogSoftmax")(_softmax(approx=True))
    reg("CumSum")(_cumsum)
    reg("LayerNormalization")(_layer_norm("layer_norm"))
    reg("RMSNormalization")(_layer_norm("rms_norm"))
    reg("BatchNormalization")(_batch_norm())
    reg("InstanceNormalization")(_batch_norm(approx=True))
    reg("MatMul")(_matmul)
    reg("Gemm")(_gemm)
    reg("Conv")(_conv)
    reg("MaxPool", "AveragePool")(_pool)
    reg("GlobalAveragePool")(_global_pool("reduce_mean"))
    reg("GlobalMaxPool")(_global_pool("reduce_max"))
    reg("Einsum")(_einsum)
    return t
