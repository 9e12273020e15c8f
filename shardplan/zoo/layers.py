"""Layer helpers shared by the zoo builders: each adds parameters and catalogue ops to a builder."""

from __future__ import annotations

from shardplan.errors import ArgumentError
from shardplan.ir.graph import Graph, GraphBuilder

ATTENTION = ("unfused", "fused")
"""How the zoo writes attention: "unfused" as five ops (score matmul, scale, mask, softmax, value
matmul; Megatron-LM 2021-22, the published runs the model is checked on), or "fused" as one
`attention` op (FlashAttention and its kin, `ir/catalogue_attention.py`)."""


def fused_attention(model: str, attention: str) -> bool:
    """Whether a zoo builder's `attention` option asks for the fused kind; ArgumentError else."""
    if attention not in ATTENTION:
        raise ArgumentError(
            f"model {model!r}: attention must be one of {list(ATTENTION)}, got {attention!r}"
        )
    return attention == "fused"


def dense(b: GraphBuilder, x: str, out_features: int, name: str, bias: bool = True) -> str:
    """nn.Linear: weight [out, in] (+ bias [out])."""
    in_features = b.shape(x)[-1]
    with b.scope(name):
        w = b.param("weight", (out_features, in_features))
        y = b.apply("linear", x, w, name="linear")
        if bias:
            y = b.apply("bias_add", y, b.param("bias", (out_features,)), name="bias_add")
    return y


def layer_norm(b: GraphBuilder, x: str, name: str, rms: bool = False) -> str:
    h = b.shape(x)[-1]
    with b.scope(name):
        gamma = b.param("weight", (h,))
        if rms:
            return b.apply("rms_norm", x, gamma, name="norm")
        return b.apply("layer_norm", x, gamma, b.param("bias", (h,)), name="norm")


def attention(
    b: GraphBuilder, x: str, heads: int, name: str, causal: bool, fused: bool = False
) -> str:
    """Multi-head self-attention with separate q/k/v projections (same parameters as fused qkv);
    `fused`: one `attention` op in place of scores, scale, mask, softmax and context."""
    batch, seq, hidden = b.shape(x)
    head_dim = hidden // heads
    with b.scope(name):

        def split_heads(t: str, tag: str) -> str:
            t = b.apply("reshape", t, shape=(batch, seq, heads, head_dim), name=f"{tag}_split")
            return b.apply("transpose", t, perm=(0, 2, 1, 3), name=f"{tag}_heads")

        q = split_heads(dense(b, x, hidden, "q"), "q")
        k = split_heads(dense(b, x, hidden, "k"), "k")
        v = split_heads(dense(b, x, hidden, "v"), "v")
        if fused:
            mask = [b.constant("causal_mask", (seq, seq))] if causal else []
            ctx = b.apply("attention", q, k, v, *mask, scale=head_dim**-0.5, name="attention")
        else:
            scores = b.apply("bmm", q, k, transpose_b=True, name="scores")
            scores = b.apply("scale", scores, value=head_dim**-0.5, name="scale")
            if causal:
                mask = b.constant("causal_mask", (seq, seq))
                scores = b.apply("add", scores, mask, name="mask")
            probs = b.apply("softmax", scores, axis=-1, name="softmax")
            ctx = b.apply("bmm", probs, v, name="context")
        ctx = b.apply("transpose", ctx, perm=(0, 2, 1, 3), name="merge_t")
        ctx = b.apply("reshape", ctx, shape=(batch, seq, hidden), name="merge")
        return dense(b, ctx, hidden, "out")


def mlp_block(b: GraphBuilder, x: str, ffn: int, name: str, act: str = "gelu") -> str:
    hidden = b.shape(x)[-1]
    with b.scope(name):
        h = dense(b, x, ffn, "fc")
        h = b.apply(act, h, name="act")
        return dense(b, h, hidden, "proj")


def transformer_block(
    b: GraphBuilder,
    x: str,
    heads: int,
    ffn: int,
    name: str,
    causal: bool,
    pre_norm: bool = True,
    fused: bool = False,
) -> str:
    """Pre-norm (GPT, ViT) or post-norm (BERT) transformer layer (`fused`: `attention`'s)."""
    with b.scope(name):
        if pre_norm:
            h = attention(b, layer_norm(b, x, "ln_1"), heads, "attn", causal, fused)
            x = b.apply("add", x, h, name="residual_1")
            h = mlp_block(b, layer_norm(b, x, "ln_2"), ffn, "mlp")
            return b.apply("add", x, h, name="residual_2")
        h = attention(b, x, heads, "attn", causal, fused)
        x = layer_norm(b, b.apply("add", x, h, name="residual_1"), "ln_1")
        h = mlp_block(b, x, ffn, "mlp")
        return layer_norm(b, b.apply("add", x, h, name="residual_2"), "ln_2")


def swiglu(b: GraphBuilder, x: str, ffn: int, name: str) -> str:
    """SwiGLU MLP (Llama, Mixtral, DeepSeek): down(silu(gate(x)) * up(x)), no biases."""
    hidden = b.shape(x)[-1]
    with b.scope(name):
        gate = b.apply("silu", dense(b, x, ffn, "gate", bias=False), name="act")
        h = b.apply("mul", gate, dense(b, x, ffn, "up", bias=False), name="glu")
        return dense(b, h, hidden, "down", bias=False)


def token_embedding(
    b: GraphBuilder, batch: int, seq: int, vocab: int, hidden: int
) -> tuple[str, str, str]:
    """Decoder inputs: int32 `input_ids` and `labels` [batch, seq] and the `embed` table
    [vocab, hidden]; returns (embedded tokens, labels, table)."""
    ids = b.input("input_ids", (batch, seq), dtype_bytes=4)
    labels = b.input("labels", (batch, seq), dtype_bytes=4)
    table = b.param("embed", (vocab, hidden))
    return b.apply("embedding", table, ids, name="lookup"), labels, table


def lm_loss(
    b: GraphBuilder, x: str, labels: str, vocab: int, norm: str, tied: str | None = None
) -> Graph:
    """Final RMSNorm `norm`, LM head (the embedding table `tied` when given, else an untied
    `lm_head` weight) and the cross-entropy loss; returns the built graph."""
    x = layer_norm(b, x, norm, rms=True)
    if tied is not None:
        logits = b.apply("linear", x, tied, name="lm_head")
    else:
        logits = dense(b, x, vocab, "lm_head", bias=False)
    b.apply("cross_entropy", logits, labels, name="loss")
    return b.build()
