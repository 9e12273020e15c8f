"""How much of today's architectures the torch importer translates, weighed by FLOPs and params.

Each architecture is built offline from its `transformers` config class (tiny sizes, random
weights, no cache; eager attention, except the vision models, which keep transformers' default
`sdpa`: ViT's becomes the fused `attention` kind), or, for the `NAME.json` rows, from the
published config file under tests/data/hf at full width with a few layers on the meta device
(no weights; the causal LM traced with labels, so the loss is imported too), and imported with
`import_torch`: first strictly (`unknown="error"`), then, if that fails, with
`unknown="replicate"` to list the opaque ops.
Columns: strict import, op count, % of graph FLOPs and % of parameters in opaque ops (an opaque
op's FLOPs are one per result element: a lower bound, since the importer cannot know the kernel),
the largest opaque ops with their FLOP share, the approximated mappings, import seconds and
D-Rec seconds (`shardplan.plan(graph, "8")`), and the CPU split of the import: torch.export,
the translation, and the translation after a full core-ATen decomposition (the old path).
FLOP-weighted coverage = 100 % - opaque FLOP share.

Run: python benchmarks/import_coverage.py [--only NAME,NAME]
Writes benchmarks/results/import_coverage.{json,md}.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import run_info, table, write  # noqa: E402

BATCH, SEQ = 2, 16
TINY = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_position_embeddings": 64,
}
ENC_DEC = {  # the tiny encoder-decoder sizes (BART, Whisper)
    "d_model": 64,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "vocab_size": 256,
}


def _ids(vocab: int = 256, seq: int = SEQ) -> Any:
    import torch

    return torch.randint(0, vocab, (BATCH, seq))


def _decoder(config: str, model: str = "", **extra: Any) -> Callable[[], tuple[Any, tuple]]:
    def build() -> tuple[Any, tuple]:
        import transformers as T

        cfg = getattr(T, config)(**{**TINY, **extra}, use_cache=False, attn_implementation="eager")
        cls = getattr(T, model or config.replace("Config", "ForCausalLM"))
        return cls(cfg), (_ids(),)

    return build


def _seq2seq(config: str, model: str, **params: Any) -> Callable[[], tuple[Any, tuple]]:
    def build() -> tuple[Any, tuple]:
        import transformers as T

        cfg = getattr(T, config)(**params, use_cache=False, attn_implementation="eager")
        return getattr(T, model)(cfg), (_ids(), None, _ids())

    return build


def _pixels(config: str, model: str, image: int = 32, **params: Any) -> Callable[[], tuple]:
    def build() -> tuple[Any, tuple]:
        import torch
        import transformers as T

        cfg = getattr(T, config)(**params, image_size=image)
        return getattr(T, model)(cfg), (torch.randn(BATCH, 3, image, image),)

    return build


def _whisper() -> tuple[Any, tuple]:
    import torch
    import transformers as T

    cfg = T.WhisperConfig(
        **ENC_DEC,
        num_mel_bins=16,
        max_source_positions=32,
        max_target_positions=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        use_cache=False,
        attn_implementation="eager",
    )
    features = torch.randn(BATCH, 16, 64)  # [batch, mel bins, frames]; frames = 2 x positions
    return T.WhisperForConditionalGeneration(cfg), (features, None, _ids(seq=8))


def _config_file(name: str, layers: int) -> Callable[[], tuple[Any, tuple]]:
    """A published config from tests/data/hf at full width, `layers` layers, on the meta device
    (causal LMs traced with labels, so the loss is in the graph)."""

    def build() -> tuple[Any, tuple]:
        from shardplan.importers.hf_config import example_inputs, load_config, meta_module

        path = Path(__file__).resolve().parent.parent / "tests" / "data" / "hf" / name
        cfg, _, arch = load_config(path, layers=layers)
        model = meta_module(cfg, arch)
        args, kwargs = example_inputs(model, cfg, BATCH, SEQ, None, labels=True)
        return model, args, kwargs

    return build


_MOE = {"num_experts_per_tok": 2}
ARCHITECTURES: tuple[tuple[str, str, Callable[[], tuple[Any, tuple]]], ...] = (
    ("llama", "dense decoder, GQA, RoPE, SwiGLU", _decoder("LlamaConfig", num_key_value_heads=2)),
    ("qwen2", "dense decoder, GQA, RoPE, SwiGLU", _decoder("Qwen2Config", num_key_value_heads=2)),
    (
        "mistral",
        "dense decoder, GQA, sliding window",
        _decoder("MistralConfig", num_key_value_heads=2),
    ),
    (
        "t5",
        "encoder-decoder",
        _seq2seq(
            "T5Config",
            "T5ForConditionalGeneration",
            d_model=64,
            d_kv=16,
            d_ff=128,
            num_layers=2,
            num_heads=4,
            vocab_size=256,
        ),
    ),
    (
        "bart",
        "encoder-decoder",
        _seq2seq(
            "BartConfig",
            "BartForConditionalGeneration",
            **ENC_DEC,
            max_position_embeddings=64,
        ),
    ),
    (
        "vit",
        "vision transformer",
        _pixels(
            "ViTConfig",
            "ViTModel",
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            patch_size=8,
        ),
    ),
    (
        "swin",
        "windowed vision transformer",
        _pixels(
            "SwinConfig",
            "SwinModel",
            embed_dim=32,
            depths=[2, 2],
            num_heads=[2, 4],
            window_size=4,
            patch_size=2,
        ),
    ),
    (
        "convnext",
        "depthwise-conv CNN",
        _pixels(
            "ConvNextConfig", "ConvNextModel", hidden_sizes=[32, 64], depths=[1, 1], num_stages=2
        ),
    ),
    (
        "mixtral",
        "MoE: 8 experts top-2 (grouped_mm)",
        _decoder("MixtralConfig", num_key_value_heads=2, num_local_experts=8, **_MOE),
    ),
    (
        "qwen2-moe",
        "MoE + shared expert",
        _decoder(
            "Qwen2MoeConfig",
            num_key_value_heads=2,
            num_experts=8,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            **_MOE,
        ),
    ),
    (
        "olmoe",
        "MoE: 8 experts top-2",
        _decoder("OlmoeConfig", num_key_value_heads=2, num_experts=8, **_MOE),
    ),
    (
        "deepseek-v3",
        "fine-grained MoE + shared experts, MLA",
        _decoder(
            "DeepseekV3Config",
            num_key_value_heads=4,
            n_routed_experts=16,
            n_shared_experts=1,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            n_group=1,
            topk_group=1,
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_rope_head_dim=8,
            qk_nope_head_dim=8,
            v_head_dim=16,
            **_MOE,
        ),
    ),
    ("mamba", "state-space model", _decoder("MambaConfig", state_size=8, expand=2, conv_kernel=4)),
    ("whisper", "speech encoder-decoder", _whisper),
    # the zoo's HF twins from their published config files: full width, a few layers, no weights
    ("llama3-8b.json", "config file, 2 layers", _config_file("llama3-8b", 2)),
    ("llama3-70b.json", "config file, 2 layers", _config_file("llama3-70b", 2)),
    ("llama3-405b.json", "config file, 2 layers", _config_file("llama3-405b", 2)),
    ("qwen3-32b.json", "config file, 2 layers", _config_file("qwen3-32b", 2)),
    ("mixtral-8x7b.json", "config file, 2 layers", _config_file("mixtral-8x7b", 2)),
    ("mixtral-8x22b.json", "config file, 2 layers", _config_file("mixtral-8x22b", 2)),
    ("deepseek-v3.json", "config file, 4 layers (3 dense)", _config_file("deepseek-v3", 4)),
    ("qwen3-235b-a22b.json", "config file, 2 layers", _config_file("qwen3-235b-a22b", 2)),
)


def _opaque_shares(result: Any) -> tuple[float, float, list[tuple[str, float]]]:
    """(% FLOPs in opaque ops, % params read only by opaque ops, [(source, % FLOPs)])."""
    from shardplan.ir.traits import OPAQUE_KIND as OPAQUE

    graph = result.graph
    total = graph.flops or 1.0
    by_source: dict[str, float] = {}
    for op in graph.ops:
        if op.kind == OPAQUE:
            source = str(dict(op.attrs).get("source", op.name))
            by_source[source] = by_source.get(source, 0.0) + op.flops
    readers: dict[str, set[str]] = {}
    for op in graph.ops:
        for t in op.inputs:
            readers.setdefault(t, set()).add(op.kind)
    opaque_params = sum(t.numel for t in graph.parameters if readers.get(t.name) == {OPAQUE})
    shares = sorted(((s, 100 * f / total) for s, f in by_source.items()), key=lambda x: -x[1])
    return (
        100 * sum(by_source.values()) / total,
        100 * opaque_params / max(graph.num_params, 1),
        shares,
    )


def _cpu(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    """fn(), its wall seconds and the CPU seconds of this process (other jobs do not inflate)."""
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - start, time.process_time() - cpu


def measure(name: str, family: str, build: Callable[[], tuple[Any, tuple]]) -> dict[str, Any]:
    import torch

    import shardplan as sp
    from shardplan.errors import ShardplanError
    from shardplan.importers import torch as importer

    torch.manual_seed(0)
    model, args, *rest = build()  # (module, args) or, for config files, (module, args, kwargs)
    kwargs = rest[0] if rest else None
    model.eval()
    row: dict[str, Any] = {
        "name": name,
        "family": family,
        "params": sum(p.numel() for p in model.parameters()),
    }
    # import_torch = export + _translate; timed apart (translation: export's IR directly when
    # every op has a rule, else after the core-ATen decomposition, which is timed on its own too)
    program, export_s, row["export_cpu_s"] = _cpu(lambda: torch.export.export(model, args, kwargs))
    policy = "error"
    try:
        result, translate_s, row["translate_cpu_s"] = _cpu(
            lambda: importer._translate(torch, program, name, "error")
        )
        row["strict"], row["strict_error"] = True, ""
    except ShardplanError as e:
        row["strict"], row["strict_error"] = False, f"{type(e).__name__}: {e}"[:300]
        policy = "replicate"
        result, translate_s, row["translate_cpu_s"] = _cpu(
            lambda: importer._translate(torch, program, name, "replicate")
        )
    row["direct"] = not importer._needs_decomposition(program, importer.aten_table())
    _, _, row["decomposed_translate_cpu_s"] = _cpu(
        lambda: importer._translate(torch, program, name, policy, decompose=True)
    )
    row["import_s"] = export_s + translate_s
    graph = result.graph
    flops_pct, params_pct, shares = _opaque_shares(result)
    row.update(
        ops=len(graph.ops),
        imported_params=graph.num_params,
        flops=graph.flops,
        opaque_ops=len(result.replicated),
        opaque_flops_pct=flops_pct,
        opaque_params_pct=params_pct,
        opaque_by_source=shares,
        coverage_pct=100 - flops_pct,
        approximated=dict(result.approximated),
        notes=list(getattr(result, "notes", ())),
    )
    start = time.perf_counter()
    sp.plan(graph, "8")
    row["drec_s"] = time.perf_counter() - start
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default="", help="comma-separated architecture names")
    args = parser.parse_args()
    only = {n for n in args.only.split(",") if n}
    rows = [measure(*a) for a in ARCHITECTURES if not only or a[0] in only]
    lines = [
        [
            r["name"],
            r["family"],
            "yes" if r["strict"] else "no",
            r["ops"],
            f"{r['params']:,}",
            "yes" if r["imported_params"] == r["params"] else "NO",
            f"{r['opaque_flops_pct']:.2f}",
            f"{r['opaque_params_pct']:.2f}",
            f"{r['coverage_pct']:.2f}",
            "; ".join(f"{s} {p:.2f}%" for s, p in r["opaque_by_source"][:3]) or "-",
            sum(r["approximated"].values()),
            f"{r['import_s']:.1f}",
            f"{r['export_cpu_s']:.2f}",
            f"{r['translate_cpu_s']:.2f}" + (" (direct)" if r["direct"] else ""),
            f"{r['decomposed_translate_cpu_s']:.2f}",
            f"{r['drec_s']:.2f}",
        ]
        for r in rows
    ]
    md = (
        "# Import coverage of Hugging Face architectures (tiny configs with random weights; "
        "NAME.json: published configs at full width, a few layers, meta device)\n\n"
        f"batch {BATCH}, seq {SEQ}; D-Rec on mesh 8. `python benchmarks/import_coverage.py`. "
        "import s: wall seconds of `import_torch` (export + translation); then CPU seconds of "
        "this process: torch.export, the translation as `import_torch` does it (export's IR "
        "directly when every op has a rule, else after the core-ATen decomposition), and the "
        "translation after the full decomposition (what every import paid before the direct "
        "path covered the model).\n\n"
        + table(
            [
                "arch",
                "kind",
                "strict",
                "ops",
                "params",
                "params exact",
                "% FLOPs opaque",
                "% params opaque",
                "FLOP coverage %",
                "opaque ops (FLOP share)",
                "approximated nodes",
                "import s",
                "export CPU s",
                "translation CPU s",
                "with full decomposition CPU s",
                "D-Rec s",
            ],
            lines,
        )
    )
    write(
        "import_coverage",
        {"run": run_info("import_coverage.py", batch=BATCH, seq=SEQ), "rows": rows},
        md,
    )


if __name__ == "__main__":
    main()
