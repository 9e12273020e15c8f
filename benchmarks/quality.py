"""Quality of D-Rec: its plan's cost over the ILP optimum of the same cost model.

For every zoo model at a reduced size (transformers: one layer at their real width, sequence and
batch; the other models at their default sizes) x meshes 8, 2x8, 4x8, 6, 12 (training, shardplan
preset, a100 machine): the ILP's status and cost (optimal, or the best plan and HiGHS's dual
bound when the time limit stopped it), D-Rec's cost and gap = D-Rec / ILP, the best expert plan
(data-parallel, megatron, fsdp) over the ILP, and where D-Rec misses: the ops whose strategy
differs from the ILP's, ranked by how much D-Rec's plan would gain from taking the ILP's strategy
for that op alone (a single-op swap, priced by the same cost model).

Run: python benchmarks/quality.py [--quick] [--time-limit S] [--models a,b] [--meshes 8,2x8]
Writes benchmarks/results/quality.{json,md} (and quality.png when matplotlib is installed).
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import RESULTS, table, write  # noqa: E402

from shardplan import zoo  # noqa: E402
from shardplan.cost import CostOptions  # noqa: E402
from shardplan.errors import ShardplanError  # noqa: E402
from shardplan.mesh import parse_mesh  # noqa: E402
from shardplan.search import ilp, plan  # noqa: E402
from shardplan.search.space import build_model  # noqa: E402

MESHES = ("8", "2x8", "4x8", "6", "12")
QUICK_MODELS = ("mlp", "sapp-mlp", "alexnet", "wide-deep", "gpt2-small", "bert-base", "moe")
QUICK_MESHES = ("8", "6", "12", "2x8")
LAYERED = {"bert-base", "bert-large", "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"}
LAYERED |= {"gpt3-175b", "gpt3", "vit-b16"}
EXPERTS = ("data-parallel", "megatron", "fsdp")


def reduced(name: str) -> dict[str, Any]:
    """The size overrides of the quality runs."""
    return {"layers": 1} if name in LAYERED else {}


def misses(model: Any, drec_choice: list[int], ilp_choice: list[int], top: int) -> list[dict]:
    """Ops where D-Rec and the ILP differ, by the gain of a single-op swap in D-Rec's plan."""
    graph, space = model.space.graph, model.space
    base = model.objective(drec_choice)
    out = []
    for i, op in enumerate(graph.ops):
        if drec_choice[i] == ilp_choice[i]:
            continue
        swapped = list(drec_choice)
        swapped[i] = ilp_choice[i]
        out.append(
            {
                "op": op.name,
                "kind": op.kind,
                "drec": list(space.strategies[i][drec_choice[i]]),
                "ilp": list(space.strategies[i][ilp_choice[i]]),
                "swap_gain": base - model.objective(swapped),
            }
        )
    out.sort(key=lambda r: -r["swap_gain"])
    return out[:top] if top else out


def run_case(name: str, mesh_text: str, time_limit: float, top: int) -> dict[str, Any]:
    opts = CostOptions.make()
    graph = zoo.build(name, **reduced(name))
    mesh = parse_mesh(mesh_text)
    row: dict[str, Any] = {"model": name, "mesh": mesh_text, "ops": len(graph.ops)}
    row["sizes"] = reduced(name)
    drec = plan(graph, mesh, "drec")
    row["drec_cost"], row["drec_s"] = drec.cost.total, drec.search_seconds
    experts = {m: plan(graph, mesh, m) for m in EXPERTS}
    best = min(experts, key=lambda m: experts[m].cost.total)
    row["expert"], row["expert_cost"] = best, experts[best].cost.total
    row["expert_costs"] = {m: p.cost.total for m, p in experts.items()}
    start = time.perf_counter()
    try:
        model = build_model(
            graph,
            mesh,
            opts,
            deadline=start + time_limit,
            max_strategies=ilp.MAX_STRATEGIES,
            max_entries=ilp.MAX_TABLE_ENTRIES,
            method="ilp",
            time_limit=time_limit,
            table_limit=ilp.SPLIT_ABOVE,
        )
        left = time_limit - (time.perf_counter() - start)
        if left <= 0:
            raise ShardplanError(f"ilp did not finish within {time_limit:g} s (cost tables)")
        result = ilp.solve_model(model, opts, time_limit=left)
    except ShardplanError as e:
        row.update(ilp_status=f"failed: {e}", ilp_s=time.perf_counter() - start)
        return row
    row.update(
        ilp_status=result.status,
        ilp_s=time.perf_counter() - start,
        ilp_cost=result.objective,
        ilp_bound=result.bound,
        ilp_size=result.size,
    )
    row["gap"] = row["drec_cost"] / result.objective
    row["gap_to_bound"] = row["drec_cost"] / result.bound if result.bound > 0 else None
    row["expert_gap"] = row["expert_cost"] / result.objective
    drec_choice = model.choice_of(drec.strategies)
    diffs = misses(model, drec_choice, list(result.choice), 0)
    row["differing_ops"] = len(diffs)
    row["misses"] = diffs[:top]
    return row


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    done = [r for r in rows if r.get("ilp_status") == "optimal"]
    if not done:
        return False
    labels = [f"{r['model']}\n{r['mesh']}" for r in done]
    fig, ax = plt.subplots(figsize=(max(8, 0.45 * len(done)), 4.5))
    xs = range(len(done))
    ax.bar([x - 0.2 for x in xs], [r["gap"] for r in done], 0.4, label="D-Rec / optimum")
    ax.bar([x + 0.2 for x in xs], [r["expert_gap"] for r in done], 0.4, label="best expert / opt")
    ax.axhline(1.05, color="grey", linestyle="--", linewidth=0.8, label="1.05 target")
    ax.set_yscale("log")
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, rotation=90, fontsize=7)
    ax.set_ylabel("cost / ILP optimum")
    ax.set_title("D-Rec and the best expert plan against the ILP optimum (proven cases)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def markdown(rows: list[dict[str, Any]], command: str, time_limit: float, version: str) -> str:
    done = [r for r in rows if r.get("ilp_status") == "optimal"]
    gaps = [r["gap"] for r in done]
    md = f"# D-Rec quality against the ILP optimum\n\nCommand: `{command}` (source {version})\n\n"
    md += (
        "Cost model: shardplan preset (seconds per training step, a100 machine), training with "
        "Adam. Transformers are built with one layer at their real width/sequence/batch, the "
        f"other models at their default sizes. ILP time limit {time_limit:g} s per case.\n\n"
    )
    if done:
        worst = max(done, key=lambda r: r["gap"])
        within = sum(1 for g in gaps if g <= 1.05 + 1e-12)
        md += (
            f"**{len(done)} of {len(rows)} cases proven optimal.** D-Rec / optimum: geometric "
            f"mean **{geomean(gaps):.3f}**, worst **{worst['gap']:.3f}** ({worst['model']} on "
            f"{worst['mesh']}), {within} of {len(done)} within 1.05. Best expert plan / optimum: "
            f"geometric mean {geomean([r['expert_gap'] for r in done]):.3f}.\n\n"
        )
    md += "## Every case\n\n"
    md += table(
        [
            "model",
            "mesh",
            "ops",
            "ILP status",
            "ILP s",
            "D-Rec / ILP",
            "best expert / ILP",
            "ops differing",
            "binaries",
        ],
        [
            [
                r["model"],
                r["mesh"],
                r["ops"],
                r["ilp_status"][:90],
                f"{r['ilp_s']:.1f}",
                f"{r['gap']:.3f}" if "gap" in r else "-",
                f"{r['expert_gap']:.3f} ({r['expert']})" if "gap" in r else "-",
                r.get("differing_ops", "-"),
                r.get("ilp_size", {}).get("binaries", "-"),
            ]
            for r in rows
        ],
    )
    limited = [r for r in rows if str(r.get("ilp_status", "")).startswith("time-limit")]
    if limited:
        md += (
            "\nCases stopped by the time limit: the ILP's best plan is not proven optimal; "
            "D-Rec over HiGHS's dual bound is an upper bound on D-Rec's true gap.\n\n"
        )
        md += table(
            ["model", "mesh", "status", "D-Rec / ILP plan", "D-Rec / dual bound"],
            [
                [
                    r["model"],
                    r["mesh"],
                    r["ilp_status"],
                    f"{r['gap']:.3f}",
                    f"{r['gap_to_bound']:.3f}" if r.get("gap_to_bound") else "-",
                ]
                for r in limited
            ],
        )
    missed = [r for r in done if r["gap"] > 1.01 and r.get("misses")]
    if missed:
        md += "\n## Where D-Rec misses (proven cases with gap > 1.01)\n\n"
        md += (
            "Ops whose D-Rec strategy differs from the ILP's, ranked by what D-Rec's plan gains "
            "from taking the ILP's strategy for that op alone (negative: the swap alone does "
            "not pay; the op only helps together with its neighbours).\n\n"
        )
        for r in sorted(missed, key=lambda r: -r["gap"]):
            md += (
                f"### {r['model']} on {r['mesh']} (gap {r['gap']:.3f}, "
                f"{r['differing_ops']} ops differ)\n\n"
            )
            md += table(
                ["op", "kind", "D-Rec", "ILP", "swap gain / D-Rec cost"],
                [
                    [
                        m["op"],
                        m["kind"],
                        " ".join(c or "-" for c in m["drec"]),
                        " ".join(c or "-" for c in m["ilp"]),
                        f"{m['swap_gain'] / r['drec_cost']:+.3%}",
                    ]
                    for m in r["misses"]
                ],
            )
            md += "\n"
    failed = [r for r in rows if str(r.get("ilp_status", "")).startswith("failed")]
    if failed:
        md += "\n## Where the ILP did not finish\n\n"
        md += table(
            ["model", "mesh", "reason"], [[r["model"], r["mesh"], r["ilp_status"]] for r in failed]
        )
    return md


def source_version() -> str:
    """The commit the run used, "+dirty" when shardplan/ had uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "shardplan"],
            cwd=root,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return head + ("+dirty" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="7 models x meshes 8, 6, 12, 2x8")
    parser.add_argument("--time-limit", type=float, default=None, help="ILP seconds per case")
    parser.add_argument("--models", default=None, help="comma-separated zoo models")
    parser.add_argument("--meshes", default=None, help="comma-separated meshes")
    parser.add_argument("--top", type=int, default=8, help="misses listed per case")
    parser.add_argument("--name", default="quality", help="results file stem (default quality)")
    args = parser.parse_args()
    models = args.models.split(",") if args.models else (QUICK_MODELS if args.quick else zoo.MODELS)
    meshes = args.meshes.split(",") if args.meshes else (QUICK_MESHES if args.quick else MESHES)
    time_limit = args.time_limit or (30.0 if args.quick else 120.0)
    version = source_version()
    rows = []
    for name in models:
        for mesh in meshes:
            start = time.perf_counter()
            row = run_case(name, mesh, time_limit, args.top)
            rows.append(row)
            gap = f"{row['gap']:.3f}" if "gap" in row else "-"
            print(
                f"{name:12s} {mesh:4s} ilp={row['ilp_status'][:60]:60s} gap={gap} "
                f"({time.perf_counter() - start:.1f} s)",
                flush=True,
            )
    command = "python benchmarks/quality.py " + " ".join(sys.argv[1:])
    md = markdown(rows, command.strip(), time_limit, version)
    if plot(rows, RESULTS / f"{args.name}.png"):
        md += f"\n![D-Rec / optimum per case]({args.name}.png)\n"
    done = [r for r in rows if r.get("ilp_status") == "optimal"]
    summary = {
        "proven_cases": len(done),
        "cases": len(rows),
        "gap_geomean": geomean([r["gap"] for r in done]),
        "gap_worst": max((r["gap"] for r in done), default=None),
        "expert_gap_geomean": geomean([r["expert_gap"] for r in done]),
    }
    write(
        args.name,
        {
            "command": command,
            "source": version,
            "quick": args.quick,
            "time_limit": time_limit,
            "summary": summary,
        }
        | {"cases": rows},
        md,
    )


if __name__ == "__main__":
    main()
