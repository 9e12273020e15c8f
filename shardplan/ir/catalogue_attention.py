"""Catalogue form of fused scaled-dot-product attention (FlashAttention and its kin).

    attention   q [B.., G.., s, d], k [B.., t, d], v [B.., t, e] (, mask [s, t])
                -> o [B.., G.., s, e],   o = softmax(q k^T x scale + mask) v  over t

One op where the unfused form is five (score matmul, scale, mask, softmax, value matmul): the
kernel (FlashAttention, Dao et al. 2022; cuDNN / Transformer Engine fused attention in
megatron-core; PyTorch's `scaled_dot_product_attention`; `jax.nn.dot_product_attention`) keeps the
s x t scores in on-chip memory, so only q, k, v, the mask and o move through HBM and the backward
keeps its inputs and recomputes the scores (`ir.traits.KindTraits.backward_recompute`).

Loop dims: the batch dims `b*` (shared by q, k, v: batch and key/value heads), the group dims `g*`
(query heads sharing one key/value head: grouped-query attention; q's extra leading dims, which
k and v broadcast over), the queries `s` and the value features `e` are PARALLEL; the keys `t` and
the query-key features `d` are FROZEN: a device's softmax needs every key of its query rows and
every feature of their scores (a key-split is context parallelism: its keys are gathered, as
`cost.sequence.ring_terms` prices). The optional additive mask [s, t] (causal) broadcasts over
the batch and group dims. FLOPs 2 |b| |g| s t (d + e): the two GEMMs, as FlashAttention and
Megatron-LM count attention (the softmax's exponentials are not counted). O(rank).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from shardplan.errors import ShapeError
from shardplan.ir.dims import DimKind, LoopDim
from shardplan.ir.signature import Signature

Shape = tuple[int, ...]


def attention(shapes: Sequence[Shape], attrs: Mapping[str, Any]) -> Any:
    """The form of one fused attention (module docstring); `attrs["scale"]` (default d ** -0.5)
    is the engines' alone."""
    from shardplan.ir.catalogue import OpForm

    if len(shapes) not in (3, 4):
        raise ShapeError(f"attention takes q, k, v and an optional mask, got {len(shapes)} inputs")
    q, k, v = shapes[:3]
    _check(q, k, v, shapes[3] if len(shapes) == 4 else None)
    scale = attrs.get("scale", k[-1] ** -0.5)
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ShapeError(f"attention: attribute 'scale' must be a finite number, got {scale!r}")
    batch = [f"b{i}" for i in range(len(k) - 2)]
    group = [f"g{i}" for i in range(len(q) - len(k))]
    extents = [*k[:-2], *q[len(k) - 2 : -2]]
    dims = [LoopDim(n, x) for n, x in zip(batch + group, extents, strict=True)]
    dims += [
        LoopDim("s", q[-2]),
        LoopDim("t", k[-2], DimKind.FROZEN),
        LoopDim("d", k[-1], DimKind.FROZEN),
        LoopDim("e", v[-1]),
    ]
    single = lambda names: tuple((n,) for n in names)  # noqa: E731
    ins = [single([*batch, *group, "s", "d"]), single([*batch, "t", "d"])]
    ins += [single([*batch, "t", "e"])] + ([single(["s", "t"])] if len(shapes) == 4 else [])
    out = (*q[:-1], v[-1])
    rows = math.prod(extents) * q[-2] * k[-2]
    signature = Signature(tuple(dims), tuple(ins), (single([*batch, *group, "s", "e"]),))
    return OpForm(signature, (out,), float(2 * rows * (k[-1] + v[-1])))


def _check(q: Shape, k: Shape, v: Shape, mask: Shape | None) -> None:
    if len(k) < 2 or len(v) != len(k) or len(q) < len(k):
        raise ShapeError(
            f"attention: q {q}, k {k}, v {v} need k and v of one rank >= 2 and q of at least it"
        )
    lead = len(k) - 2
    if q[:lead] != k[:lead] or v[:lead] != k[:lead]:
        raise ShapeError(f"attention: batch dims of q {q}, k {k}, v {v} differ")
    if q[-1] != k[-1] or v[-2] != k[-2]:
        raise ShapeError(
            f"attention: q {q} and k {k} need one feature size, k and v {v} one key count"
        )
    if mask is not None and mask != (q[-2], k[-2]):
        raise ShapeError(f"attention: mask {mask} must be [queries, keys] = {(q[-2], k[-2])}")


ATTENTION_RULES = {"attention": attention}
"""The fused attention kind, merged into `shardplan.ir.catalogue.CATALOGUE`."""

__all__ = ["ATTENTION_RULES", "attention"]
