"""The translation table of `shardplan.importers.jaxpr`: `RULES` (JAX primitive name ->
rule), the primitive lists it is built from (`EXACT_ELEMENTWISE`, `APPROX_ELEMENTWISE`,
`PASS_THROUGH`, `INLINE`), the per-primitive rules, and the small jaxpr helpers the
translator shares (`opaque_signature`, static shapes, sub-jaxprs, dropped variables).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from shardplan.errors import ShapeError
from shardplan.ir.dims import DimKind, LoopDim
from shardplan.ir.signature import Signature

if TYPE_CHECKING:
    from shardplan.importers.jaxpr import _Translator


# -- the translation table -----------------------------------------------------------------------

Rule = Callable[["_Translator", Any, list[str]], list[str]]
RULES: dict[str, Rule] = {}


def _rule(*names: str) -> Callable[[Rule], Rule]:
    def add(fn: Rule) -> Rule:
        for n in names:
            if n in RULES:
                raise ValueError(f"jaxpr rule for primitive {n!r} is registered twice")
            RULES[n] = fn
        return fn

    return add


EXACT_ELEMENTWISE = {
    "add": "add",
    "add_any": "add",
    "sub": "sub",
    "mul": "mul",
    "div": "div",
    "max": "maximum",
    "min": "minimum",
    "tanh": "tanh",
    "exp": "exp",
    "logistic": "sigmoid",
    "neg": "neg",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "convert_element_type": "cast",
}
APPROX_ELEMENTWISE = (
    "abs", "acos", "acosh", "and", "asin", "asinh", "atan", "atan2", "atanh", "cbrt", "ceil",
    "clamp", "cos", "cosh", "eq", "erf", "erf_inv", "erfc", "exp2", "expm1", "floor", "ge", "gt",
    "imag", "is_finite", "le", "lgamma", "digamma", "log", "log1p", "lt", "ne", "nextafter", "not",
    "or", "pow", "real", "rem", "round", "select_n", "shift_left", "shift_right_arithmetic",
    "shift_right_logical", "sign", "sin", "sinh", "square", "tan", "xor", "population_count",
    "integer_pow",
)  # fmt: skip
PASS_THROUGH = (
    "sharding_constraint", "stop_gradient", "copy", "copy_p", "optimization_barrier",
    "reduce_precision", "pvary", "name", "mesh_cast", "reshard",
)  # fmt: skip
INLINE = (
    "jit", "pjit", "closed_call", "core_call", "custom_jvp_call", "custom_vjp_call",
    "custom_vjp_call_jaxpr", "remat", "remat2", "checkpoint",
)  # fmt: skip
"""Primitives whose sub-jaxpr is translated in place."""


@_rule(*EXACT_ELEMENTWISE)
def _exact_elementwise(t: _Translator, eqn: Any, ins: list[str]) -> list[str]:
    return [t.emit(EXACT_ELEMENTWISE[eqn.primitive.name], ins, eqn.outvars[0])]


@_rule(*APPROX_ELEMENTWISE)
def _approx_elementwise(t: _Translator, eqn: Any, ins: list[str]) -> list[str]:
    name = eqn.primitive.name
    if name == "square" or (name == "integer_pow" and eqn.params.get("y") == 2):
        return [t.emit("mul", [ins[0], ins[0]], eqn.outvars[0])]
    kind = "identity" if len(ins) == 1 else "add"
    return [t.emit(kind, ins, eqn.outvars[0], approx=name, primitive=name)]


@_rule(*PASS_THROUGH)
def _pass_through(t: _Translator, eqn: Any, ins: list[str]) -> list[str]:
    return list(ins[: len(eqn.outvars)])


@_rule("dot_general")
def _dot_general(t: _Translator, eqn: Any, ins: list[str]) -> list[str]:
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lc, rc, lb, rb = (tuple(int(d) for d in x) for x in (lc, rc, lb, rb))
    a, b = (t.shape(x) for x in ins)
    out = eqn.outvars[0]
    if not lb and not rb and lc == (len(a) - 1,) and len(b) == 2 and len(a) >= 1:
        if rc == (1,):
            return [t.emit("linear", ins, out)]
        if rc == (0,):
            return [t.emit("matmul", ins, out)]
    nb = len(lb)
    if (
        nb >= 1
        and lb == rb == tuple(range(nb))
        and len(a) == len(b) == nb + 2
        and lc == (nb + 1,)
        and rc in ((nb,), (nb + 1,))
    ):
        return [t.emit("bmm", ins, out, transpose_b=rc == (nb + 1,))]
    left = [f"l{i}" for i in range(len(a))]
    right = [f"r{i}" for i in range(len(b))]
    for k, (i, j) in enumerate(zip(lc, rc, strict=True)):
        left[i] = right[j] = f"c{k}"
    for k, (i, j) in enumerate(zip(lb, rb, strict=True)):
        left[i] = right[j] = f"b{k}"
    result = (
        [left[i] for i in lb]
        + [n for i, n in enumerate(left) if i not in lc and i not in lb]
        + [n for j, n in enumerate(right) if j not in rc and j not in rb]
    )
    spec = f"{' '.join(left)}, {' '.join(right)} -> {' '.join(result)}"
    return [t.emit("einsum", ins, out, spec=spec)]


@_rule("conv_general_dilated")
def _conv(t: _Translator, eqn: Any, ins: list[str]) -> list[str]:
    p = eqn.params
    dn = p["dimension_numbers"]
    strides = tuple(int(s) for s in p["window_strides"])
    padding = tuple((int(lo), int(hi)) for lo, hi in p["padding"])
    problem = None
    if len(strides) != 2:
        problem = f"{len(strides)} spatial dims (only 2-D)"
    elif any(int(d) != 1 for d in (*p["lhs_dilation"], *p["rhs_dilation"])):
        problem = "dilation"
    elif int(p["feature_group_count"]) != 1 or int(p["batch_group_count"]) != 1:
        problem = "grouped convolution"
    elif any(lo != hi for lo, hi in padding):
        problem = f"asymmetric padding {padding}"
    if problem:
        return t.unsupported(eqn, ins, f"conv_general_dilated with {problem}")
    lhs_spec, rhs_spec, out_spec = (tuple(int(d) for d in s) for s in dn)
    x, w = ins
    if lhs_spec != (0, 1, 2, 3):
        x = t.emit("transpose", [x], None, perm=lhs_spec)
    if rhs_spec != (0, 1, 2, 3):
        w = t.emit("transpose", [w], None, perm=rhs_spec)
    attrs = {"stride": strides, "padding": tuple(lo for lo, _ in padding)}
    if out_spec == (0, 1, 2, 3):
        return [t.emit("conv2d", [x, w], eqn.outvars[0], **attrs)]
    y = t.emit("conv2d", [x, w], None, **attrs)
    perm = [0] * 4
    for i, d in enumerate(out_spec):
        perm[d] = i
    return [t.emit("transpose", [y], eqn.outvars[0], perm=tuple(perm))]


@_rule("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
       "argmax", "argmin")  # fmt: skip
def _reduce(t: _Translator, eqn: Any, ins: list[str]) -> list[str]:
    name = eqn.primitive.name
    axes = tuple(int(a) for a in eqn.params["axes"])
    if name in ("reduce_sum", "reduce_max"):
        return [t.emit(name, ins[:1], eqn.outvars[0], axes=axes)]
    kind = "reduce_max" if name in ("reduce_min", "argmax", "argmin") else "reduce_sum"
    return [t.emit(kind, ins[:1], eqn.outvars[0], axes=axes, approx=name, primitive=name)]


@_rule("reshape", "squeeze", "expand_dims")
def _reshape(t: _Translator, eqn: Any, ins: list[str]) -> list[str]:
    if eqn.params.get("dimensions") not in (None, ()) and eqn.primitive.name == "reshape":
        return t.unsupported(eqn, ins, "reshape with a `dimensions` permutation")
    shape = tuple(int(s) for s in eqn.outvars[0].aval.shape)
    return [t.emit("reshape", ins[:1], eqn.outvars[0], shape=shape)]


@_rule("transpose")
def _transpose(t: _Translator, eqn: Any, ins: list[str]) -> list[str]:
    perm = tuple(int(p) for p in eqn.params["permutation"])
    return [t.emit("transpose", ins, eqn.outvars[0], perm=perm)]


@_rule("broadcast_in_dim")
def _broadcast(t: _Translator, eqn: Any, ins: list[str]) -> list[str]:
    x = ins[0]
    src = t.shape(x)
    out = tuple(int(s) for s in eqn.outvars[0].aval.shape)
    dims = tuple(int(d) for d in eqn.params["broadcast_dimensions"])
    placed = [1] * len(out)
    for s, d in zip(src, dims, strict=True):
        placed[d] = s
    if tuple(placed) == out:  # only size-1 dims inserted: a reshape
        if src == out:
            return [x]
        return [t.emit("reshape", [x], eqn.outvars[0], shape=out)]
    trailing = dims == tuple(range(len(out) - len(src), len(out)))
    if not trailing and src:
        x = t.emit("reshape", [x], None, shape=tuple(placed))
    zeros_shape = tuple(o if p != o else 1 for p, o in zip(placed, out, strict=True))
    zeros = t.constant(zeros_shape, t.dtype_bytes(eqn.outvars[0]), "zeros")
    return [t.emit("add", [x, zeros], eqn.outvars[0], broadcast=True)]


@_rule("concatenate")
def _concat(t: _Translator, eqn: Any, ins: list[str]) -> list[str]:
    return [t.emit("concat", ins, eqn.outvars[0], axis=int(eqn.params["dimension"]))]


@_rule("gather")
def _gather(t: _Translator, eqn: Any, ins: list[str]) -> list[str]:
    table, ids = ins
    ts, ix = t.shape(table), t.shape(ids)
    dn = eqn.params["dimension_numbers"]
    lookup = (
        len(ts) == 2
        and len(ix) >= 2
        and ix[-1] == 1
        and tuple(dn.offset_dims) == (len(ix) - 1,)
        and tuple(dn.collapsed_slice_dims) == (0,)
        and tuple(dn.start_index_map) == (0,)
        and not tuple(getattr(dn, "operand_batching_dims", ()))
        and tuple(int(s) for s in eqn.params["slice_sizes"]) == (1, ts[1])
    )
    if not lookup:
        return t.unsupported(eqn, ins, "gather other than an embedding lookup table[ids]")
    flat = t.emit("reshape", [ids], None, shape=ix[:-1])
    return [t.emit("embedding", [table, flat], eqn.outvars[0])]


# -- jaxpr helpers ---------------------------------------------------------------------------------


def is_dropped(var: Any) -> bool:
    return type(var).__name__ == "DropVar"


def sub_jaxpr(eqn: Any) -> tuple[Any, Sequence[Any]] | None:
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        sub = eqn.params.get(key)
        if sub is None or callable(sub) and not hasattr(sub, "eqns") and not hasattr(sub, "jaxpr"):
            continue
        if hasattr(sub, "jaxpr") and hasattr(sub, "consts"):  # ClosedJaxpr
            return sub.jaxpr, list(sub.consts)
        if hasattr(sub, "eqns"):  # an open Jaxpr
            return sub, []
    return None


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _static_shape(shape: Sequence[Any], name: str) -> tuple[int, ...]:
    try:
        out = tuple(int(s) for s in shape)
    except (TypeError, ValueError) as e:
        raise ShapeError(
            f"tensor {name!r} has a symbolic shape {tuple(shape)}; trace with "
            "concrete example arguments"
        ) from e
    if any(s < 1 for s in out):
        raise ShapeError(f"tensor {name!r} has shape {out}; zero-size tensors cannot be planned")
    return out


def opaque_signature(
    in_shapes: Sequence[Sequence[int]], out_shapes: Sequence[Sequence[int]]
) -> Signature:
    """Every loop dim FROZEN: one per result dim and one per operand dim (never cut)."""
    dims: list[LoopDim] = []
    groups: list[tuple[tuple[str, ...], ...]] = []
    for prefix, shapes in (("o", out_shapes), ("i", in_shapes)):
        for k, shape in enumerate(shapes):
            names = [f"{prefix}{k}_{j}" for j in range(len(shape))]
            dims += [LoopDim(n, int(e), DimKind.FROZEN) for n, e in zip(names, shape, strict=True)]
            groups.append(tuple((n,) for n in names))
    n_out = len(out_shapes)
    return Signature(tuple(dims), tuple(groups[n_out:]), tuple(groups[:n_out]))
