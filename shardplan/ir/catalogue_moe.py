"""Catalogue forms of Mixture-of-Experts layers: routing, token dispatch/combine, expert matmuls.

Experts are a loop dim `e`. Tokens are routed within groups `g` (GShard): a group of `t` tokens
sends each token to its top `k` experts, and expert `e` takes at most `c` (the capacity) tokens
of each group. The layer is six catalogue ops, all pure functions of their operands:

    moe_topk_ids      g t e -> g t k        expert ids of the k largest router probabilities
    moe_topk_weights  g t e -> g t k        those probabilities (optionally renormalised)
    moe_route         g t k -> g t k        flat slot id e*c + position of each choice (-1: dropped)
    moe_slots         g t k -> g e c        token of each expert slot (-1: empty)
    moe_dispatch      g t m, g e c -> e g c m           gather the tokens into expert slots
    expert_matmul     e .. k, e k n -> e .. n           one matmul per expert (`transpose_b`:
                                                        the weight is stored [e, n, k])
    moe_combine       e g c n, g t k, g t k -> g t n    weighted sum of each token's k results

Cutting `e` in `expert_matmul` is expert parallelism; `g` is the data-parallel dim of every op, so
a plan that cuts `g` in dispatch/combine and `e` in the experts reads the dispatched tokens in
another layout than they were produced in: the cost model prices that edge as the all-to-all it
is (split on tensor dim 1 -> split on tensor dim 0), from the signatures alone.

Which dims are FROZEN and why: routing needs a token's whole probability row (`e`) and the
position of a choice depends on every earlier token of its group (`t`, a running count), so
routing ops cut only `g`. Dispatch and combine read tokens/slots by data-dependent position, so
the looked-up dim (`t` in dispatch; `e`, `c` in combine) is FROZEN: a part of it cannot look up
positions it does not hold. Combine's `k` is REDUCE(sum): each part sums its own choices.
Building a form is O(rank).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from shardplan.errors import ShapeError
from shardplan.ir.dims import DimKind, LoopDim, Reducer
from shardplan.ir.signature import Signature

Shape = tuple[int, ...]


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _form(
    dims: list[LoopDim],
    ins: list[tuple[str, ...]],
    outs: list[tuple[str, ...]],
    shapes: list[Shape],
    flops: float,
) -> Any:
    from shardplan.ir.catalogue import OpForm

    def groups(names: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
        return tuple((n,) for n in names)

    sig = Signature(tuple(dims), tuple(groups(i) for i in ins), tuple(groups(o) for o in outs))
    return OpForm(sig, tuple(shapes), float(flops))


def _need(kind: str, shapes: Sequence[Shape], ranks: Sequence[int]) -> None:
    if len(shapes) != len(ranks) or any(len(s) != r for s, r in zip(shapes, ranks, strict=False)):
        raise ShapeError(f"{kind}: operands {list(shapes)} need ranks {list(ranks)}")


def _int_attr(kind: str, attrs: Mapping[str, Any], name: str) -> int:
    value = attrs.get(name)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ShapeError(f"{kind}: attribute {name!r} must be a positive int, got {value!r}")
    return value


def _topk(kind: str, shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Any:
    """`g t e -> g t k`: e FROZEN (a choice needs the token's whole row), k FROZEN."""
    _need(kind, shapes, (3,))
    g, t, e = shapes[0]
    k = _int_attr(kind, attrs, "k")
    if k > e:
        raise ShapeError(f"{kind}: k={k} is larger than the {e} experts")
    dims = [
        LoopDim("g", g),
        LoopDim("t", t),
        LoopDim("e", e, DimKind.FROZEN),
        LoopDim("k", k, DimKind.FROZEN),
    ]
    return _form(dims, [("g", "t", "e")], [("g", "t", "k")], [(g, t, k)], _numel(shapes[0]))


def moe_topk_ids(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Any:
    """Expert ids (int) of the `k` largest router probabilities of each token, largest first."""
    return _topk("moe_topk_ids", shapes, attrs)


def moe_topk_weights(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Any:
    """The `k` largest probabilities of each token (`normalize`: divided by their sum)."""
    return _topk("moe_topk_weights", shapes, attrs)


def _routing(kind: str, shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> tuple[int, ...]:
    _need(kind, shapes, (3,))
    g, t, k = shapes[0]
    return g, t, k, _int_attr(kind, attrs, "experts"), _int_attr(kind, attrs, "capacity")


def moe_route(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Any:
    """`g t k -> g t k`: the slot `e * capacity + position` each choice lands in, -1 if the
    expert is full; positions count earlier choices of the same group in (t, k) order."""
    g, t, k, _, _ = _routing("moe_route", shapes, attrs)
    dims = [LoopDim("g", g), LoopDim("t", t, DimKind.FROZEN), LoopDim("k", k, DimKind.FROZEN)]
    return _form(dims, [("g", "t", "k")], [("g", "t", "k")], [(g, t, k)], g * t * k)


def moe_slots(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Any:
    """`g t k -> g e c`: the token (index in its group) in each expert slot, -1 if empty."""
    g, t, k, e, c = _routing("moe_slots", shapes, attrs)
    dims = [
        LoopDim("g", g),
        LoopDim("t", t, DimKind.FROZEN),
        LoopDim("k", k, DimKind.FROZEN),
        LoopDim("e", e, DimKind.FROZEN),
        LoopDim("c", c, DimKind.FROZEN),
    ]
    return _form(dims, [("g", "t", "k")], [("g", "e", "c")], [(g, e, c)], g * t * k)


def moe_dispatch(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Any:
    """`g t m, g e c -> e g c m`: slot (e, g, c) holds token slots[g, e, c] (zeros if empty)."""
    _need("moe_dispatch", shapes, (3, 3))
    (g, t, m), (g2, e, c) = shapes
    if g2 != g:
        raise ShapeError(f"moe_dispatch: tokens {shapes[0]} and slots {shapes[1]} differ in groups")
    dims = [
        LoopDim("e", e),
        LoopDim("g", g),
        LoopDim("c", c),
        LoopDim("m", m),
        LoopDim("t", t, DimKind.FROZEN),
    ]
    return _form(
        dims,
        [("g", "t", "m"), ("g", "e", "c")],
        [("e", "g", "c", "m")],
        [(e, g, c, m)],
        e * g * c * m,
    )


def expert_matmul(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Any:
    """`e a.. k, e k n -> e a.. n` (`transpose_b`: weight [e, n, k]); k REDUCE(sum)."""
    if len(shapes) != 2 or len(shapes[0]) < 2 or len(shapes[1]) != 3:
        raise ShapeError(f"expert_matmul: need [e, .., k] and a 3-D weight, got {list(shapes)}")
    x, w = shapes
    e, k = x[0], x[-1]
    n, kw = (w[1], w[2]) if attrs.get("transpose_b") else (w[2], w[1])
    if w[0] != e or kw != k:
        raise ShapeError(
            f"expert_matmul: tokens {x} and weight {w} disagree "
            f"(transpose_b={bool(attrs.get('transpose_b'))})"
        )
    lead = [f"a{i}" for i in range(len(x) - 2)]
    dims = [
        LoopDim("e", e),
        *(LoopDim(a, s) for a, s in zip(lead, x[1:-1], strict=True)),
        LoopDim("k", k, DimKind.REDUCE, Reducer.SUM),
        LoopDim("n", n),
    ]
    w_dims = ("e", "n", "k") if attrs.get("transpose_b") else ("e", "k", "n")
    out = (e, *x[1:-1], n)
    return _form(dims, [("e", *lead, "k"), w_dims], [("e", *lead, "n")], [out], 2 * _numel(x) * n)


def moe_combine(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Any:
    """`e g c n, g t k, g t k -> g t n`: out[g, t] = sum_k weight * expert result at the slot."""
    _need("moe_combine", shapes, (4, 3, 3))
    (e, g, c, n), route, weights = shapes
    g2, t, k = route
    if g2 != g or weights != route:
        raise ShapeError(
            f"moe_combine: results {shapes[0]}, routes {route} and weights {weights} disagree"
        )
    dims = [
        LoopDim("g", g),
        LoopDim("t", t),
        LoopDim("n", n),
        LoopDim("k", k, DimKind.REDUCE, Reducer.SUM),
        LoopDim("e", e, DimKind.FROZEN),
        LoopDim("c", c, DimKind.FROZEN),
    ]
    return _form(
        dims,
        [("e", "g", "c", "n"), ("g", "t", "k"), ("g", "t", "k")],
        [("g", "t", "n")],
        [(g, t, n)],
        2 * g * t * k * n,
    )


MOE_RULES = {
    "moe_topk_ids": moe_topk_ids,
    "moe_topk_weights": moe_topk_weights,
    "moe_route": moe_route,
    "moe_slots": moe_slots,
    "moe_dispatch": moe_dispatch,
    "expert_matmul": expert_matmul,
    "moe_combine": moe_combine,
}
"""The MoE kinds, merged into `shardplan.ir.catalogue.CATALOGUE`."""

INT_RESULT_KINDS = frozenset({"moe_topk_ids", "moe_route", "moe_slots"})
"""Kinds whose result is an int32 index (engines make them int, not float)."""

ROUTING_ATTRS: Mapping[str, str] = MappingProxyType({"moe_topk_ids": "k", "moe_route": "experts"})
"""Routing kinds -> the attribute that sizes a layer's routing: choices per token (`k`), experts
(`experts`); a token uses k/experts of each expert weight (`zoo.llm.activated_params`)."""

EXPERT_WEIGHT_OPERAND: Mapping[str, int] = MappingProxyType({"expert_matmul": 1})
"""Kinds that read an expert-stacked weight [e, ...] -> the operand it is."""
