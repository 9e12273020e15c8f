"""Mixture-of-Experts models: a GShard/Mixtral-style layer and a DeepSeek-style fine-grained MoE.

Both route with the catalogue's MoE kinds (`shardplan.ir.catalogue_moe`): each sequence of the
batch is one routing group (g = batch, t = seq), the router's softmax picks the top-k experts of
every token, expert e takes at most `capacity = ceil(capacity_factor * seq * top_k / experts)`
tokens per sequence, and the experts are one `expert_matmul` per projection over a stacked
[experts, out, in] weight. Building is O(layers).
"""

from __future__ import annotations

import math

from shardplan.errors import IRError
from shardplan.ir.graph import Graph, GraphBuilder
from shardplan.zoo.layers import attention, dense, layer_norm, lm_loss, swiglu, token_embedding


def capacity(tokens: int, experts: int, top_k: int, capacity_factor: float) -> int:
    """Slots per expert and group: ceil(capacity_factor * tokens * top_k / experts), >= 1."""
    return max(1, math.ceil(capacity_factor * tokens * top_k / experts))


def _expert_matmul(
    b: GraphBuilder, x: str, weight: str, shape: tuple[int, int, int], name: str
) -> str:
    """Dispatched tokens `x` [e, .., in] through the stacked expert weight [e, out, in]."""
    return b.apply("expert_matmul", x, b.param(weight, shape), transpose_b=True, name=name)


def moe_block(
    b: GraphBuilder,
    x: str,
    experts: int,
    top_k: int,
    ffn: int,
    name: str,
    capacity_factor: float = 1.0,
    gated: bool = False,
    normalize: bool = False,
    router: str = "softmax",
) -> str:
    """Routed experts on `x` [batch, seq, hidden]: router, top-k, dispatch, experts, combine.

    `gated`: SwiGLU experts (gate, up, down); else fc -> gelu -> proj. `router`: the
    elementwise-or-softmax scoring of the router logits ("softmax", or "sigmoid" as DeepSeek-V3).
    """
    batch, seq, hidden = b.shape(x)
    if not 1 <= top_k <= experts:
        raise IRError(f"{name}: top_k={top_k} must be between 1 and experts={experts}")
    cap = capacity(seq, experts, top_k, capacity_factor)
    route = {"experts": experts, "capacity": cap}
    with b.scope(name):
        logits = dense(b, x, experts, "router", bias=False)
        if router == "softmax":
            probs = b.apply("softmax", logits, name="probs")
        else:
            probs = b.apply(router, logits, name="probs")
        ids = b.apply("moe_topk_ids", probs, k=top_k, name="topk_ids")
        weights = b.apply(
            "moe_topk_weights", probs, k=top_k, normalize=normalize, name="topk_weights"
        )
        slots = b.apply("moe_slots", ids, **route, name="slots")
        routes = b.apply("moe_route", ids, **route, name="routes")
        tokens = b.apply("moe_dispatch", x, slots, name="dispatch")
        if gated:
            gate = _expert_matmul(b, tokens, "w_gate", (experts, ffn, hidden), "expert_gate")
            up = _expert_matmul(b, tokens, "w_up", (experts, ffn, hidden), "expert_up")
            h = b.apply("mul", b.apply("silu", gate, name="expert_act"), up, name="expert_glu")
        else:
            h = _expert_matmul(b, tokens, "w1", (experts, ffn, hidden), "expert_fc")
            h = b.apply("gelu", h, name="expert_act")
        h = _expert_matmul(b, h, "w2", (experts, hidden, ffn), "expert_proj")
        return b.apply("moe_combine", h, routes, weights, name="combine")


def routed_mlp(
    b: GraphBuilder,
    x: str,
    experts: int,
    top_k: int,
    expert_ffn: int,
    shared: int,
    capacity_factor: float,
    router: str = "softmax",
) -> str:
    """A fine-grained MoE MLP (DeepSeek-MoE/V3, Qwen3-MoE, Mixtral when `shared` is 0): routed
    SwiGLU experts "experts" with renormalised top-k weights, plus `shared` always-on experts as
    one SwiGLU MLP "shared" of width shared * expert_ffn."""
    out = moe_block(
        b,
        x,
        experts,
        top_k,
        expert_ffn,
        "experts",
        capacity_factor,
        gated=True,
        normalize=True,
        router=router,
    )
    if not shared:
        return out
    return b.apply("add", out, swiglu(b, x, shared * expert_ffn, "shared"), name="shared_add")


def moe(
    batch: int = 8,
    seq: int = 1024,
    hidden: int = 1024,
    heads: int = 16,
    experts: int = 8,
    ffn: int = 4096,
    top_k: int = 2,
    capacity_factor: float = 1.0,
    name: str = "moe",
) -> Graph:
    """One Mixture-of-Experts transformer layer: attention, then top-k routed gelu experts.

    Regression loss (mean squared error against a `target` input) as in the original zoo entry.
    """
    if hidden % heads:
        raise IRError(f"hidden size {hidden} is not divisible by {heads} heads")
    b = GraphBuilder(name)
    x = b.input("x", (batch, seq, hidden))
    target = b.input("target", (batch, seq, hidden))
    h = attention(b, layer_norm(b, x, "ln_1"), heads, "attn", causal=True)
    x = b.apply("add", x, h, name="residual_1")
    out = moe_block(b, layer_norm(b, x, "ln_2"), experts, top_k, ffn, "moe", capacity_factor)
    x = b.apply("add", x, out, name="residual_2")
    diff = b.apply("sub", x, target, name="error")
    b.apply("reduce_mean", b.apply("mul", diff, diff, name="square"), name="loss")
    return b.build()


def deepseek_moe(
    batch: int = 8,
    seq: int = 1024,
    layers: int = 4,
    hidden: int = 2048,
    heads: int = 16,
    vocab: int = 32000,
    experts: int = 64,
    top_k: int = 6,
    expert_ffn: int = 1408,
    shared: int = 2,
    capacity_factor: float = 1.25,
    name: str = "deepseek-moe",
) -> Graph:
    """DeepSeek-MoE-style decoder: many small SwiGLU experts (top-k, renormalised weights) plus
    `shared` always-on experts (one SwiGLU MLP of width shared * expert_ffn), RMSNorm, tied-free
    LM head and a cross-entropy loss."""
    if hidden % heads:
        raise IRError(f"hidden size {hidden} is not divisible by {heads} heads")
    b = GraphBuilder(name)
    x, labels, _ = token_embedding(b, batch, seq, vocab, hidden)
    for i in range(layers):
        with b.scope(f"layer.{i}"):
            h = attention(b, layer_norm(b, x, "ln_1", rms=True), heads, "attn", causal=True)
            x = b.apply("add", x, h, name="residual_1")
            y = layer_norm(b, x, "ln_2", rms=True)
            routed = routed_mlp(b, y, experts, top_k, expert_ffn, shared, capacity_factor)
            x = b.apply("add", x, routed, name="residual_2")
    return lm_loss(b, x, labels, vocab, "ln_f")
