"""D-Rec against the ILP optimum on cases benchmarks/quality.py does not cover (issue 24, item 5).

Meshes with factors 3 and 5 (6, 9, 10, 12, 15, 24, 25, 30, 3x3, 3x5, 5x3, 2x5, 5x2, 2x12, 3x8),
two or three layers, other batch and sequence sizes, over the zoo's classic models (GPT-2, BERT,
GPT-3, ViT, Llama, AlexNet, MLPs, MoE, wide-deep, DeepSeek-MoE): `CASES`, each run by
`quality.run_case` (D-Rec, the expert plans and the ILP with a time limit, the same cost model;
sizes a builder does not take are dropped). Reports over the cases the ILP proved optimal the
geometric mean and worst D-Rec / optimum and how many are within 1.05, and every case either
above 1.0005 or not proven (with D-Rec over the ILP's dual bound there).

Run: python benchmarks/quality_sweep.py [--time-limit 60] [--ilp-cache DIR] [--name STEM]
Writes benchmarks/results/{STEM}.{json,md} (default quality_sweep). ILP results are cached as in
quality.py (`--ilp-cache`: reused only when the current evaluator scores the stored plan at the
stored objective).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import run_info, table, write  # noqa: E402
from quality import geomean, run_case  # noqa: E402

from shardplan import zoo  # noqa: E402

CASES = (  # (zoo model, mesh, size overrides)
    ("gpt2-small", "15", "layers=2 batch=30 seq=96"),
    ("gpt2-small", "3x5", "layers=2 batch=30 seq=96"),
    ("gpt2-small", "2x12", "layers=2 batch=24 seq=96"),
    ("gpt2-small", "10", "layers=3 batch=20 seq=128"),
    ("bert-base", "15", "layers=2 batch=30 seq=128"),
    ("bert-base", "3x8", "layers=2 batch=24 seq=96"),
    ("bert-base", "10", "layers=2 batch=20 seq=160"),
    ("mlp", "15", "batch=30"),
    ("mlp", "3x5", "batch=60"),
    ("mlp", "2x12", "batch=24"),
    ("mlp", "10", "batch=20"),
    ("alexnet", "15", "batch=30"),
    ("alexnet", "3x5", "batch=60"),
    ("alexnet", "10", "batch=20"),
    ("alexnet", "2x12", "batch=24"),
    ("moe", "15", "batch=15 seq=96"),
    ("moe", "10", "batch=10 seq=160"),
    ("moe", "3x8", "batch=24 seq=96"),
    ("vit-b16", "15", "layers=2 batch=30"),
    ("vit-b16", "2x12", "layers=2 batch=24"),
    ("wide-deep", "15", "batch=1920"),
    ("wide-deep", "3x5", "batch=960"),
    ("sapp-mlp", "15", "batch=30"),
    ("gpt2-small", "30", "layers=2 batch=30 seq=96"),
    ("bert-base", "24", "layers=3 batch=24 seq=96"),
    ("alexnet", "30", "batch=30"),
    ("mlp", "6", "batch=6"),
    ("moe", "6", "batch=6 seq=120"),
    ("alexnet", "5x3", "batch=60"),
    ("alexnet", "3x5", "batch=30"),
    ("alexnet", "3x5", "batch=15"),
    ("alexnet", "15", "batch=60"),
    ("alexnet", "15", "batch=120"),
    ("alexnet", "6", "batch=30"),
    ("alexnet", "10", "batch=50"),
    ("alexnet", "2x5", "batch=40"),
    ("alexnet", "5x2", "batch=40"),
    ("alexnet", "3x3", "batch=18"),
    ("alexnet", "9", "batch=36"),
    ("alexnet", "25", "batch=50"),
    ("bert-base", "3x5", "layers=2 batch=30 seq=128"),
    ("bert-base", "5x3", "layers=2 batch=15 seq=96"),
    ("bert-base", "15", "layers=3 batch=15 seq=96"),
    ("bert-base", "6", "layers=2 batch=12 seq=96"),
    ("bert-base", "10", "layers=3 batch=10 seq=256"),
    ("bert-base", "9", "layers=2 batch=18 seq=96"),
    ("gpt2-small", "6", "layers=3 batch=6 seq=96"),
    ("gpt2-small", "15", "layers=2 batch=15 seq=256"),
    ("gpt2-small", "5x3", "layers=2 batch=30 seq=96"),
    ("gpt2-small", "9", "layers=2 batch=9 seq=96"),
    ("vit-b16", "3x5", "layers=2 batch=15"),
    ("vit-b16", "10", "layers=3 batch=20"),
    ("vit-b16", "6", "layers=2 batch=30"),
    ("moe", "3x5", "batch=30 seq=96"),
    ("moe", "5x3", "batch=15 seq=128"),
    ("moe", "9", "batch=9 seq=96"),
    ("mlp", "3x5", "batch=15"),
    ("mlp", "9", "batch=9"),
    ("mlp", "25", "batch=50"),
    ("sapp-mlp", "3x5", "batch=30"),
    ("wide-deep", "10", "batch=2000"),
    ("wide-deep", "5x3", "batch=1500"),
    ("gpt3", "15", "layers=2 batch=15 seq=512"),
    ("gpt3", "10", "layers=2 batch=10 seq=512"),
    ("gpt3", "10", "layers=2 batch=5 seq=512"),
    ("gpt3", "15", "layers=2 batch=5 seq=512"),
    ("gpt3", "6", "layers=2 batch=3 seq=1024"),
    ("gpt3", "12", "layers=2 batch=6 seq=512"),
    ("gpt3", "3x5", "layers=2 batch=15 seq=256"),
    ("gpt3", "30", "layers=2 batch=10 seq=256"),
    ("gpt2-small", "15", "layers=2 batch=5 seq=256"),
    ("gpt2-small", "10", "layers=2 batch=5 seq=512"),
    ("gpt2-small", "12", "layers=3 batch=6 seq=256"),
    ("gpt2-small", "3x5", "layers=2 batch=15 seq=256"),
    ("gpt2-medium", "10", "layers=2 batch=10 seq=256"),
    ("gpt2-medium", "15", "layers=2 batch=15 seq=256"),
    ("bert-base", "10", "layers=2 batch=5 seq=256"),
    ("bert-base", "15", "layers=2 batch=5 seq=128"),
    ("bert-base", "30", "layers=2 batch=15 seq=96"),
    ("bert-large", "10", "layers=2 batch=10 seq=256"),
    ("vit-b16", "15", "layers=2 batch=5"),
    ("vit-b16", "10", "layers=2 batch=10"),
    ("moe", "15", "batch=5 seq=96"),
    ("moe", "10", "batch=5 seq=256"),
    ("moe", "12", "batch=6 seq=128"),
    ("alexnet", "15", "batch=15"),
    ("alexnet", "10", "batch=10"),
    ("alexnet", "6", "batch=6"),
    ("alexnet", "3x5", "batch=45"),
    ("alexnet", "3x3", "batch=9"),
    ("mlp", "15", "batch=5"),
    ("mlp", "10", "batch=10"),
    (
        "llama",
        "10",
        "layers=2 hidden=1024 heads=16 kv_heads=4 ffn=2816 vocab=32000 seq=512 batch=10",
    ),
    (
        "llama",
        "15",
        "layers=2 hidden=1024 heads=16 kv_heads=4 ffn=2816 vocab=32000 seq=256 batch=15",
    ),
    ("deepseek-moe", "10", "layers=2 batch=10 seq=256"),
)


def builder_takes(model: str) -> set[str]:
    """The size parameters the zoo builder of `model` takes."""
    entry = zoo.MODELS[model]
    module, name = entry.builder_path.rsplit(".", 1)
    fn = getattr(importlib.import_module("shardplan.zoo." + module), name)
    return set(inspect.signature(fn).parameters)


def run_cases(
    cases: list[tuple[str, str, dict[str, int]]], time_limit: float, cache: Path | None
) -> list[dict[str, Any]]:
    """`quality.run_case` of each (model, mesh, sizes), printing each gap as it goes."""
    rows = []
    for model, mesh, sizes in cases:
        start = time.perf_counter()
        row = run_case(model, mesh, time_limit, 8, cache, sizes)
        rows.append(row)
        gap = f"{row['gap']:.3f}" if "gap" in row else "-"
        print(f"{model:12s} {mesh:5s} {sizes} gap={gap} ({time.perf_counter() - start:.1f} s)")
    return rows


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Over the cases the ILP proved optimal: D-Rec / optimum geometric mean, worst, how many
    within 1.05; and over all, how many D-Rec plans cost more than the best expert plan."""
    proven = [r["gap"] for r in rows if r.get("ilp_status") == "optimal"]
    return {
        "proven_cases": len(proven),
        "cases": len(rows),
        "gap_geomean": geomean(proven),
        "gap_worst": max(proven, default=None),
        "within_1_05": sum(1 for g in proven if g <= 1.05),
        "worse_than_expert": sum(
            1 for r in rows if r["drec_cost"] > r["expert_cost"] * (1 + 1e-9)
        ),
    }


def markdown(rows: list[dict[str, Any]], info: dict[str, Any]) -> str:
    proven = [r for r in rows if r.get("ilp_status") == "optimal"]
    gaps = [r["gap"] for r in proven]
    within = sum(1 for g in gaps if g <= 1.05)
    md = (
        "# D-Rec quality on meshes with factors 3 and 5, several layers, other sizes\n\n"
        f"Command: `{info['command']}` (source {info['source']}); ILP time limit "
        f"{info['time_limit']:g} s.\n\n"
        f"**{len(proven)} of {len(rows)} cases proven optimal**: D-Rec / optimum geometric mean "
        f"**{geomean(gaps):.4f}**, worst **{max(gaps, default=1.0):.3f}**, {within} within "
        "1.05.\n\nCases above 1.0005 or not proven (the rest are at the optimum):\n\n"
    )
    shown = [r for r in rows if r.get("ilp_status") != "optimal" or r["gap"] > 1.0005]
    shown.sort(key=lambda r: -r.get("gap", 0.0))
    md += table(
        ["model", "mesh", "sizes", "ILP status", "D-Rec / ILP", "D-Rec / dual bound"],
        [
            [
                r["model"],
                r["mesh"],
                " ".join(f"{k}={v}" for k, v in r["sizes"].items()),
                str(r.get("ilp_status", "-"))[:40],
                f"{r['gap']:.3f}" if "gap" in r else "-",
                f"{r['gap_to_bound']:.3f}" if r.get("gap_to_bound") else "-",
            ]
            for r in shown
        ],
    )
    return md


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--ilp-cache", type=Path, default=None, help="reuse/store ILP results")
    parser.add_argument("--name", default="quality_sweep", help="results file stem")
    args = parser.parse_args()
    info = run_info(__file__, time_limit=args.time_limit)
    cases = []
    for model, mesh, overrides in CASES:
        takes = builder_takes(model)
        sizes = {k: int(v) for k, v in (kv.split("=") for kv in overrides.split())}
        cases.append((model, mesh, {k: v for k, v in sizes.items() if k in takes}))
    rows = run_cases(cases, args.time_limit, args.ilp_cache)
    summary = summarize(rows)
    write(args.name, {**info, "summary": summary, "cases": rows}, markdown(rows, info))


if __name__ == "__main__":
    main()
