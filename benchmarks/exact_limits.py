"""The exact methods (DP, ILP) on cases past their table limit: how soon, and how big, they stop.

Randomised front-door runs (models at reduced sizes on 3-D meshes of a few hundred devices)
found `method="dp"` running 91 s past its 60 s time limit: one gradient-credit ("share") table
of 10,240 x 8,054 entries was built dense and deduplicated by numpy, which no deadline
interrupts. The builder now classes such a table row by row and refuses it, naming the tensor,
as soon as the tables would pass their entry limit (DP 60 M, ILP 40 M entries; an edge or home
table was already refused before it was built). Each case runs in a fresh interpreter (its peak
resident memory is that process's), from this checkout and, with `--before DIR`, from another
checkout (a `git worktree` of an older commit) in the same run, one after the other.

Run: python benchmarks/exact_limits.py [--before DIR] [--name STEM]
Writes benchmarks/results/{STEM}.{json,md} (default exact_limits).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import run_info, table, write  # noqa: E402

CASES = [  # (model, zoo sizes, mesh, method)
    ("bert-large", dict(batch=2, seq=64, layers=3, vocab=128, max_positions=16), "7x8x8", "dp"),
    ("bert-large", dict(batch=2, seq=64, layers=3, vocab=128, max_positions=16), "7x8x8", "ilp"),
    ("resnet152", dict(batch=2, image=32, classes=10, width=8), "8x4", "dp"),
]
TIME_LIMIT = 60.0

_CHILD = """
import json, resource, sys, time
sys.path.insert(0, sys.argv[1])
import shardplan as sp
from shardplan.errors import ShardplanError
model, sizes, mesh, method, limit = json.loads(sys.argv[2])
graph = sp.zoo.build(model, small=True, **sizes)
start = time.perf_counter()
try:
    sp.plan(graph, mesh, method, time_limit=limit)
    outcome = "plan"
except ShardplanError as e:
    outcome = f"{type(e).__name__}: {e}"
seconds = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"seconds": seconds, "peak_bytes": peak, "outcome": outcome}))
"""


def run(source: Path, case: tuple[str, dict[str, int], str, str]) -> dict[str, Any]:
    model, sizes, mesh, method = case
    args = json.dumps([model, sizes, mesh, method, TIME_LIMIT])
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(source), args],
        capture_output=True,
        text=True,
        timeout=TIME_LIMIT * 5,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", type=Path, help="another checkout, run side by side")
    ap.add_argument("--name", default="exact_limits")
    a = ap.parse_args()
    here = Path(__file__).resolve().parent.parent
    info = run_info(__file__, time_limit=TIME_LIMIT, before=str(a.before) if a.before else None)
    rows = []
    for case in CASES:
        row: dict[str, Any] = {"model": case[0], "sizes": case[1], "mesh": case[2]}
        row["method"] = case[3]
        row["after"] = run(here, case)
        if a.before is not None:
            row["before"] = run(a.before.resolve(), case)
        print(f"{case[0]} {case[2]} {case[3]}: {row['after']['seconds']:.1f} s", file=sys.stderr)
        rows.append(row)
    write(a.name, {**info, "cases": rows}, markdown(info, rows))


def markdown(info: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    sides = ["after", "before"] if any("before" in r for r in rows) else ["after"]
    header = ["model", "mesh", "method"]
    for side in sides:
        header += [f"{side}: s", f"{side}: peak GB", f"{side}: outcome"]
    body = []
    for r in rows:
        line = [r["model"], r["mesh"], r["method"]]
        for side in sides:
            got = r[side]
            line += [f"{got['seconds']:.1f}", f"{got['peak_bytes'] / 1e9:.2f}", got["outcome"]]
        body.append(line)
    return (
        "# The exact methods past their table limit\n\n"
        f"Command: `{info['command']}` (source {info['source']}); time limit {TIME_LIMIT:g} s; "
        "`after` is this checkout, `before` the checkout given by `--before`.\n\n"
        + table(header, body)
    )


if __name__ == "__main__":
    main()
