"""Front-door speed, before and after: `shardplan.plan` and the training-step search timed at a
base commit and at the working tree, side by side in one run.

The base is checked out as a detached git worktree (default: 86a2cb8, main before issue 22);
each side runs the same cases in its own subprocess (PYTHONPATH = that tree), alternating
base / head for every repeat so that load from other jobs on this shared machine falls on both.
A case's time is the median over repeats of the wall time of one call (graph built outside the
timer); the ratio is head / base. Cases: D-Rec through `shardplan.plan` on zoo models of
several sizes and meshes, and the training-step search (`search.scale.plan_training`, the entry
point both sides have) on GPT-3-shaped decoders with budgets.

Run: python benchmarks/front_door.py [--base REF] [--repeats N] [--quick]
Writes benchmarks/results/front_door.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import write  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SPMD = (
    ("gpt2-small", {}, "8"),
    ("bert-base", {}, "2x8"),
    ("gpt2-xl", {}, "2x8"),
    ("gpt3-175b", {"batch": 1536}, "1024"),
)
STEP = (
    ("gpt3", {"layers": 24, "hidden": 2048, "heads": 16}, "2x8", 64, 40e9),
    ("gpt3", {"layers": 32, "hidden": 4096, "heads": 32}, "4x8", 128, 12e9),
)

WORKER = r"""
import json, sys, time
import shardplan as sp
from shardplan.cost import CostOptions
from shardplan.mesh import parse_mesh
from shardplan.search.scale import plan_training
spmd, step = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {}
for name, sizes, mesh in spmd:
    g = sp.zoo.build(name, **sizes)
    t = time.perf_counter()
    p = sp.plan(g, mesh)
    out[f"drec {name}@{mesh}"] = [time.perf_counter() - t, p.cost.total]
for name, sizes, mesh, batch, budget in step:
    opts = CostOptions.make("shardplan", True, "adam", "bf16")
    build = lambda b, n=name, s=sizes: sp.zoo.build(n, batch=b, **s)
    t = time.perf_counter()
    tp = plan_training(build, batch, parse_mesh(mesh), opts, budget)
    label = f"step {name}-{sizes['layers']}x{sizes['hidden']}@{mesh}"
    out[label] = [time.perf_counter() - t, tp.step.step_s]
print(json.dumps(out))
"""


def run_side(tree: Path, spmd: Any, step: Any) -> dict[str, list[float]]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", WORKER, json.dumps(spmd), json.dumps(step)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=tree,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", default="86a2cb8", help="git ref to compare with (default 86a2cb8)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the two smallest cases of each kind")
    args = ap.parse_args()
    spmd = [list(c) for c in (SPMD[:2] if args.quick else SPMD)]
    step = [list(c) for c in (STEP[:1] if args.quick else STEP)]
    base_sha = subprocess.run(
        ["git", "rev-parse", "--short", args.base], cwd=ROOT, capture_output=True, text=True,
        check=True,
    ).stdout.strip()
    head_sha = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
        check=True,
    ).stdout.strip()
    times: dict[str, dict[str, list[float]]] = {"base": {}, "head": {}}
    results: dict[str, dict[str, float]] = {"base": {}, "head": {}}
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(
            ["git", "worktree", "add", "--detach", str(base), args.base],
            cwd=ROOT, capture_output=True, check=True,
        )
        try:
            for _ in range(args.repeats):
                for side, tree in (("base", base), ("head", ROOT)):
                    for case, (seconds, value) in run_side(tree, spmd, step).items():
                        times[side].setdefault(case, []).append(seconds)
                        results[side][case] = value
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT)
    rows = []
    for case in times["head"]:
        b, h = statistics.median(times["base"][case]), statistics.median(times["head"][case])
        rows.append(
            {
                "case": case,
                "base_s": b,
                "head_s": h,
                "ratio": h / b,
                "base_result": results["base"][case],
                "head_result": results["head"][case],
            }
        )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    data = {
        "base": base_sha,
        "head": head_sha,
        "repeats": args.repeats,
        "load_average_1min_at_end": load,
        "wall_s": time.time() - start,
        "rows": rows,
    }
    lines = [
        f"# Front-door speed: {head_sha} (head) against {base_sha} (base)",
        "",
        f"Median of {args.repeats} alternating runs per side; load average {load:.1f} at the end "
        "(2-core machine shared with other jobs). Result: the plan's cost (D-Rec, seconds per "
        "step under the evaluator) or the training plan's step (s).",
        "",
        "| case | base s | head s | head / base | base result | head result |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['base_s']:.3f} | {r['head_s']:.3f} | {r['ratio']:.2f} | "
            f"{r['base_result']:.6g} | {r['head_result']:.6g} |"
        )
    write("front_door", data, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
