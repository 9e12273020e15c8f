"""The operator catalogue: the one place that maps an op kind to its einsum-like signature.

Each entry is a pure function `(input_shapes, attrs) -> OpForm` that names the loop dims, their
extents and kinds, the tensor-dim groups of every operand and result, the result shapes and the
FLOPs. Everything downstream (cost model, search, engines' sharding) reads only the signature;
only executors (JAX, torch) look at `kind` to pick a kernel. Building a form is O(rank).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from numbers import Integral
from types import MappingProxyType
from typing import Any

from shardplan.errors import ShapeError, UnsupportedOpError
from shardplan.ir.catalogue_attention import ATTENTION_RULES
from shardplan.ir.catalogue_moe import MOE_RULES
from shardplan.ir.dims import DimKind, LoopDim, Reducer
from shardplan.ir.signature import Group, Signature, TensorDims

Shape = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class OpForm:
    """What the catalogue derives for one op instance."""

    signature: Signature
    output_shapes: tuple[Shape, ...]
    flops: float


Rule = Callable[[Sequence[Shape], Mapping[str, Any]], OpForm]


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _names(prefix: str, count: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(count)]


def _form(dims: list[LoopDim], ins: list[TensorDims], outs: list[TensorDims], shapes, flops):
    return OpForm(Signature(tuple(dims), tuple(ins), tuple(outs)), tuple(shapes), float(flops))


def _single(names: Sequence[str]) -> TensorDims:
    return tuple((n,) for n in names)


def _need(kind: str, shapes: Sequence[Shape], counts: tuple[int, ...]) -> None:
    if len(shapes) not in counts:
        raise ShapeError(f"{kind} takes {' or '.join(map(str, counts))} inputs, got {len(shapes)}")


def _ints(value: Any, what: str) -> tuple[int, ...]:
    """A sequence of whole numbers (an attribute such as `perm`, `axes` or a target shape)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise ShapeError(f"{what} must be a tuple of whole numbers, got {value!r}")
    if not all(isinstance(v, Integral) and not isinstance(v, bool) for v in value):
        raise ShapeError(f"{what} must be a tuple of whole numbers, got {value!r}")
    return tuple(int(v) for v in value)


def _axis(axis: int, rank: int, kind: str) -> int:
    if isinstance(axis, bool) or not isinstance(axis, Integral):
        raise ShapeError(f"{kind}: axis must be a whole number, got {axis!r}")
    axis = int(axis)
    if not -rank <= axis < rank:
        raise ShapeError(f"{kind}: axis {axis} is out of range for rank {rank}")
    return axis % rank


def elementwise(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> OpForm:
    """`d0 d1 ..., d0 d1 ... -> d0 d1 ...` with numpy broadcasting (size-1 dims map to `()`)."""
    if not shapes:
        raise ShapeError("elementwise ops need at least one input")
    rank = max(len(s) for s in shapes)
    out: list[int] = [1] * rank
    for shape in shapes:
        for i, size in enumerate(shape):
            j = rank - len(shape) + i
            if size != 1 and out[j] not in (1, size):
                raise ShapeError(f"shapes {list(shapes)} do not broadcast at dim {j}")
            out[j] = max(out[j], size)
    names = _names("d", rank)
    ins: list[TensorDims] = []
    for shape in shapes:
        offset = rank - len(shape)
        ins.append(
            tuple(
                (names[offset + i],) if size == out[offset + i] else ()
                for i, size in enumerate(shape)
            )
        )
    dims = [LoopDim(n, e) for n, e in zip(names, out, strict=True)]
    return _form(dims, ins, [_single(names)], [tuple(out)], _numel(out))


def bias_add(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> OpForm:
    """`d0 .. dk .., dk -> d0 .. dk ..`: a 1-D bias added along `axis` (default last)."""
    _need("bias_add", shapes, (2,))
    x, bias = shapes
    axis = _axis(attrs.get("axis", -1), len(x), "bias_add")
    if bias != (x[axis],):
        raise ShapeError(f"bias_add: bias shape {bias} must be ({x[axis]},) for axis {axis}")
    names = _names("d", len(x))
    dims = [LoopDim(n, e) for n, e in zip(names, x, strict=True)]
    return _form(dims, [_single(names), ((names[axis],),)], [_single(names)], [x], _numel(x))


def softmax(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> OpForm:
    """`d0 .. dn -> d0 .. dn` with the softmax axis FROZEN."""
    _need("softmax", shapes, (1,))
    (x,) = shapes
    axis = _axis(attrs.get("axis", -1), len(x), "softmax")
    names = _names("d", len(x))
    dims = [
        LoopDim(n, e, DimKind.FROZEN if i == axis else DimKind.PARALLEL)
        for i, (n, e) in enumerate(zip(names, x, strict=True))
    ]
    return _form(dims, [_single(names)], [_single(names)], [x], 5 * _numel(x))


def norm_last(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> OpForm:
    """Layer/RMS norm over the last axis (FROZEN): `d0 .. h, h[, h] -> d0 .. h`."""
    _need("norm", shapes, (1, 2, 3))
    x = shapes[0]
    names = _names("d", len(x))
    for p in shapes[1:]:
        if p != (x[-1],):
            raise ShapeError(f"norm: parameter shape {p} must be ({x[-1]},)")
    dims = [
        LoopDim(n, e, DimKind.FROZEN if i == len(x) - 1 else DimKind.PARALLEL)
        for i, (n, e) in enumerate(zip(names, x, strict=True))
    ]
    ins = [_single(names)] + [((names[-1],),)] * (len(shapes) - 1)
    return _form(dims, ins, [_single(names)], [x], 8 * _numel(x))


def batch_norm(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> OpForm:
    """`n c y x, c, c -> n c y x`: statistics over n, y, x (their tiny all-reduce unmodelled)."""
    _need("batch_norm", shapes, (3,))
    x = shapes[0]
    if len(x) < 2:
        raise ShapeError(f"batch_norm: input {x} needs rank >= 2 ([n, c, ...])")
    if shapes[1] != (x[1],) or shapes[2] != (x[1],):
        raise ShapeError(f"batch_norm: input {x} with scale/shift {shapes[1:]} (need ({x[1]},))")
    names = _names("d", len(x))
    dims = [LoopDim(n, e) for n, e in zip(names, x, strict=True)]
    ins = [_single(names), ((names[1],),), ((names[1],),)]
    return _form(dims, ins, [_single(names)], [x], 8 * _numel(x))


def _matmul_core(kind: str, a: Shape, b: Shape, transpose_b: bool, batch_b: bool) -> OpForm:
    if len(a) < 1 or len(b) < 2:
        raise ShapeError(f"{kind}: operand shapes {a}, {b} are too small")
    k = a[-1]
    n = b[-2] if transpose_b else b[-1]
    kb = b[-1] if transpose_b else b[-2]
    if k != kb:
        raise ShapeError(f"{kind}: contraction sizes differ ({a} x {b}, transpose_b={transpose_b})")
    lead = a[:-1]
    lead_names = {0: [], 1: ["m"], 2: ["b", "m"]}.get(len(lead), _names("b", len(lead) - 1) + ["m"])
    batch = lead[:-1]
    if batch_b and tuple(b[:-2]) != tuple(batch):
        raise ShapeError(f"{kind}: batch dims differ: {a} vs {b}")
    dims = [LoopDim(nm, e) for nm, e in zip(lead_names, lead, strict=True)]
    dims += [LoopDim("k", k, DimKind.REDUCE, Reducer.SUM), LoopDim("n", n)]
    b_core: TensorDims = (("n",), ("k",)) if transpose_b else (("k",), ("n",))
    b_dims = (_single(lead_names[:-1]) if batch_b else ()) + b_core
    out_shape = tuple(lead) + (n,)
    ins = [_single(lead_names) + (("k",),), b_dims]
    outs = [_single(lead_names) + (("n",),)]
    return _form(dims, ins, outs, [out_shape], 2 * _numel(lead) * k * n)


def linear(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> OpForm:
    """`.. m k, n k -> .. m n`: weight stored [out, in] (torch's nn.Linear)."""
    _need("linear", shapes, (2,))
    if len(shapes[1]) != 2:
        raise ShapeError(f"linear: weight must be 2-D [out, in], got {shapes[1]}")
    return _matmul_core("linear", shapes[0], shapes[1], True, False)


def matmul(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> OpForm:
    """`.. m k, k n -> .. m n` (2-D right operand; `transpose_b` reads it as [n, k])."""
    _need("matmul", shapes, (2,))
    if len(shapes[1]) != 2:
        raise ShapeError(f"matmul: right operand must be 2-D, got {shapes[1]}; use bmm")
    return _matmul_core("matmul", shapes[0], shapes[1], bool(attrs.get("transpose_b")), False)


def bmm(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> OpForm:
    """`b.. m k, b.. k n -> b.. m n` (attention scores and context; `transpose_b` for Q K^T)."""
    _need("bmm", shapes, (2,))
    if len(shapes[0]) != len(shapes[1]) or len(shapes[0]) < 3:
        raise ShapeError(f"bmm: operands need equal rank >= 3, got {shapes[0]}, {shapes[1]}")
    return _matmul_core("bmm", shapes[0], shapes[1], bool(attrs.get("transpose_b")), True)


def _pair(value: Any, what: str, low: int = 1) -> tuple[int, int]:
    """An int or a pair of ints, each >= `low` (kernel and stride >= 1, padding >= 0)."""
    pair = (value, value) if isinstance(value, Integral) and not isinstance(value, bool) else value
    a, b = _ints(pair, what) if len(_ints(pair, what)) == 2 else (None, None)
    if a is None or b is None or a < low or b < low:
        raise ShapeError(f"{what} must be an int or a pair of ints >= {low}, got {value!r}")
    return a, b


def conv2d(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> OpForm:
    """`n c y x, o c r s -> n o y x`: c REDUCE(sum), y x WINDOW (halo r-stride), r s FROZEN.

    With `groups` G > 1 (depthwise: G = channels) the channels are `(g c)` and `(g o)`: the
    group dim g is PARALLEL (each group convolves its own channels), c and o inside a group FROZEN.
    """
    _need("conv2d", shapes, (2,))
    x, w = shapes
    groups = attrs.get("groups", 1)
    if not isinstance(groups, Integral) or isinstance(groups, bool):
        raise ShapeError(f"conv2d: groups must be a positive int, got {groups!r}")
    groups = int(groups)
    if groups < 1 or len(x) != 4 or len(w) != 4 or x[1] != w[1] * groups or w[0] % groups:
        raise ShapeError(
            f"conv2d: input {x} and weight {w} need [n,c,h,w] and [o,c/groups,r,s] with groups "
            f"({groups}) dividing c and o"
        )
    sy, sx = _pair(attrs.get("stride", 1), "conv2d: stride")
    py, px = _pair(attrs.get("padding", 0), "conv2d: padding", 0)
    r, s = w[2], w[3]
    oy, ox = (x[2] + 2 * py - r) // sy + 1, (x[3] + 2 * px - s) // sx + 1
    if oy < 1 or ox < 1:
        raise ShapeError(f"conv2d: input {x} too small for kernel {(r, s)}")
    inner = DimKind.FROZEN if groups > 1 else DimKind.PARALLEL
    dims = [
        LoopDim("n", x[0]),
        LoopDim("o", w[0] // groups, inner),
        LoopDim("y", oy, DimKind.WINDOW, halo=max(r - sy, 0), span=x[2]),
        LoopDim("x", ox, DimKind.WINDOW, halo=max(s - sx, 0), span=x[3]),
        LoopDim("c", w[1], DimKind.FROZEN if groups > 1 else DimKind.REDUCE),
        LoopDim("r", r, DimKind.FROZEN),
        LoopDim("s", s, DimKind.FROZEN),
    ]
    cin: Group = ("c",)
    cout: Group = ("o",)
    if groups > 1:
        dims.insert(1, LoopDim("g", groups))
        cin, cout = ("g", "c"), ("g", "o")
    ins = [(("n",), cin, ("y",), ("x",)), (cout, ("c",), ("r",), ("s",))]
    out = (x[0], w[0], oy, ox)
    return _form(dims, ins, [(("n",), cout, ("y",), ("x",))], [out], 2 * _numel(out) * w[1] * r * s)


def pool2d(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> OpForm:
    """`n c y x -> n c y x` over windows: y x WINDOW (halo kernel-stride)."""
    _need("pool2d", shapes, (1,))
    (x,) = shapes
    if len(x) != 4:
        raise ShapeError(f"pool2d: input must be [n,c,h,w], got {x}")
    ky, kx = _pair(attrs.get("kernel", 2), "pool2d: kernel")
    sy, sx = _pair(attrs.get("stride", attrs.get("kernel", 2)), "pool2d: stride")
    py, px = _pair(attrs.get("padding", 0), "pool2d: padding", 0)
    oy, ox = (x[2] + 2 * py - ky) // sy + 1, (x[3] + 2 * px - kx) // sx + 1
    if oy < 1 or ox < 1:
        raise ShapeError(f"pool2d: input {x} too small for kernel {(ky, kx)}")
    dims = [
        LoopDim("n", x[0]),
        LoopDim("c", x[1]),
        LoopDim("y", oy, DimKind.WINDOW, halo=max(ky - sy, 0), span=x[2]),
        LoopDim("x", ox, DimKind.WINDOW, halo=max(kx - sx, 0), span=x[3]),
    ]
    out = (x[0], x[1], oy, ox)
    io = (("n",), ("c",), ("y",), ("x",))
    return _form(dims, [io], [io], [out], _numel(out) * ky * kx)


def reduce(shapes: Sequence[Shape], attrs: Mapping[str, Any], reducer: Reducer) -> OpForm:
    """`d0 d1 d2 -> d0 d2` with the reduced dims REDUCE (mean is a sum then a local scale)."""
    _need("reduce", shapes, (1,))
    (x,) = shapes
    axes = attrs.get("axes")
    if isinstance(axes, Integral) and not isinstance(axes, bool):
        axes = (axes,)  # one axis, as numpy accepts it
    axes = (
        tuple(range(len(x)))
        if axes is None
        else tuple(_axis(a, len(x), "reduce") for a in _ints(axes, "reduce: axes"))
    )
    keep = bool(attrs.get("keepdims", False))
    names = _names("d", len(x))
    dims = [
        LoopDim(n, e, DimKind.REDUCE, reducer) if i in axes else LoopDim(n, e)
        for i, (n, e) in enumerate(zip(names, x, strict=True))
    ]
    out_dims: list[Group] = []
    out_shape: list[int] = []
    for i, n in enumerate(names):
        if i not in axes:
            out_dims.append((n,))
            out_shape.append(x[i])
        elif keep:
            out_dims.append(())
            out_shape.append(1)
    return _form(dims, [_single(names)], [tuple(out_dims)], [tuple(out_shape)], _numel(x))


def reshape(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> OpForm:
    """`b s (h d) -> b s h d`: loop dims are the common refinement of both shapes.

    Where the two shapes have no common refinement (e.g. 6x4 -> 4x6) the block's loop dims are
    FROZEN on each side: such a block is never cut.
    """
    _need("reshape", shapes, (1,))
    (x,) = shapes
    target = list(_ints(attrs["shape"], "reshape: shape"))
    if any(t < 1 and t != -1 for t in target):
        raise ShapeError(f"reshape: target shape {target} has sizes below 1 (only one -1 allowed)")
    if target.count(-1) > 1:
        raise ShapeError(f"reshape: at most one -1 in target shape {target}")
    if -1 in target:
        known = _numel([t for t in target if t != -1])
        target[target.index(-1)] = _numel(x) // max(known, 1)
    out = tuple(int(t) for t in target)
    if _numel(out) != _numel(x):
        raise ShapeError(f"reshape: cannot reshape {x} ({_numel(x)} elements) into {out}")
    dims: list[LoopDim] = []
    in_groups: list[list[str]] = [[] for _ in x]
    out_groups: list[list[str]] = [[] for _ in out]
    i = j = 0
    counter = 0
    while i < len(x) or j < len(out):
        # one block: the shortest runs of dims on both sides with equal products
        if i < len(x) and x[i] == 1:
            i += 1
            continue
        if j < len(out) and out[j] == 1:
            j += 1
            continue
        i0, j0, pa, pb = i, j, x[i], out[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                pa *= x[i]
                i += 1
            else:
                pb *= out[j]
                j += 1
        a_sizes = [s for s in x[i0:i]]
        b_sizes = [s for s in out[j0:j]]
        bounds_a = _cumulative(a_sizes)
        bounds_b = _cumulative(b_sizes)
        union = sorted(set(bounds_a) | set(bounds_b))
        if all(u2 % u1 == 0 for u1, u2 in zip([1] + union, union, strict=False)):
            prev = 1
            for u in union:
                name = f"r{counter}"
                counter += 1
                dims.append(LoopDim(name, u // prev))
                for groups, sizes, offset in ((in_groups, a_sizes, i0), (out_groups, b_sizes, j0)):
                    lo = 1
                    for pos, size in enumerate(sizes):
                        hi = lo * size
                        if lo <= prev and u <= hi and size > 1:
                            groups[offset + pos].append(name)
                        lo = hi
                prev = u
        else:
            for groups, sizes, offset in ((in_groups, a_sizes, i0), (out_groups, b_sizes, j0)):
                for pos, size in enumerate(sizes):
                    name = f"r{counter}"
                    counter += 1
                    dims.append(LoopDim(name, size, DimKind.FROZEN))
                    groups[offset + pos].append(name)
    ins = [tuple(tuple(g) for g in in_groups)]
    outs = [tuple(tuple(g) for g in out_groups)]
    return _form(dims, ins, outs, [out], 0)


def _cumulative(sizes: Sequence[int]) -> list[int]:
    bounds, acc = [], 1
    for s in sizes:
        acc *= s
        bounds.append(acc)
    return bounds


def transpose(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> OpForm:
    """`d0 d1 d2 -> d2 d0 d1` for `perm=(2, 0, 1)`."""
    _need("transpose", shapes, (1,))
    (x,) = shapes
    perm = _ints(attrs["perm"], "transpose: perm")
    if sorted(perm) != list(range(len(x))):
        raise ShapeError(f"transpose: perm {perm} is not a permutation of rank {len(x)}")
    names = _names("d", len(x))
    dims = [LoopDim(n, e) for n, e in zip(names, x, strict=True)]
    out = tuple(x[p] for p in perm)
    return _form(dims, [_single(names)], [tuple((names[p],) for p in perm)], [out], 0)


def embedding(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> OpForm:
    """`v e, d0 d1 -> d0 d1 e`: table first; v REDUCE(sum) (masked lookup + all-reduce)."""
    _need("embedding", shapes, (2,))
    table, ids = shapes
    if len(table) != 2:
        raise ShapeError(f"embedding: table must be 2-D [vocab, dim], got {table}")
    names = _names("d", len(ids))
    dims = [LoopDim(n, e) for n, e in zip(names, ids, strict=True)]
    dims += [LoopDim("e", table[1]), LoopDim("v", table[0], DimKind.REDUCE, Reducer.SUM)]
    out = tuple(ids) + (table[1],)
    ins = [(("v",), ("e",)), _single(names)]
    return _form(dims, ins, [_single(names) + (("e",),)], [out], _numel(out))


def concat(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> OpForm:
    """`d0 c0, d0 c1 -> d0 cat`: the concatenated axis is FROZEN (one loop dim per side)."""
    if not shapes:
        raise ShapeError("concat needs at least one input")
    rank = len(shapes[0])
    axis = _axis(attrs.get("axis", 0), rank, "concat")
    for s in shapes:
        if len(s) != rank or any(
            a != b for i, (a, b) in enumerate(zip(s, shapes[0], strict=True)) if i != axis
        ):
            raise ShapeError(f"concat: shapes {list(shapes)} differ outside axis {axis}")
    names = _names("d", rank)
    dims = [
        LoopDim(n, e) for i, (n, e) in enumerate(zip(names, shapes[0], strict=True)) if i != axis
    ]
    ins: list[TensorDims] = []
    for k, s in enumerate(shapes):
        dims.append(LoopDim(f"c{k}", s[axis], DimKind.FROZEN))
        ins.append(tuple((f"c{k}",) if i == axis else (n,) for i, n in enumerate(names)))
    total = sum(s[axis] for s in shapes)
    dims.append(LoopDim("cat", total, DimKind.FROZEN))
    out = tuple(total if i == axis else e for i, e in enumerate(shapes[0]))
    outs = [tuple(("cat",) if i == axis else (n,) for i, n in enumerate(names))]
    return _form(dims, ins, outs, [out], 0)


def cross_entropy(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> OpForm:
    """`d0 d1 v, d0 d1 -> ` mean loss: rows REDUCE(sum), classes v FROZEN."""
    _need("cross_entropy", shapes, (2,))
    logits, labels = shapes
    if tuple(logits[:-1]) != tuple(labels):
        raise ShapeError(f"cross_entropy: labels {labels} must match logits {logits} minus classes")
    names = _names("d", len(labels))
    dims = [LoopDim(n, e, DimKind.REDUCE, Reducer.SUM) for n, e in zip(names, labels, strict=True)]
    dims.append(LoopDim("v", logits[-1], DimKind.FROZEN))
    ins = [_single(names) + (("v",),), _single(names)]
    return _form(dims, ins, [()], [()], 6 * _numel(logits))


def einsum(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> OpForm:
    """Any einsum `spec` (e.g. MoE dispatch `b s e c, b s m -> e c m`): summed dims REDUCE(sum)."""
    from shardplan.ir.signature import parse_operands

    spec = attrs["spec"]
    if not isinstance(spec, str) or spec.count("->") != 1 or "(" in spec or ")" in spec:
        raise ShapeError(
            f"einsum spec {spec!r} must be text with exactly one '->' and no groups, "
            "e.g. 'b s e c, b s m -> e c m'"
        )
    lhs, rhs = spec.split("->")
    ins = parse_operands(lhs)
    outs = parse_operands(rhs)
    if len(outs) != 1:
        raise ShapeError(f"einsum {spec!r}: exactly one result, got {len(outs)}")
    (out,) = outs
    if len(ins) != len(shapes):
        raise ShapeError(f"einsum {spec!r}: {len(ins)} operands but {len(shapes)} inputs")
    extents: dict[str, int] = {}
    for dims_, shape in zip(ins, shapes, strict=True):
        if len(dims_) != len(shape):
            raise ShapeError(f"einsum {spec!r}: operand rank {len(dims_)} vs shape {shape}")
        for group, size in zip(dims_, shape, strict=True):
            (name,) = group
            if extents.setdefault(name, size) != size:
                raise ShapeError(
                    f"einsum {spec!r}: loop dim {name!r} has sizes {extents[name]}, {size}"
                )
    out_names = [g[0] for g in out if g]
    missing = [n for n in out_names if n not in extents]
    if missing or len(out_names) != len(out):
        raise ShapeError(
            f"einsum {spec!r}: result loop dims {missing or list(out)} appear in no input; "
            "every result letter must index an input"
        )
    frozen = set(attrs.get("frozen", ()))
    order = out_names + [n for n in extents if n not in out_names]
    dims = []
    for n in order:
        kind = (
            DimKind.FROZEN
            if n in frozen
            else (DimKind.PARALLEL if n in out_names else DimKind.REDUCE)
        )
        dims.append(LoopDim(n, extents[n], kind, Reducer.SUM if kind is DimKind.REDUCE else None))
    out_shape = tuple(extents[n] for n in out_names)
    return _form(dims, list(ins), [out], [out_shape], 2 * _numel(extents.values()))


def _reducer(reducer: Reducer) -> Rule:
    return lambda shapes, attrs: reduce(shapes, attrs, reducer)


UNARY = (
    "relu",
    "gelu",
    "silu",
    "tanh",
    "sigmoid",
    "dropout",
    "cast",
    "exp",
    "neg",
    "scale",
    "sqrt",
    "rsqrt",
    "identity",
)
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")

CATALOGUE: Mapping[str, Rule] = MappingProxyType(
    {
        **{k: elementwise for k in UNARY + BINARY},
        "bias_add": bias_add,
        "softmax": softmax,
        "layer_norm": norm_last,
        "rms_norm": norm_last,
        "batch_norm": batch_norm,
        "linear": linear,
        "matmul": matmul,
        "bmm": bmm,
        "conv2d": conv2d,
        "pool2d": pool2d,
        "reduce_sum": _reducer(Reducer.SUM),
        "reduce_mean": _reducer(Reducer.SUM),
        "reduce_max": _reducer(Reducer.MAX),
        "reshape": reshape,
        "transpose": transpose,
        "embedding": embedding,
        "concat": concat,
        "cross_entropy": cross_entropy,
        "einsum": einsum,
        **MOE_RULES,  # experts as a loop dim (shardplan/ir/catalogue_moe.py)
        **ATTENTION_RULES,  # fused attention (shardplan/ir/catalogue_attention.py)
    }
)


def op_form(kind: str, shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> OpForm:
    """Look up `kind` and derive its form; unknown kinds raise UnsupportedOpError."""
    rule = CATALOGUE.get(kind)
    if rule is None:
        from shardplan.checks import did_you_mean

        hint = did_you_mean(kind, list(CATALOGUE), "`shardplan.ir.catalogue.CATALOGUE` lists them")
        raise UnsupportedOpError(
            f"op kind {kind!r} is not in the catalogue{hint}. "
            "Add it to shardplan/ir/catalogue.py or map it to an existing kind"
        )
    try:
        return rule([tuple(int(d) for d in s) for s in shapes], attrs)
    except KeyError as e:
        raise ShapeError(f"{kind}: missing attribute {e.args[0]!r}") from e
    except (TypeError, ValueError, ZeroDivisionError, IndexError) as e:
        # an attribute of the wrong type or value that no rule names: say which op and attrs
        raise ShapeError(f"{kind}: attributes {dict(attrs)} do not fit inputs {shapes}: {e}") from e
