"""Today's decoder LLMs: the Llama family (Llama 3, Qwen3 dense) and MoE LLMs (Mixtral,
DeepSeek-V3, Qwen3-MoE), built from their published configuration fields.

Operators are the ones the models run, each a catalogue kind:
- RMSNorm (`rms_norm`) before attention and MLP, on the final hidden state, and on q/k per head
  when `qk_norm` (Qwen3);
- grouped-query attention: q has `heads` heads, k/v have `kv_heads`; the `heads // kv_heads`
  query heads of a group are stacked along the sequence so each group's scores are one `bmm`
  against its own K/V ([b, kv, group*s, d] x [b, kv, s, d]^T), the FLOPs of the repeated-K/V form
  without copying K/V;
- RoPE as elementwise work: x*cos + rotate_half(x)*sin, rotate_half an `einsum` of the head dim
  viewed as [2, d/2] with the constant [[0, 1], [-1, 0]] (exact, slice-free);
- SwiGLU MLPs: three matmuls (gate, up, down), silu and a product;
- multi-head latent attention (DeepSeek-V2/V3) when `q_rank` > 0: low-rank q (hidden -> q_rank,
  RMSNorm, -> heads x (nope + rope)) and a compressed KV (hidden -> kv_rank, RMSNorm, -> heads x
  (nope + v)) plus one shared RoPE key (hidden -> rope_dim) added to every head; the published
  fused projections are written as two matmuls each (same parameters and FLOPs, no slicing);
- routed experts through `moe.routed_mlp` (softmax or sigmoid router, top-k, renormalised
  weights), `shared` always-on experts as one SwiGLU MLP of width shared * expert_ffn, and the
  first `dense_layers` layers dense with width `ffn`.
Untied LM head (`tied` reuses the embedding table), cross-entropy loss. Building is O(layers).
"""

from __future__ import annotations

from collections.abc import Callable

from shardplan.errors import ArgumentError, IRError
from shardplan.ir.graph import Graph, GraphBuilder
from shardplan.ir.op import Role
from shardplan.ir.traits import traits_of
from shardplan.zoo.layers import (
    dense,
    fused_attention,
    layer_norm,
    lm_loss,
    swiglu,
    token_embedding,
)
from shardplan.zoo.moe import routed_mlp


def _rope(b: GraphBuilder, x: str, name: str) -> str:
    """x [b, h, s, d] rotated: x * cos + rotate_half(x) * sin (cos/sin [s, d] constants)."""
    batch, heads, seq, dim = b.shape(x)
    if dim % 2:
        raise IRError(f"{name}: RoPE needs an even head dim, got {dim}")
    cos, sin = (
        _shared_constant(b, "rope_cos", (seq, dim)),
        _shared_constant(b, "rope_sin", (seq, dim)),
    )
    rot = _shared_constant(b, "rope_rotate_half", (2, 2))
    halves = b.apply("reshape", x, shape=(batch, heads, seq, 2, dim // 2), name=f"{name}_halves")
    turned = b.apply("einsum", halves, rot, spec="b h s t d, t u -> b h s u d", name=f"{name}_rot")
    turned = b.apply("reshape", turned, shape=(batch, heads, seq, dim), name=f"{name}_rotated")
    return b.apply(
        "add",
        b.apply("mul", x, cos, name=f"{name}_cos"),
        b.apply("mul", turned, sin, name=f"{name}_sin"),
        name=f"{name}_rope",
    )


def _shared_constant(
    b: GraphBuilder, name: str, shape: tuple[int, ...], batched: bool = False
) -> str:
    """One graph-level constant per name and shape, read by every layer; `batched`: its leading
    dim is the batch, left out of the name, so the graph's names are the same at every batch size
    (the training search then derives the model at other micro-batch sizes: ir/rebatch.py)."""
    named = shape[1:] if batched else shape
    return b.shared_constant(f"{name}_{'x'.join(map(str, named))}", shape)


def _heads(b: GraphBuilder, x: str, heads: int, dim: int, name: str) -> str:
    """[b, s, heads*dim] -> [b, heads, s, dim]."""
    batch, seq, _ = b.shape(x)
    x = b.apply("reshape", x, shape=(batch, seq, heads, dim), name=f"{name}_split")
    return b.apply("transpose", x, perm=(0, 2, 1, 3), name=f"{name}_heads")


def _attend(b: GraphBuilder, q: str, k: str, v: str, hidden: int, fused: bool = False) -> str:
    """Causal softmax attention of q [b, H, s, dqk] over k/v [b, KV, s, d*] (H = KV * group),
    projected back to `hidden` by `o`; `fused`: one `attention` op, the group a dim of q."""
    batch, heads, seq, dqk = b.shape(q)
    kv, dv = b.shape(k)[1], b.shape(v)[-1]
    group = heads // kv
    if fused:
        q = b.apply("reshape", q, shape=(batch, kv, group, seq, dqk), name="q_groups")
        mask = _shared_constant(b, "causal_mask", (seq, seq))
        ctx = b.apply("attention", q, k, v, mask, scale=dqk**-0.5, name="attention")
    else:
        q = b.apply("reshape", q, shape=(batch, kv, group * seq, dqk), name="q_groups")
        scores = b.apply("bmm", q, k, transpose_b=True, name="scores")
        scores = b.apply("scale", scores, value=dqk**-0.5, name="scale")
        mask = _shared_constant(b, "causal_mask", (group * seq, seq))
        scores = b.apply("add", scores, mask, name="mask")
        ctx = b.apply("bmm", b.apply("softmax", scores, axis=-1, name="softmax"), v, name="context")
    ctx = b.apply("reshape", ctx, shape=(batch, heads, seq, dv), name="ungroup")
    ctx = b.apply("transpose", ctx, perm=(0, 2, 1, 3), name="merge_t")
    ctx = b.apply("reshape", ctx, shape=(batch, seq, heads * dv), name="merge")
    return dense(b, ctx, hidden, "o", bias=False)


def gqa_attention(
    b: GraphBuilder,
    x: str,
    heads: int,
    kv_heads: int,
    head_dim: int,
    qk_norm: bool,
    name: str,
    fused: bool = False,
) -> str:
    """Grouped-query attention with RoPE (module docstring)."""
    hidden = b.shape(x)[-1]
    with b.scope(name):
        q = _heads(b, dense(b, x, heads * head_dim, "q", bias=False), heads, head_dim, "q")
        k = _heads(b, dense(b, x, kv_heads * head_dim, "k", bias=False), kv_heads, head_dim, "k")
        v = _heads(b, dense(b, x, kv_heads * head_dim, "v", bias=False), kv_heads, head_dim, "v")
        if qk_norm:
            q, k = layer_norm(b, q, "q_norm", rms=True), layer_norm(b, k, "k_norm", rms=True)
        return _attend(b, _rope(b, q, "q"), _rope(b, k, "k"), v, hidden, fused)


def mla_attention(
    b: GraphBuilder,
    x: str,
    heads: int,
    q_rank: int,
    kv_rank: int,
    nope_dim: int,
    rope_dim: int,
    v_dim: int,
    name: str,
    fused: bool = False,
) -> str:
    """Multi-head latent attention (DeepSeek-V2/V3; module docstring)."""
    batch, seq, hidden = b.shape(x)
    with b.scope(name):
        cq = layer_norm(b, dense(b, x, q_rank, "q_a", bias=False), "q_a_norm", rms=True)
        q_nope = _heads(
            b, dense(b, cq, heads * nope_dim, "q_b_nope", bias=False), heads, nope_dim, "q_nope"
        )
        q_pe = _heads(
            b, dense(b, cq, heads * rope_dim, "q_b_rope", bias=False), heads, rope_dim, "q_pe"
        )
        q = b.apply("concat", q_nope, _rope(b, q_pe, "q"), axis=3, name="q_cat")
        ckv = layer_norm(b, dense(b, x, kv_rank, "kv_a", bias=False), "kv_a_norm", rms=True)
        k_pe = _heads(b, dense(b, x, rope_dim, "k_rope", bias=False), 1, rope_dim, "k_pe")
        k_pe = _rope(b, k_pe, "k")
        zeros = _shared_constant(b, "zeros", (batch, heads, seq, rope_dim), batched=True)
        k_pe = b.apply("add", zeros, k_pe, name="k_pe_every_head")  # one RoPE key for every head
        k_nope = _heads(
            b, dense(b, ckv, heads * nope_dim, "kv_b_k", bias=False), heads, nope_dim, "k_nope"
        )
        k = b.apply("concat", k_nope, k_pe, axis=3, name="k_cat")
        v = _heads(b, dense(b, ckv, heads * v_dim, "kv_b_v", bias=False), heads, v_dim, "v")
        return _attend(b, q, k, v, hidden, fused)


def _gqa(
    name: str,
    hidden: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    qk_norm: bool,
    fused: bool = False,
) -> Callable[[GraphBuilder, str], str]:
    """A layer's GQA attention "attn" for `_decoder`, after checking the head counts; `head_dim`
    0 means hidden // heads."""
    if heads % kv_heads:
        raise IRError(f"{name}: {heads} query heads are not a multiple of kv_heads={kv_heads}")
    head_dim = head_dim or hidden // heads
    return lambda b, y: gqa_attention(b, y, heads, kv_heads, head_dim, qk_norm, "attn", fused)


def _decoder(
    name: str,
    sizes: tuple[int, int, int, int],
    layers: int,
    attend: Callable[[GraphBuilder, str], str],
    mlp: Callable[[GraphBuilder, str, int], str],
    tied: bool,
) -> Graph:
    """The pre-norm decoder both families share: token embedding, `layers` x (RMSNorm ->
    `attend` -> residual, RMSNorm -> `mlp(b, y, layer)` -> residual), final RMSNorm, LM head and
    loss. `sizes` is (batch, seq, vocab, hidden)."""
    batch, seq, vocab, hidden = sizes
    b = GraphBuilder(name)
    x, labels, table = token_embedding(b, batch, seq, vocab, hidden)
    for i in range(layers):
        with b.scope(f"layers.{i}"):
            y = layer_norm(b, x, "attn_norm", rms=True)
            x = b.apply("add", x, attend(b, y), name="residual_1")
            y = layer_norm(b, x, "mlp_norm", rms=True)
            x = b.apply("add", x, mlp(b, y, i), name="residual_2")
    return lm_loss(b, x, labels, vocab, "norm", table if tied else None)


def llama(
    batch: int = 8,
    seq: int = 8192,
    layers: int = 32,
    hidden: int = 4096,
    heads: int = 32,
    kv_heads: int = 8,
    head_dim: int = 0,
    ffn: int = 14336,
    vocab: int = 128256,
    qk_norm: bool = False,
    tied: bool = False,
    attention: str = "unfused",
    name: str = "llama",
) -> Graph:
    """Llama-style decoder: RMSNorm, GQA + RoPE, SwiGLU (module docstring). `head_dim` 0 means
    hidden // heads (Qwen3 sets it apart from hidden); `attention` "unfused" or "fused"."""
    fused = fused_attention(name, attention)
    attend = _gqa(name, hidden, heads, kv_heads, head_dim, qk_norm, fused)

    def mlp(b: GraphBuilder, y: str, _layer: int) -> str:
        return swiglu(b, y, ffn, "mlp")

    return _decoder(name, (batch, seq, vocab, hidden), layers, attend, mlp, tied)


def moe_llm(
    batch: int = 8,
    seq: int = 4096,
    layers: int = 32,
    hidden: int = 4096,
    heads: int = 32,
    kv_heads: int = 8,
    head_dim: int = 0,
    ffn: int = 14336,
    experts: int = 8,
    top_k: int = 2,
    expert_ffn: int = 14336,
    shared: int = 0,
    dense_layers: int = 0,
    vocab: int = 32000,
    router: str = "softmax",
    qk_norm: bool = False,
    q_rank: int = 0,
    kv_rank: int = 512,
    nope_dim: int = 128,
    rope_dim: int = 64,
    v_dim: int = 128,
    capacity_factor: float = 1.0,
    attention: str = "unfused",
    name: str = "moe-llm",
) -> Graph:
    """MoE decoder: GQA (or MLA when `q_rank` > 0), the first `dense_layers` layers a SwiGLU of
    width `ffn`, the rest `experts` routed SwiGLU experts of width `expert_ffn` (top_k, weights
    renormalised; `router` softmax or sigmoid) plus `shared` shared experts (module docstring);
    `attention` "unfused" or "fused"."""
    if router not in ("softmax", "sigmoid"):
        raise ArgumentError(
            f"model {name!r}: router must be 'softmax' or 'sigmoid', got {router!r}"
        )
    fused = fused_attention(name, attention)
    gqa = _gqa(name, hidden, heads, kv_heads, head_dim, qk_norm, fused)

    def attend(b: GraphBuilder, y: str) -> str:
        if q_rank:
            mla = (heads, q_rank, kv_rank, nope_dim, rope_dim, v_dim)
            return mla_attention(b, y, *mla, "attn", fused)
        return gqa(b, y)

    def mlp(b: GraphBuilder, y: str, layer: int) -> str:
        if layer < dense_layers:
            return swiglu(b, y, ffn, "mlp")
        return routed_mlp(b, y, experts, top_k, expert_ffn, shared, capacity_factor, router)

    return _decoder(name, (batch, seq, vocab, hidden), layers, attend, mlp, tied=False)


def activated_params(graph: Graph, embedding: bool = True) -> int:
    """Parameters a token uses: every parameter, except that a stacked expert weight
    [experts, out, in] of a routed layer counts k/E of its size. A routed layer is one whose
    routing ops carry `k` and `experts` attributes (`shardplan.ir.catalogue_moe`). With
    `embedding=False` the tables read only by lookups (embeddings) are left out too (a token reads
    one row of them; DeepSeek counts its activated parameters this way, Mistral and Qwen do
    not: `shardplan.zoo.entries_llm`). O(ops)."""
    routing: dict[str, dict[str, int]] = {}
    for op in graph.ops:
        attrs = dict(op.attrs)
        for key in ("k", "experts"):
            if key in attrs:
                routing.setdefault(op.layer, {})[key] = attrs[key]
    idle, seen = 0.0, set()
    for op in graph.ops:
        route = routing.get(op.layer, {})
        if "k" not in route or "experts" not in route:
            continue
        for name in op.inputs:
            t = graph.tensors[name]
            if t.role is Role.PARAMETER and len(t.shape) == 3 and t.shape[0] == route["experts"]:
                if name not in seen:
                    seen.add(name)
                    idle += t.numel * (1 - route["k"] / route["experts"])
    lookups = 0 if embedding else sum(graph.tensors[n].numel for n in _lookup_tables(graph))
    return graph.num_params - round(idle) - lookups


def _lookup_tables(graph: Graph) -> set[str]:
    """Parameters only read as a lookup table: the operand whose rows (dim 0) an index input
    selects (`traits_of(kind).index`, e.g. an embedding's table), read by no op otherwise."""
    tables: set[str] = set()
    others: set[str] = set()
    for op in graph.ops:
        index = traits_of(op.kind).index
        table = op.inputs[index.bound_operand] if index and index.bound_dim == 0 else None
        tables.update({table} if table else set())
        others.update(n for n in op.inputs if n != table)
    return {n for n in tables - others if graph.tensors[n].role is Role.PARAMETER}
