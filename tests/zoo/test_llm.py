"""Today's LLMs in the zoo: published parameter counts (total and activated), forward FLOPs per
token against 2 N(activated) + the attention term, and the tiny Llama against HF's Llama."""

from __future__ import annotations

from collections import Counter

import pytest

from shardplan.errors import ArgumentError, IRError
from shardplan.ir import verify
from shardplan.zoo import MODELS, build
from shardplan.zoo.llm import activated_params

NAMED = ["llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b", "mixtral-8x22b",
         "deepseek-v3", "qwen3-32b", "qwen3-235b-a22b"]
MOE = [n for n in NAMED if MODELS[n].published_active is not None]
MATMULS = ("linear", "bmm", "expert_matmul")


@pytest.fixture(scope="module")
def full():
    """Each named model at its published size, batch 1 (building is metadata only)."""
    return {n: build(n, batch=1) for n in NAMED}


@pytest.mark.parametrize("name", NAMED)
def test_total_parameters_within_one_percent_of_published(full, name):
    published = MODELS[name].published_params
    assert full[name].num_params == pytest.approx(published, rel=0.01)


@pytest.mark.parametrize("name", MOE)
def test_activated_parameters_within_one_percent_of_published(full, name):
    # counted as the publisher counts: DeepSeek leaves the input embedding out (entries_llm)
    entry, graph = MODELS[name], full[name]
    active = activated_params(graph, embedding=entry.active_with_embedding)
    assert active == pytest.approx(entry.published_active, rel=0.01)
    assert active < graph.num_params


def test_activated_parameters_count_the_embedding_only_when_asked(full):
    graph = full["deepseek-v3"]
    embed = graph.tensor("embed").numel
    assert activated_params(graph) - activated_params(graph, embedding=False) == embed
    # the technical report's headline "37B" is the same count to two digits
    assert round(activated_params(graph, embedding=False) / 1e9) == 37
    # an untied LM head is a matmul, not a lookup: it stays in both counts
    assert not MODELS["deepseek-v3"].active_with_embedding
    tied = build("llama", small=True, tied=True)
    assert activated_params(tied, embedding=False) == tied.num_params


@pytest.mark.parametrize(
    "name, published",
    # Qwen's model cards (huggingface.co/Qwen/Qwen3-32B, /Qwen3-235B-A22B): "Number of Parameters
    # (Non-Embedding)" 31.2B and 234B, i.e. without the embedding table and the untied LM head
    [("qwen3-32b", 31.2e9), ("qwen3-235b-a22b", 234e9)],
)
def test_non_embedding_parameters_within_one_percent_of_published(full, name, published):
    graph = full[name]
    tables = graph.tensor("embed").numel + graph.tensor("lm_head.weight").numel
    assert graph.num_params - tables == pytest.approx(published, rel=0.01)


def test_dense_models_activate_every_parameter(full):
    assert activated_params(full["llama3-8b"]) == full["llama3-8b"].num_params


def _attention_flops_per_token(cfg: dict) -> float:
    """Scores and context matmuls over the full seq x seq matrix: 2 s H (d_qk + d_v) per layer."""
    heads, seq = cfg["heads"], cfg["seq"]
    if cfg.get("q_rank"):
        d_qk, d_v = cfg["nope_dim"] + cfg["rope_dim"], cfg["v_dim"]
    else:
        d_qk = d_v = cfg.get("head_dim") or cfg["hidden"] // heads
    return cfg["layers"] * 2 * seq * heads * (d_qk + d_v)


@pytest.mark.parametrize("name", NAMED)
def test_forward_flops_per_token_are_2n_activated_plus_attention(full, name):
    graph, cfg = full[name], dict(MODELS[name].defaults)
    tokens = cfg["seq"]  # batch 1
    embed = graph.tensor("embed").numel  # a lookup, not a matmul
    norms = sum(graph.tensors[op.inputs[1]].numel for op in graph.ops if op.kind == "rms_norm")
    expected = 2 * (activated_params(graph) - embed - norms) + _attention_flops_per_token(cfg)
    matmul = sum(op.flops for op in graph.ops if op.kind in MATMULS) / tokens
    assert matmul == pytest.approx(expected, rel=1e-6)
    # norms, RoPE, softmax, SwiGLU products, routing and the loss add little on top
    assert graph.flops / tokens == pytest.approx(expected, rel=0.02)
    assert graph.flops / tokens > expected


def test_gqa_keeps_kv_heads_and_qwen3_sets_head_dim(full):
    g = full["llama3-70b"]
    assert g.tensor("layers.0.attn.k.weight").shape == (8 * 128, 8192)
    assert g.tensor("layers.0.attn.q.weight").shape == (64 * 128, 8192)
    q = full["qwen3-32b"]
    assert q.tensor("layers.0.attn.q.weight").shape == (64 * 128, 5120)
    assert q.tensor("layers.0.attn.q_norm.weight").shape == (128,)


def test_deepseek_v3_structure(full):
    g = full["deepseek-v3"]
    layers_with_experts = {op.layer for op in g.ops if op.kind == "expert_matmul"}
    assert len(layers_with_experts) == 61 - 3  # the first 3 layers are dense
    assert "layers.2.mlp.gate.weight" in g.tensors and "layers.3.mlp.gate.weight" not in g.tensors
    assert g.tensor("layers.3.experts.w_gate").shape == (256, 2048, 7168)
    assert g.tensor("layers.3.shared.gate.weight").shape == (2048, 7168)
    assert g.tensor("layers.0.attn.q_a.weight").shape == (1536, 7168)
    assert g.tensor("layers.0.attn.kv_a.weight").shape == (512, 7168)
    assert {op.kind for op in g.ops if op.name.endswith("experts.probs")} == {"sigmoid"}


@pytest.mark.parametrize("name", ["llama", "moe-llm", *NAMED])
def test_small_sizes_build_and_verify(name):
    graph = build(name, small=True)
    assert verify(graph) is graph
    assert graph.tensor("input_ids").shape == (2, 16)


def test_family_options_are_checked():
    with pytest.raises(ArgumentError, match="router must be 'softmax' or 'sigmoid'"):
        build("moe-llm", small=True, router="relu")
    with pytest.raises(ArgumentError, match="qk_norm must be a bool"):
        build("llama", small=True, qk_norm=1)
    with pytest.raises(IRError, match="not a multiple of kv_heads=3"):
        build("llama", small=True, kv_heads=3)
    assert build("moe-llm", small=True, dense_layers=0, shared=0).num_params > 0


def test_tiny_zoo_llama_equals_the_hf_llama_module():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from shardplan.importers import import_torch

    small = dict(MODELS["llama"].small)
    config = transformers.LlamaConfig(
        hidden_size=small["hidden"], intermediate_size=small["ffn"],
        num_hidden_layers=small["layers"], num_attention_heads=small["heads"],
        num_key_value_heads=small["kv_heads"], vocab_size=small["vocab"],
        max_position_embeddings=64, use_cache=False, tie_word_embeddings=False,
    )
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    module = transformers.LlamaForCausalLM(config).eval()
    ids = torch.zeros((small["batch"], small["seq"]), dtype=torch.long)
    with torch.no_grad():
        hf = import_torch(module, (ids,), {"use_cache": False, "labels": ids}).graph
    zoo = build("llama", small=True)
    assert zoo.num_params == hf.num_params == sum(p.numel() for p in module.parameters())

    def heavy(graph):
        counts, flops = Counter(), Counter()
        for op in graph.ops:
            if op.kind in ("linear", "bmm", "embedding"):
                counts[op.kind] += 1
                flops[op.kind] += op.flops
        return counts, flops

    assert heavy(zoo) == heavy(hf)
    # the rest (RMSNorm, RoPE, softmax, loss) is decomposed differently by torch.export
    assert zoo.flops == pytest.approx(hf.flops, rel=0.02)
