"""Transformer models: GPT-2/GPT-3 (decoder, tied LM head), BERT (encoder), ViT (MoE: `moe.py`)."""

from __future__ import annotations

from shardplan.errors import IRError
from shardplan.ir.graph import Graph, GraphBuilder
from shardplan.zoo.layers import dense, fused_attention, layer_norm, transformer_block


def _check_heads(hidden: int, heads: int) -> None:
    if hidden % heads:
        raise IRError(f"hidden size {hidden} is not divisible by {heads} heads")


def gpt(
    batch: int = 8,
    seq: int = 1024,
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    vocab: int = 50257,
    max_positions: int | None = None,
    attention: str = "unfused",
    name: str = "gpt",
) -> Graph:
    """GPT-2/GPT-3 style decoder: token + position embeddings, pre-norm blocks, tied head;
    `attention` "unfused" or "fused" (`layers.ATTENTION`)."""
    _check_heads(hidden, heads)
    fused = fused_attention(name, attention)
    b = GraphBuilder(name)
    ids = b.input("input_ids", (batch, seq), dtype_bytes=4)
    positions = b.input("position_ids", (batch, seq), dtype_bytes=4)
    labels = b.input("labels", (batch, seq), dtype_bytes=4)
    wte = b.param("wte", (vocab, hidden))
    wpe = b.param("wpe", (max_positions or max(seq, 1024), hidden))
    x = b.apply(
        "add",
        b.apply("embedding", wte, ids, name="tok_emb"),
        b.apply("embedding", wpe, positions, name="pos_emb"),
        name="emb",
    )
    for i in range(layers):
        x = transformer_block(b, x, heads, 4 * hidden, f"h.{i}", causal=True, fused=fused)
    x = layer_norm(b, x, "ln_f")
    logits = b.apply("linear", x, wte, name="lm_head")
    b.apply("cross_entropy", logits, labels, name="loss")
    return b.build()


def bert(
    batch: int = 8,
    seq: int = 512,
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    vocab: int = 30522,
    max_positions: int = 512,
    classes: int = 2,
    attention: str = "unfused",
    name: str = "bert",
) -> Graph:
    """BERT encoder: word/position/type embeddings, post-norm blocks, pooler, head; `attention`
    "unfused" or "fused" (`layers.ATTENTION`)."""
    _check_heads(hidden, heads)
    fused = fused_attention(name, attention)
    b = GraphBuilder(name)
    ids = b.input("input_ids", (batch, seq), dtype_bytes=4)
    positions = b.input("position_ids", (batch, seq), dtype_bytes=4)
    types = b.input("token_type_ids", (batch, seq), dtype_bytes=4)
    labels = b.input("labels", (batch,), dtype_bytes=4)
    with b.scope("embeddings"):
        x = b.apply("embedding", b.param("word", (vocab, hidden)), ids, name="word_emb")
        x = b.apply(
            "add",
            x,
            b.apply(
                "embedding", b.param("position", (max_positions, hidden)), positions, name="pos_emb"
            ),
            name="add_pos",
        )
        x = b.apply(
            "add",
            x,
            b.apply("embedding", b.param("token_type", (2, hidden)), types, name="type_emb"),
            name="add_type",
        )
    x = layer_norm(b, x, "embeddings.ln")
    for i in range(layers):
        x = transformer_block(
            b, x, heads, 4 * hidden, f"layer.{i}", causal=False, pre_norm=False, fused=fused
        )
    # the pooler reads the first token; a mean over tokens keeps the graph slice-free (same params)
    pooled = b.apply("reduce_mean", x, axes=(1,), name="pool")
    pooled = b.apply("tanh", dense(b, pooled, hidden, "pooler"), name="pooler_act")
    logits = dense(b, pooled, classes, "classifier")
    b.apply("cross_entropy", logits, labels, name="loss")
    return b.build()


def vit(
    batch: int = 8,
    image: int = 224,
    patch: int = 16,
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    classes: int = 1000,
    attention: str = "unfused",
    name: str = "vit",
) -> Graph:
    """ViT: patch conv, class token, position embeddings, pre-norm blocks, head on the class token
    (read as a mean over tokens so the graph stays slice-free; the parameters are ViT's);
    `attention` "unfused" or "fused" (`layers.ATTENTION`)."""
    _check_heads(hidden, heads)
    fused = fused_attention(name, attention)
    if image % patch:
        raise IRError(f"image size {image} is not a multiple of patch size {patch}")
    b = GraphBuilder(name)
    pixels = b.input("pixels", (batch, 3, image, image))
    labels = b.input("labels", (batch,), dtype_bytes=4)
    grid = image // patch
    tokens = grid * grid
    with b.scope("patch"):
        x = b.apply(
            "conv2d",
            pixels,
            b.param("weight", (hidden, 3, patch, patch)),
            stride=patch,
            name="conv",
        )
        x = b.apply("bias_add", x, b.param("bias", (hidden,)), axis=1, name="bias_add")
    x = b.apply("reshape", x, shape=(batch, hidden, tokens), name="flatten")
    x = b.apply("transpose", x, perm=(0, 2, 1), name="to_tokens")
    cls = b.apply(
        "add",
        b.constant("zeros", (batch, 1, hidden)),
        b.param("cls", (1, 1, hidden)),
        name="cls_expand",
    )
    x = b.apply("concat", cls, x, axis=1, name="cat_cls")
    x = b.apply("add", x, b.param("pos", (1, tokens + 1, hidden)), name="add_pos")
    for i in range(layers):
        x = transformer_block(b, x, heads, 4 * hidden, f"block.{i}", causal=False, fused=fused)
    x = layer_norm(b, x, "ln")
    x = b.apply("reduce_mean", x, axes=(1,), name="pool")
    logits = dense(b, x, classes, "head")
    b.apply("cross_entropy", logits, labels, name="loss")
    return b.build()


def mlp(batch: int = 256, sizes: tuple[int, ...] = (784, 512, 512, 10), name: str = "mlp") -> Graph:
    """Plain MLP: dense + ReLU layers, a classification loss."""
    b = GraphBuilder(name)
    x = b.input("x", (batch, sizes[0]))
    labels = b.input("labels", (batch,), dtype_bytes=4)
    for i, width in enumerate(sizes[1:]):
        x = dense(b, x, width, f"fc{i}")
        if i < len(sizes) - 2:
            x = b.apply("relu", x, name=f"relu{i}")
    b.apply("cross_entropy", x, labels, name="loss")
    return b.build()


def sapp_tutorial(batch: int = 256, name: str = "sapp-mlp") -> Graph:
    """MindSpore's SAPP tutorial network: Flatten -> Dense 784->512 -> ReLU -> Dense 512->512 ->
    ReLU -> Dense 512->1 (reference-drec.md §9.2 A), images [b, 1, 28, 28]."""
    b = GraphBuilder(name)
    x = b.input("image", (batch, 1, 28, 28))
    x = b.apply("reshape", x, shape=(batch, 784), name="flatten")
    x = b.apply("relu", dense(b, x, 512, "dense1"), name="relu1")
    x = b.apply("relu", dense(b, x, 512, "dense2"), name="relu2")
    dense(b, x, 1, "dense3")
    return b.build()


def wide_deep(
    batch: int = 2048,
    fields: int = 26,
    vocab: int = 100_000,
    embed: int = 32,
    dense_features: int = 13,
    deep: tuple[int, ...] = (1024, 512, 256),
    name: str = "wide-deep",
) -> Graph:
    """Wide&Deep (Criteo-style): per-field embeddings + a deep MLP, plus a wide linear part."""
    b = GraphBuilder(name)
    labels = b.input("labels", (batch,), dtype_bytes=4)
    dense_x = b.input("dense_x", (batch, dense_features))
    embs = []
    for f in range(fields):
        ids = b.input(f"ids_{f}", (batch,), dtype_bytes=4)
        embs.append(
            b.apply("embedding", b.param(f"emb_{f}", (vocab, embed)), ids, name=f"lookup_{f}")
        )
    x = b.apply("concat", *embs, dense_x, axis=1, name="concat")
    for i, width in enumerate(deep):
        x = b.apply("relu", dense(b, x, width, f"deep{i}"), name=f"deep_relu{i}")
    deep_logits = dense(b, x, 2, "deep_out")
    wide_logits = dense(b, dense_x, 2, "wide")
    logits = b.apply("add", deep_logits, wide_logits, name="logits")
    b.apply("cross_entropy", logits, labels, name="loss")
    return b.build()
