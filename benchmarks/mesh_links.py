"""One cluster written two ways: a flat axis of 1,024 devices and 128 nodes x 8 GPUs.

Devices are laid out row-major and an axis is intra-node only while it and the axes inside it
divide a node (`Machine.link_bandwidths`, docs/machines.md), so the flat `1024` prices every
collective, the 8 ways inside a node included, at the inter-node link. This script scores GPT-3
175B (batch 1536, bf16) on both: the Megatron recipe of Narayanan et al. SC'21 for it (tensor
8, pipeline 16, micro-batch 1, full recomputation) and the step search (80 GB), with the note a
plan on the flat mesh carries (`search.api.node_crossing_note`).

Run: python benchmarks/mesh_links.py  ->  benchmarks/results/mesh_links.{json,md}
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

MESHES = ("128x8", "1024")
RECIPE = dict(tensor=8, pipeline=16, micro_batch_size=1, recompute="full")


def build(b: int) -> Any:
    return sp.zoo.build("gpt3-175b", batch=b)


def main() -> None:
    info = run_info(__file__, dtype="bf16", budget_bytes=80e9)
    rows = []
    for mesh in MESHES:
        recipe = sp.plan(build, mesh, "megatron-recipe", batch=1536, dtype="bf16", **RECIPE)
        t0 = time.perf_counter()
        tp = sp.plan(build, mesh, "step", batch=1536, dtype="bf16", memory=80e9)
        search_s = time.perf_counter() - t0
        assert recipe.step is not None and tp.step is not None
        rows.append(
            {
                "mesh": mesh,
                "recipe_step_s": recipe.step.step_s,
                "recipe_tensor_comm_s": recipe.step.stages[0].comm_s,
                "search_step_s": tp.step.step_s,
                "search_s": search_s,
                "search_layout": f"{tp.pipeline_stages} x {tp.virtual_stages}, {tp.micro_batches}",
                "note": next((n for n in tp.notes if "crosses nodes" in n), ""),
            }
        )
        print(f"{mesh}: recipe {rows[-1]['recipe_step_s']:.2f} s", file=sys.stderr)
    md = "# One cluster, two meshes: a flat axis across nodes vs nodes x GPUs\n\n"
    md += f"Command: `{info['command']}` (source {info['source']}); GPT-3 175B, batch 1536"
    md += ", bf16.\n\n"
    md += table(
        ["mesh", "recipe step s (TP 8, PP 16)", "recipe TP comm s per micro-batch (stage 0)",
         "step search: step s", "S x v, m", "search s", "plan note"],
        [
            [r["mesh"], f"{r['recipe_step_s']:.2f}", f"{r['recipe_tensor_comm_s']:.4f}",
             f"{r['search_step_s']:.2f}", r["search_layout"], f"{r['search_s']:.1f}",
             r["note"] or "(none)"]
            for r in rows
        ],
    )  # fmt: skip
    write("mesh_links", {**info, "rows": rows}, md)


if __name__ == "__main__":
    main()
