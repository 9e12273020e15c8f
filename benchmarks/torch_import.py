"""From `nn.Module` to plan: the torch importer's time split (export, translation, search).

Three 24-block decoders (hidden 1024, 16 heads, FFN 4096, seq 512, vocab 50304; batch 8 per slot of
the outer mesh axis), built on the meta device (no weights in memory), on meshes 8 and 2x4:
  * "gpt": the module of issue 13 (token + position embeddings, heads split with view and
    transpose, a causal mask, GELU);
  * "plain": plain `nn.Linear` blocks whose attention is written `softmax(q @ k.T) @ v` on the
    whole hidden width, one embedding, ReLU (issue 24).
  * "llama": Hugging Face's `LlamaForCausalLM` from a config (4 KV heads, SwiGLU of width FFN,
    RoPE; its RMSNorm exports decomposed, so the final norm's walks run along the residual adds
    many layers back: `fold.Fold._light_suffix`).
`torch.export.export` (torch's own time), translation by `import_torch` (decomposing to core ATen
only when an op needs it) and, for comparison, translation after the full core-ATen decomposition
the importer always ran before, then the D-Rec search (whether it folded the repeated blocks,
found by structure: `search/drec/fold.py`) and the whole `shardplan.plan` call (D-Rec, scoring,
baselines; its notes say when the blocks were folded). Issue 24's target: D-Rec <= 0.25 s on
both meshes. Wall clock and CPU time of this process (on a shared machine the CPU time is the one
other jobs do not inflate; the 1-minute load average is recorded before and after).

Run: python benchmarks/torch_import.py [--layers 24] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # torch_gpts

from _report import run_info, table, write  # noqa: E402

import shardplan as sp  # noqa: E402
from shardplan.cost import CostOptions, evaluate_strategies  # noqa: E402
from shardplan.search.drec.search import drec, drec_folded  # noqa: E402


def gpt_module(
    layers: int, hidden: int, heads: int, ffn: int, vocab: int, seq: int, plain: bool = False
) -> Any:
    """tests/torch_gpts.py's GPT (issue 13's, or issue 24's plain blocks) on the meta device."""
    import torch
    from torch_gpts import GPT

    with torch.device("meta"):
        return GPT(layers, hidden, heads, ffn, vocab, seq, plain)


def plain_module(layers: int, hidden: int, heads: int, ffn: int, vocab: int, seq: int) -> Any:
    """Blocks of plain `nn.Linear`s, attention written `softmax(q @ k.T) @ v` (no heads)."""
    return gpt_module(layers, hidden, heads, ffn, vocab, seq, plain=True)


def llama_module(layers: int, hidden: int, heads: int, ffn: int, vocab: int, seq: int) -> Any:
    """Hugging Face `LlamaForCausalLM` (RoPE, SwiGLU, RMSNorm that the export decomposes into
    pow/mean/rsqrt/mul, 4 KV heads) from a config, on the meta device, eager attention."""
    from transformers import LlamaConfig

    from shardplan.importers.hf_config import meta_module

    config = LlamaConfig(
        hidden_size=hidden, intermediate_size=ffn, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=4, vocab_size=vocab,
        max_position_embeddings=seq, use_cache=False,
    )  # fmt: skip
    return meta_module(config, "LlamaForCausalLM")


MODULES = {"gpt": gpt_module, "plain": plain_module, "llama": llama_module}


def clock(fn: Any) -> tuple[Any, float, float]:
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - start, time.process_time() - cpu


def _row(
    torch: Any,
    importer: Any,
    kind: str,
    build: Any,
    mesh_text: str,
    batch: int,
    args: Any,
    opts: Any,
) -> dict[str, Any]:
    """One module on one mesh: export, translation (and with full decomposition), search, plan."""
    mesh = sp.parse_mesh(mesh_text)
    module = build(args.layers, 1024, 16, 4096, 50304, 512)
    ids = torch.zeros(batch, 512, dtype=torch.long, device="meta")
    kwargs = {"use_cache": False} if kind == "llama" else None  # Hugging Face's forward
    program, export_s, export_cpu = clock(lambda: torch.export.export(module, (ids,), kwargs))
    result, trans_s, trans_cpu = clock(lambda: importer._translate(torch, program, kind, "error"))
    old, old_s, old_cpu = clock(
        lambda: importer._translate(torch, program, kind, "error", decompose=True)
    )
    graph = result.graph
    searches = [clock(lambda: drec_folded(graph, mesh, opts)) for _ in range(args.repeat)]
    plan, fold = searches[0][0]
    plans = [clock(lambda: sp.plan(graph, mesh)) for _ in range(args.repeat)]
    old_plan = drec(old.graph, mesh, opts)
    search_s, search_cpu = min(s[1] for s in searches), min(s[2] for s in searches)
    return {
        "module": kind,
        "mesh": mesh_text,
        "batch": batch,
        "ops": len(graph.ops),
        "export_s": export_s,
        "export_cpu_s": export_cpu,
        "translate_s": trans_s,
        "translate_cpu_s": trans_cpu,
        "decomposed_translate_s": old_s,
        "decomposed_translate_cpu_s": old_cpu,
        "search_s": search_s,
        "search_cpu_s": search_cpu,
        "folded": fold is not None,
        "plan_s": min(p[1] for p in plans),
        "plan_cpu_s": min(p[2] for p in plans),
        "plan_notes": list(plans[0][0].notes),
        "end_to_end_s": export_s + trans_s + search_s,
        "end_to_end_cpu_s": export_cpu + trans_cpu + search_cpu,
        "cost": evaluate_strategies(graph, mesh, plan, opts).total,
        "plan_cost": plans[0][0].cost.total,
        "decomposed_cost": evaluate_strategies(old.graph, mesh, old_plan, opts).total,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=3, help="search runs (best is kept)")
    args = parser.parse_args()
    import torch

    from shardplan.importers import torch as importer

    info = run_info(__file__, layers=args.layers, repeat=args.repeat)
    info["load_before"] = os.getloadavg()[0]
    opts = CostOptions.make()
    rows = []
    for kind, build in MODULES.items():
        for mesh_text, batch in (("8", 8), ("2x4", 16)):
            rows.append(_row(torch, importer, kind, build, mesh_text, batch, args, opts))
    info["load_after"] = os.getloadavg()[0]
    md = "# nn.Module to plan: the torch importer's time split\n\n"
    md += (
        f"Command: `{info['command']}` (source {info['source']}); 1-minute load average "
        f"{info['load_before']:.1f} before, {info['load_after']:.1f} after (a shared machine).\n\n"
    )
    md += (
        f"Three decoder `nn.Module`s, {args.layers} blocks, hidden 1024, 16 heads, FFN 4096, seq "
        "512, vocab 50304, on the meta device: 'gpt' (heads via view/transpose, causal mask, "
        "GELU), 'plain' (plain `nn.Linear` blocks, attention `softmax(q @ k.T) @ v`, ReLU) and "
        "'llama' (Hugging Face `LlamaForCausalLM` from a config: 4 KV heads, SwiGLU, RoPE, "
        "RMSNorm exported decomposed). Seconds wall "
        "(CPU of this process). Translation: `import_torch` after export (decomposing only when "
        "needed); 'with full decomposition': the core-ATen decomposition the importer always ran "
        f"before. D-Rec search and `shardplan.plan`: best of {args.repeat}; 'folded': D-Rec "
        "searched 4 of the repeated blocks (found by structure) and the plan's notes say so. "
        "Cost: the evaluator's, of D-Rec's plan from each translation, and of `shardplan.plan` "
        "(D-Rec or a baseline that beats it).\n\n"
    )

    def both(r: dict[str, Any], key: str) -> str:
        return f"{r[key + '_s']:.3f} ({r[key + '_cpu_s']:.3f})"

    md += table(
        [
            "module",
            "mesh",
            "batch",
            "ops",
            "export",
            "translation",
            "with full decomposition",
            "D-Rec search",
            "folded",
            "`shardplan.plan`",
            "end to end",
            "cost",
            "cost (decomposed)",
            "plan cost",
        ],
        [
            [
                r["module"],
                r["mesh"],
                r["batch"],
                r["ops"],
                both(r, "export"),
                both(r, "translate"),
                both(r, "decomposed_translate"),
                both(r, "search"),
                "yes" if r["folded"] else "no",
                both(r, "plan"),
                both(r, "end_to_end"),
                f"{r['cost']:.6g}",
                f"{r['decomposed_cost']:.6g}",
                f"{r['plan_cost']:.6g}",
            ]
            for r in rows
        ],
    )
    md += "\nPlan notes, per row:\n\n" + "".join(
        f"- {r['module']} on {r['mesh']}: {'; '.join(r['plan_notes']) or '(none)'}\n" for r in rows
    )
    write("torch_import", {**info, "rows": rows}, md)


if __name__ == "__main__":
    main()
