"""Fused attention: a published FlashAttention run scored with the attention unfused and fused.

The zoo writes attention unfused by default, as Megatron-LM of 2021-22 ran it (the runs of
benchmarks/published_runs.py): the score matmul, scale, mask, softmax and the value matmul, each
a kernel whose b x heads x s x s result goes through HBM and is kept for the backward. Every
large run since 2023 uses a fused kernel (FlashAttention, Dao et al. 2022; cuDNN / Transformer
Engine fused attention in megatron-core; `scaled_dot_product_attention` in torchtitan) that never
materialises the scores: the zoo's `attention="fused"` (CLI `--attention fused`), one `attention`
op (`shardplan/ir/catalogue_attention.py`). This script scores one published run both ways:

Llama 3.1 405B (Dubey et al., "The Llama 3 Herd of Models", arXiv 2407.21783, Table 4; P. Balaji,
SC'24): 8,192 H100-80GB GPUs, TP 8, CP 1, PP 16, DP 64, sequence 8,192, 16M tokens per batch
(2,048 sequences), 430 TFLOP/s per GPU (BF16). Scored by the Megatron recipe (sequence parallel,
distributed optimizer, micro-batch 1, every recomputation option) on the `h100` machine preset
(shardplan/hardware.py); `llama3-405b` zoo entry (126 layers, hidden 16384, 128 heads, 8 KV
heads, FFN 53248, vocabulary 128256), attention unfused and fused. Nothing fitted; the ratio is
printed whatever it is. The run's own schedule (uneven first and last stages, its pipeline
schedule's tuned micro-batch count) is not the recipe's; TFLOP/s here are model FLOPs (no
recomputation counted), as the paper's MFU.
"Score ops" are the ops whose result has heads x s x s elements per sample (the attention scores,
grouped or not, that a fused kernel keeps in SRAM): their share of a middle stage's compute and
kept activations.

Run: python benchmarks/attention_gap.py  ->  benchmarks/results/attention_gap.{json,md}
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import run_info, table, write  # noqa: E402

import shardplan as sp  # noqa: E402
from shardplan.cost.presets import CostOptions  # noqa: E402
from shardplan.mesh import parse_mesh  # noqa: E402
from shardplan.search.step.recipes import megatron_recipe  # noqa: E402

SEQ = 8192
RECOMPUTE = ("none", "selective", "full")
HEADS = 128
RUN = ("Llama 3.1 405B", "llama3-405b", "1024x8", 2048, 8, 16, 430.0)  # Table 4, first row


def score_share(tp: Any) -> tuple[float, float]:
    """Share of a middle stage's compute and kept activations in the score ops (docstring)."""
    stage = tp.stages[len(tp.stages) // 2].plan
    graph, rows = stage.graph, stage.cost.ops
    square = {
        op.name
        for op in graph.ops
        if any(_per_sample(graph.tensors[t].shape) >= HEADS * SEQ * SEQ for t in op.outputs)
    }
    compute = sum(r.compute for r in rows)
    kept = sum(r.activation_bytes for r in rows)
    return (
        sum(r.compute for r in rows if r.name in square) / compute,
        sum(r.activation_bytes for r in rows if r.name in square) / kept,
    )


def _per_sample(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape[1:]:
        n *= d
    return n


def main() -> None:
    info = run_info(__file__, dtype="bf16", machine="h100")
    name, zoo_name, mesh_text, batch, tensor, pipeline, measured = RUN
    opts = CostOptions.make(dtype="bf16")
    mesh = parse_mesh(mesh_text, machine="h100")
    rows = []
    t0 = time.perf_counter()
    for attention, recompute in [(a, r) for a in ("unfused", "fused") for r in RECOMPUTE]:
        tp = megatron_recipe(
            lambda b, a=attention: sp.zoo.build(zoo_name, batch=b, seq=SEQ, attention=a),
            batch,
            mesh,
            opts,
            tensor,
            pipeline,
            1,
            recompute,
            sequence_parallel=True,
            distributed_optimizer=True,
        )
        s = tp.step
        assert s is not None
        compute_share, memory_share = score_share(tp)
        rows.append(
            {
                "run": name,
                "attention": attention,
                "recompute": recompute,
                "step_s": s.step_s,
                "tflops_per_device": s.tflops_per_device,
                "measured_tflops": measured,
                "ratio": s.tflops_per_device / measured,
                "memory_GB": s.memory_per_device / 1e9,
                "fits_80GB": s.memory_per_device <= 80e9,
                "score_compute_share": compute_share,
                "score_activation_share": memory_share,
            }
        )
        print(f"{name} {attention} {recompute}: {s.tflops_per_device:.0f} TFLOP/s", file=sys.stderr)
    info["seconds"] = time.perf_counter() - t0
    md = (
        "# Fused attention: a published FlashAttention run, attention unfused and fused\n\n"
        f"Command: `{info['command']}` (source {info['source']}). Model TFLOP/s per GPU (no "
        "recomputation counted), Megatron recipe TP 8, PP 16, sequence parallel, distributed "
        "optimizer, micro-batch 1, on `h100`. Score ops: the ops with a heads x s x s result "
        "per sample (none when fused).\n\n"
    )
    md += table(
        [
            "run",
            "attention",
            "recompute",
            "step s",
            "predicted TFLOP/s",
            "measured",
            "predicted / measured",
            "memory GB",
            "fits 80 GB",
            "score ops: share of compute",
            "of kept activations",
        ],
        [
            [
                r["run"],
                r["attention"],
                r["recompute"],
                f"{r['step_s']:.2f}",
                f"{r['tflops_per_device']:.0f}",
                f"{r['measured_tflops']:.0f}",
                f"{r['ratio']:.2f}",
                f"{r['memory_GB']:.1f}",
                "yes" if r["fits_80GB"] else "no",
                f"{r['score_compute_share']:.0%}",
                f"{r['score_activation_share']:.0%}",
            ]
            for r in rows
        ],
    )
    write("attention_gap", {**info, "rows": rows}, md)


if __name__ == "__main__":
    main()
