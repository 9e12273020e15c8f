"""Where D-Rec's front door returns a baseline: zoo models x meshes x presets.

For every zoo model at the quality benchmark's reduced sizes (transformers one layer) x meshes
8, 2x8, 4x8, 6, 12 x presets shardplan and mindspore (training, a100): the cost of the plan
`drec()` alone finds, the cost of the plan `plan(method="drec")` returns (D-Rec compared with
all-replicated, data-parallel, megatron and fsdp by the one evaluator), and which baseline won
when one did. `--strategies FILE` also writes every raw `drec()` strategy so two checkouts can be
compared (`--compare A B` lists the cases whose raw D-Rec plans differ); the script runs on
checkouts without the baselines module too (then only the raw D-Rec columns are filled).

Run: python benchmarks/fallback.py [--models a,b] [--meshes 8,6] [--strategies FILE]
     python benchmarks/fallback.py --compare A.json B.json
Writes benchmarks/results/fallback.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from shardplan import zoo  # noqa: E402
from shardplan.cost import CostOptions  # noqa: E402
from shardplan.cost.evaluate import evaluate_strategies  # noqa: E402
from shardplan.mesh import parse_mesh  # noqa: E402
from shardplan.search.drec.search import drec  # noqa: E402

MESHES = ("8", "2x8", "4x8", "6", "12")
PRESETS = ("shardplan", "mindspore")
LAYERED = {"bert-base", "bert-large", "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"}
LAYERED |= {"gpt3-175b", "gpt3", "vit-b16"}


def cases(models: list[str], meshes: list[str]) -> list[dict[str, Any]]:
    try:
        from shardplan.search.api import plan
        from shardplan.search.drec.baselines import baseline_plans
    except ImportError:  # an older checkout: raw D-Rec only
        plan = baseline_plans = None  # type: ignore[assignment]
    rows = []
    for name in models:
        graph = zoo.build(name, **({"layers": 1} if name in LAYERED else {}))
        for mesh_text in meshes:
            mesh = parse_mesh(mesh_text)
            for preset in PRESETS:
                opts = CostOptions.make(preset, True, "adam")
                raw = drec(graph, mesh, opts)
                row: dict[str, Any] = {
                    "model": name,
                    "mesh": mesh_text,
                    "preset": preset,
                    "drec_raw": evaluate_strategies(graph, mesh, raw, opts).total,
                    "strategies": {k: list(v) for k, v in raw.items()},
                }
                if plan is not None:
                    p = plan(graph, mesh, preset=preset)
                    best = min(baseline_plans(graph, mesh, opts), key=lambda b: b.cost.total)
                    won = [n for n in p.notes if "is returned" in n]
                    row.update(
                        drec=p.cost.total,
                        best_baseline=best.method,
                        best_baseline_cost=best.cost.total,
                        fallback=won[0].split(" plan ")[0].removeprefix("the ") if won else None,
                    )
                rows.append(row)
                print(name, mesh_text, preset, row.get("fallback"), flush=True)
    return rows


def compare(a: str, b: str) -> None:
    ra = {(r["model"], r["mesh"], r["preset"]): r for r in json.loads(Path(a).read_text())}
    rb = {(r["model"], r["mesh"], r["preset"]): r for r in json.loads(Path(b).read_text())}
    differ = [k for k in ra if k in rb and ra[k]["strategies"] != rb[k]["strategies"]]
    print(f"{len(differ)} of {len(ra)} cases differ in raw D-Rec strategies")
    for k in differ:
        print(" ", k, f"cost {ra[k]['drec_raw']:.6g} -> {rb[k]['drec_raw']:.6g}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(zoo.MODELS))
    ap.add_argument("--meshes", default=",".join(MESHES))
    ap.add_argument("--strategies", default=None, help="also write raw D-Rec strategies here")
    ap.add_argument("--compare", nargs=2, default=None, metavar=("A", "B"))
    args = ap.parse_args()
    if args.compare:
        compare(*args.compare)
        return
    rows = cases(args.models.split(","), args.meshes.split(","))
    if args.strategies:
        Path(args.strategies).write_text(json.dumps(rows))
    if "drec" not in rows[0]:
        return
    from _report import run_info, table, write

    won = [r for r in rows if r["fallback"]]
    lines = [
        "# D-Rec's front door: where a baseline won",
        "",
        f"{len(won)} of {len(rows)} cases (zoo models x meshes {args.meshes} x presets "
        f"{', '.join(PRESETS)}; training): `plan(method='drec')` returned a baseline because it "
        "was strictly cheaper than D-Rec's own plan.",
        "",
        table(
            ["model", "mesh", "preset", "D-Rec alone", "returned", "baseline", "ratio"],
            [
                [
                    r["model"],
                    r["mesh"],
                    r["preset"],
                    f"{r['drec_raw']:.4g}",
                    f"{r['drec']:.4g}",
                    r["fallback"],
                    f"{r['drec_raw'] / r['drec']:.3g}x" if r["drec"] else "inf",
                ]
                for r in won
            ],
        ),
    ]
    data = {
        "run": run_info("fallback.py", models=args.models, meshes=args.meshes),
        "rows": [{k: v for k, v in r.items() if k != "strategies"} for r in rows],
    }
    write("fallback", data, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
