"""Pool `quality_random.py`'s stored runs of several seeds into one summary.

Reads benchmarks/results/quality_random_s<seed>.json or quality_random3_s<seed>.json (the
`--axes 3` runs) for every seed given, and over the cases the ILP proved optimal reports what
each run reports for its own 30 (`quality_sweep.summarize`): the D-Rec / optimum geometric mean,
the worst, how many within 1.05, and over all cases how many D-Rec plans cost more than the best
expert plan; plus every case above 1.05 and the source commits the runs came from. Solves and
plans nothing: run each seed first. `--ref REF` reads the runs as a git commit stored them
(`git show REF:benchmarks/results/...`): the same seeds before a change.

Run: python benchmarks/quality_random_pool.py --seeds 41-56 [--ref COMMIT] [--name STEM]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import RESULTS, run_info, table, write  # noqa: E402
from quality_sweep import summarize  # noqa: E402


def seeds(text: str) -> list[int]:
    """'41-56' or '41,45,50-52' -> the seeds."""
    out: list[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        out += list(range(int(first), int(last or first) + 1))
    return out


def stored(seed: int, ref: str | None) -> dict:
    """The stored run of `seed` (exactly one of the two names), from the working tree or, with
    `ref`, from that git commit."""
    names = [f"quality_random_s{seed}.json", f"quality_random3_s{seed}.json"]
    if ref is None:
        found = [(RESULTS / n).read_text() for n in names if (RESULTS / n).exists()]
    else:
        found = []
        for n in names:
            shown = subprocess.run(
                ["git", "show", f"{ref}:benchmarks/results/{n}"],
                capture_output=True, text=True, cwd=RESULTS.parent.parent,
            )  # fmt: skip
            found += [shown.stdout] if shown.returncode == 0 else []
    if len(found) != 1:
        raise SystemExit(f"seed {seed}: expected one stored run, found {len(found)}; run it first")
    return json.loads(found[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", required=True, help="e.g. 41-56 or 41,45,50-52")
    parser.add_argument("--ref", default=None, help="read the runs as this git commit stored them")
    parser.add_argument("--name", default="quality_random_pool", help="results file stem")
    args = parser.parse_args()
    info = run_info(__file__)
    rows, sources = [], {}
    for seed in seeds(args.seeds):
        run = stored(seed, args.ref)
        sources[seed] = run["source"]
        rows += [{**case, "seed": seed} for case in run["cases"]]
    summary = summarize(rows)
    above = [r for r in rows if r.get("ilp_status") == "optimal" and r["gap"] > 1.05]
    above.sort(key=lambda r: -r["gap"])
    md = (
        f"# D-Rec quality over random seeds {args.seeds}, pooled"
        + (f" (the runs stored at {args.ref})" if args.ref else "")
        + f"\n\nCommand: `{info['command']}`"
        f" (source {info['source']}); the runs' sources: "
        + ", ".join(f"{s} {c}" for s, c in sources.items())
        + f".\n\n**{summary['proven_cases']} of {summary['cases']} cases proven optimal**: D-Rec"
        f" / optimum geometric mean **{summary['gap_geomean']:.4f}**, worst "
        f"**{summary['gap_worst']:.3f}**, {summary['within_1_05']} within 1.05; D-Rec worse than "
        f"the best expert plan in {summary['worse_than_expert']} cases.\n\nProven cases above "
        "1.05:\n\n"
    )
    md += table(
        ["seed", "model", "mesh", "sizes", "D-Rec / ILP"],
        [
            [
                r["seed"],
                r["model"],
                r["mesh"],
                " ".join(f"{k}={v}" for k, v in (r.get("sizes") or {}).items()),
                f"{r['gap']:.3f}",
            ]
            for r in above
        ],
    )
    write(args.name, {**info, "seeds": args.seeds, "sources": sources, "summary": summary}, md)


if __name__ == "__main__":
    main()
