"""JAX and torch kernels of the MoE kinds (`shardplan.ir.catalogue_moe`), same math in both.

Routing is dense and static-shaped (GShard): a choice's position in its expert is a running count
(cumsum of one-hot expert ids over the group's choices in (t, k) order); slots past the capacity
are dropped. Dispatch and combine are einsums with one-hot matrices built from the int slot
tables, so XLA partitions them like any einsum. The JAX top-k ranks each token's experts by
pairwise comparison (rank of j = #larger + #equal with a lower id, O(g t e^2)) and selects rank
r with a one-hot sum: elementwise ops and reductions over `e` only, so XLA keeps the split `g`
and `t` dims local (its TopK custom call is replicated whole by the SPMD partitioner); same order
as `jax.lax.top_k` (largest first, ties by lower id) for finite (non-NaN) probabilities.
Memory of the one-hots: O(g t k e c) for routing, O(g e c t) for dispatch, O(g t k e c) for
combine, O(g t e^2) for top-k; fine at the sizes engines verify.
The kernels are global functions of their operands; under a plan they are only ever called on
parts whose FROZEN dims are whole (see the catalogue), so they are also correct on local shards.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardplan.ir.op import Op

Kernel = Callable[..., Any]


def _attrs(op: Op) -> tuple[int, int]:
    return int(op.attr("experts")), int(op.attr("capacity"))


def _table(
    topk_ids: Kernel,
    topk_weights: Kernel,
    route: Kernel,
    slots: Kernel,
    dispatch: Kernel,
    expert_matmul: Kernel,
    combine: Kernel,
) -> dict[str, Kernel]:
    """The kind -> kernel table of one framework's MoE kernels."""
    return {
        "moe_topk_ids": topk_ids,
        "moe_topk_weights": topk_weights,
        "moe_route": route,
        "moe_slots": slots,
        "moe_dispatch": dispatch,
        "expert_matmul": expert_matmul,
        "moe_combine": combine,
    }


def jax_kernels() -> dict[str, Kernel]:
    """MoE kernels on jax.numpy (jax imported by the caller)."""
    import jax
    import jax.numpy as jnp

    def top_k(probs: Any, k: int) -> tuple[Any, Any]:
        # not jax.lax.top_k: XLA's SPMD partitioner replicates its TopK custom call (an
        # all-gather of the whole operand) even when only the batch dims are split
        e = probs.shape[-1]
        row, col = probs[..., :, None], probs[..., None, :]
        lower = jnp.arange(e)[:, None] < jnp.arange(e)[None, :]
        before = (row > col) | ((row == col) & lower)  # [.., i, j]: i ranks before j
        rank = jnp.sum(before, axis=-2)  # a permutation of 0..e-1 per row (ties: lower id first)
        hit = rank[..., :, None] == jnp.arange(k)  # [.., e, k]: expert e is choice r
        ids = jnp.sum(jnp.where(hit, jnp.arange(e)[:, None], 0), axis=-2)
        values = jnp.sum(jnp.where(hit, probs[..., :, None], 0), axis=-2)  # exact: one term
        return values, ids.astype(jnp.int32)

    def topk_ids(op: Op, probs: Any) -> Any:
        return top_k(probs, int(op.attr("k")))[1]

    def topk_weights(op: Op, probs: Any) -> Any:
        values = top_k(probs, int(op.attr("k")))[0]
        if op.attr("normalize"):
            values = values / jnp.sum(values, axis=-1, keepdims=True)
        return values

    def route(op: Op, ids: Any) -> Any:
        experts, capacity = _attrs(op)
        g, t, k = ids.shape
        hot = jax.nn.one_hot(ids.reshape(g, t * k), experts, dtype=jnp.int32)
        position = jnp.sum((jnp.cumsum(hot, axis=1) - 1) * hot, axis=-1)
        slot = ids.reshape(g, t * k) * capacity + position
        return jnp.where(position < capacity, slot, -1).reshape(g, t, k).astype(jnp.int32)

    def slots(op: Op, ids: Any) -> Any:
        experts, capacity = _attrs(op)
        g, t, _ = ids.shape
        where = route(op, ids)[..., None] == jnp.arange(experts * capacity)  # g t k s
        taken = jnp.any(where, axis=2)  # g t s
        token = jnp.argmax(taken, axis=1)  # g s: the one token in each slot
        table = jnp.where(jnp.any(taken, axis=1), token, -1)
        return table.reshape(g, experts, capacity).astype(jnp.int32)

    def dispatch(op: Op, x: Any, table: Any) -> Any:
        hot = (table[..., None] == jnp.arange(x.shape[1])).astype(x.dtype)  # g e c t
        return jnp.einsum("gect,gtm->egcm", hot, x)

    def expert_matmul(op: Op, x: Any, w: Any) -> Any:
        w = jnp.swapaxes(w, 1, 2) if op.attr("transpose_b") else w
        return jnp.einsum("e...k,ekn->e...n", x, w)

    def combine(op: Op, y: Any, routes: Any, weights: Any) -> Any:
        e, g, c, n = y.shape
        flat = jnp.transpose(y, (1, 0, 2, 3)).reshape(g, e * c, n)
        hot = (routes[..., None] == jnp.arange(e * c)).astype(y.dtype)  # g t k s
        return jnp.einsum("gtks,gtk,gsn->gtn", hot, weights, flat)

    return _table(topk_ids, topk_weights, route, slots, dispatch, expert_matmul, combine)


def torch_kernels() -> dict[str, Kernel]:
    """MoE kernels on torch (torch imported by the caller)."""
    import torch

    def topk_ids(op: Op, probs: Any) -> Any:
        return torch.topk(probs, int(op.attr("k")), dim=-1).indices

    def topk_weights(op: Op, probs: Any) -> Any:
        values = torch.topk(probs, int(op.attr("k")), dim=-1).values
        if op.attr("normalize"):
            values = values / values.sum(dim=-1, keepdim=True)
        return values

    def route(op: Op, ids: Any) -> Any:
        experts, capacity = _attrs(op)
        g, t, k = ids.shape
        flat = ids.reshape(g, t * k).long()
        hot = torch.nn.functional.one_hot(flat, experts)
        position = ((torch.cumsum(hot, dim=1) - 1) * hot).sum(dim=-1)
        slot = flat * capacity + position
        return torch.where(position < capacity, slot, -1).reshape(g, t, k)

    def slots(op: Op, ids: Any) -> Any:
        experts, capacity = _attrs(op)
        g = ids.shape[0]
        where = route(op, ids).unsqueeze(-1) == torch.arange(experts * capacity)
        taken = where.any(dim=2)
        token = taken.long().argmax(dim=1)
        table = torch.where(taken.any(dim=1), token, -1)
        return table.reshape(g, experts, capacity)

    def dispatch(op: Op, x: Any, table: Any) -> Any:
        hot = (table.unsqueeze(-1) == torch.arange(x.shape[1])).to(x.dtype)
        return torch.einsum("gect,gtm->egcm", hot, x)

    def expert_matmul(op: Op, x: Any, w: Any) -> Any:
        w = w.transpose(1, 2) if op.attr("transpose_b") else w
        return torch.einsum("e...k,ekn->e...n", x, w)

    def combine(op: Op, y: Any, routes: Any, weights: Any) -> Any:
        e, g, c, n = y.shape
        flat = y.permute(1, 0, 2, 3).reshape(g, e * c, n)
        hot = (routes.unsqueeze(-1) == torch.arange(e * c)).to(y.dtype)
        return torch.einsum("gtks,gtk,gsn->gtn", hot, weights.to(y.dtype), flat)

    return _table(topk_ids, topk_weights, route, slots, dispatch, expert_matmul, combine)
