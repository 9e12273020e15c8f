"""Quality of D-Rec: its plan's cost over the ILP optimum of the same cost model.

For every zoo model x meshes 8, 2x8, 4x8, 6, 12 (training, shardplan preset, a100 machine): the
classic transformers of `LAYERED` (BERT, GPT-2, GPT-3, ViT) with one layer at their real width,
sequence and batch, every other model at its default size — the LLM zoo entries (llama3-*,
qwen3-*, mixtral-*, deepseek-*, moe-llm, ...) at full depth, so that repeated-layer folding and
many-layer plans are measured too (their ILPs are larger; the time limit may stop some): the
ILP's status and cost (optimal, or the best plan and HiGHS's dual bound when the time limit
stopped it), D-Rec's cost and gap = D-Rec / ILP, the best expert plan
(data-parallel, megatron, fsdp) over the ILP, and where D-Rec misses: the ops whose strategy
differs from the ILP's, ranked by how much D-Rec's plan would gain from taking the ILP's strategy
for that op alone (a single-op swap, priced by the same cost model).

Run: python benchmarks/quality.py [--quick] [--time-limit S] [--models a,b] [--meshes 8,2x8]
                                   [--ilp-cache DIR] [--sizes layers=2,batch=12] [--name STEM]
Writes benchmarks/results/quality.{json,md} (and quality.png when matplotlib is installed).

ILP results are the slow part (minutes per case) and do not depend on D-Rec: `--ilp-cache DIR`
stores each case's ILP plan keyed by a hash of the ILP, strategy space, cost terms, IR and zoo
sources, and reuses it only when the current evaluator scores the stored plan at the stored
objective (so a changed cost model can never pass an old optimum off as current).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import RESULTS, pyplot, run_info, save_figure, table, write  # noqa: E402

from shardplan import zoo  # noqa: E402
from shardplan.cost import CostOptions  # noqa: E402
from shardplan.cost.evaluate import evaluate_strategies  # noqa: E402
from shardplan.errors import ShardplanError  # noqa: E402
from shardplan.ir.serialize import graph_to_dict  # noqa: E402
from shardplan.mesh import parse_mesh  # noqa: E402
from shardplan.search import plan  # noqa: E402
from shardplan.search.exact import ilp  # noqa: E402
from shardplan.search.exact.model import build_model  # noqa: E402

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


ILP_SOURCES = ("search/exact/ilp.py", "search/exact/space.py", "search/exact/round_split.py")
ILP_SOURCES += ("search/exact/model.py",)  # the cost tables the ILP solves over
ILP_SOURCES += ("cost/terms.py",)
ILP_SOURCES += ("cost/collectives.py", "cost/presets.py", "ir", "mesh.py", "sharding.py")
# what makes the graph is keyed by the graph itself (`graph_digest`): the catalogue's rules and
# the zoo's builders; ir/rebatch.py derives graphs at other batch sizes, which no ILP reads
NOT_READ = ("ir/rebatch.py", "ir/catalogue.py", "ir/catalogue_moe.py", "ir/catalogue_attention.py")


def ilp_fingerprint() -> str:
    """Hash of the sources an ILP result depends on beyond its graph (not D-Rec's)."""
    root = Path(__file__).resolve().parent.parent / "shardplan"
    digest = hashlib.sha256()
    for rel in ILP_SOURCES:
        for path in sorted((root / rel).rglob("*.py")) if (root / rel).is_dir() else [root / rel]:
            if path.relative_to(root).as_posix() not in NOT_READ:
                digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def graph_digest(graph: Any) -> str:
    """Hash of a graph's content (`ir.serialize.graph_to_dict`): ops, signatures, tensors."""
    text = json.dumps(graph_to_dict(graph), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_ilp(cache: Path | None, key: str, graph: Any, mesh: Any, opts: Any) -> dict | None:
    """The stored ILP result of this case, if its plan still costs what it cost when solved."""
    if cache is None or not (cache / f"{key}.json").exists():
        return None
    stored = json.loads((cache / f"{key}.json").read_text())
    if not stored["strategies"]:
        return stored  # the ILP failed on this case: nothing to re-check
    strategies = {op: tuple(s) for op, s in stored["strategies"].items()}
    cost = evaluate_strategies(graph, mesh, strategies, opts).total
    if not math.isclose(cost, stored["ilp_cost"], rel_tol=1e-9):
        return None
    return stored


def build_ilp_model(graph: Any, mesh: Any, opts: Any, start: float, time_limit: float) -> Any:
    return build_model(
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


def run_case(
    name: str,
    mesh_text: str,
    time_limit: float,
    top: int,
    cache: Path | None = None,
    sizes: dict[str, int] | None = None,
) -> dict[str, Any]:
    opts = CostOptions.make()
    graph = zoo.build(name, **{**reduced(name), **(sizes or {})})
    mesh = parse_mesh(mesh_text)
    key = f"{name}_{mesh_text}_{time_limit:g}_{ilp_fingerprint()}_{graph_digest(graph)}"
    row: dict[str, Any] = {"model": name, "mesh": mesh_text, "ops": len(graph.ops)}
    row["sizes"] = {**reduced(name), **(sizes or {})}
    drec = plan(graph, mesh, "drec")
    row["drec_cost"], row["drec_s"] = drec.cost.total, drec.search_seconds
    experts = {m: plan(graph, mesh, m) for m in EXPERTS}
    best = min(experts, key=lambda m: experts[m].cost.total)
    row["expert"], row["expert_cost"] = best, experts[best].cost.total
    row["expert_costs"] = {m: p.cost.total for m, p in experts.items()}
    stored = cached_ilp(cache, key, graph, mesh, opts)
    if stored is not None:
        row.update({k: v for k, v in stored.items() if k != "strategies"}, ilp_reused=True)
        if not stored["strategies"]:
            return row
        ilp_strategies = {op: tuple(s) for op, s in stored["strategies"].items()}
        return finish_row(row, graph, mesh, opts, drec.strategies, ilp_strategies, top, None)
    start = time.perf_counter()
    try:
        model = build_ilp_model(graph, mesh, opts, start, time_limit)
        left = time_limit - (time.perf_counter() - start)
        if left <= 0:
            raise ShardplanError(f"ilp did not finish within {time_limit:g} s (cost tables)")
        result = ilp.solve_model(model, opts, time_limit=left)
    except ShardplanError as e:
        row.update(ilp_status=f"failed: {e}", ilp_s=time.perf_counter() - start)
        store(cache, key, row, {})
        return row
    row.update(
        ilp_status=result.status,
        ilp_s=time.perf_counter() - start,
        ilp_cost=result.objective,
        ilp_bound=result.bound,
        ilp_size=result.size,
    )
    ilp_strategies = model.strategies(result.choice)
    store(cache, key, row, ilp_strategies)
    return finish_row(row, graph, mesh, opts, drec.strategies, ilp_strategies, top, model)


def store(cache: Path | None, key: str, row: dict[str, Any], strategies: dict) -> None:
    if cache is None:
        return
    cache.mkdir(parents=True, exist_ok=True)
    fields = ("ilp_status", "ilp_s", "ilp_cost", "ilp_bound", "ilp_size")
    data = {k: row[k] for k in fields if k in row} | {"strategies": strategies}
    (cache / f"{key}.json").write_text(json.dumps(data))


def finish_row(
    row: dict[str, Any],
    graph: Any,
    mesh: Any,
    opts: Any,
    drec_strategies: dict,
    ilp_strategies: dict,
    top: int,
    model: Any,
) -> dict[str, Any]:
    """Gaps, and the ops where D-Rec differs (ranked by single-op swaps when it misses)."""
    ilp_cost, bound = row["ilp_cost"], row["ilp_bound"]
    row["gap"] = row["drec_cost"] / ilp_cost
    row["gap_to_bound"] = row["drec_cost"] / bound if bound and bound > 0 else None
    row["expert_gap"] = row["expert_cost"] / ilp_cost
    if row["gap"] <= 1.01:
        row["differing_ops"] = sum(
            1 for op in graph.ops if drec_strategies[op.name] != ilp_strategies[op.name]
        )
        row["misses"] = []
        return row
    if model is None:
        model = build_ilp_model(graph, mesh, opts, time.perf_counter(), 3600.0)
    drec_choice = model.choice_of(drec_strategies)
    diffs = misses(model, drec_choice, model.choice_of(ilp_strategies), 0)
    row["differing_ops"] = len(diffs)
    row["misses"] = diffs[:top]
    return row


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def plot(rows: list[dict[str, Any]], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
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
    save_figure(fig, path)
    return True


def markdown(rows: list[dict[str, Any]], command: str, time_limit: float, version: str) -> str:
    done = [r for r in rows if r.get("ilp_status") == "optimal"]
    gaps = [r["gap"] for r in done]
    md = f"# D-Rec quality against the ILP optimum\n\nCommand: `{command}` (source {version})\n\n"
    md += (
        "Cost model: shardplan preset (seconds per training step, a100 machine), training with "
        f"Adam. {', '.join(sorted(LAYERED))} are built with one layer at their real "
        "width/sequence/batch; every other model (the LLM zoo entries at full depth) at its "
        f"default size. ILP time limit {time_limit:g} s per case.\n\n"
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
    beaten = [r for r in rows if r["drec_cost"] > r["expert_cost"] * (1 + 1e-9)]
    md += (
        f"Against the best expert plan (data-parallel, megatron, fsdp) in all {len(rows)} cases, "
        f"solved by the ILP or not: D-Rec is worse in **{len(beaten)}**"
        + (": " + ", ".join(f"{r['model']} on {r['mesh']}" for r in beaten) if beaten else "")
        + "; D-Rec / best expert: geometric mean "
        f"{geomean([r['drec_cost'] / r['expert_cost'] for r in rows]):.3f}, worst "
        f"{max(r['drec_cost'] / r['expert_cost'] for r in rows):.3f}.\n\n"
    )
    reused = sum(1 for r in rows if r.get("ilp_reused"))
    if reused:
        md += (
            f"{reused} of {len(rows)} ILP results were reused from `--ilp-cache` (same ILP, "
            "space, cost-term, IR and zoo sources; each stored plan re-scored by the current "
            "evaluator at its stored cost); their ILP seconds are those of the original solve.\n\n"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="7 models x meshes 8, 6, 12, 2x8")
    parser.add_argument("--time-limit", type=float, default=None, help="ILP seconds per case")
    parser.add_argument("--models", default=None, help="comma-separated zoo models")
    parser.add_argument("--meshes", default=None, help="comma-separated meshes")
    parser.add_argument("--top", type=int, default=8, help="misses listed per case")
    parser.add_argument("--name", default="quality", help="results file stem (default quality)")
    parser.add_argument("--ilp-cache", type=Path, default=None, help="reuse/store ILP results")
    parser.add_argument(
        "--sizes", default="", help="zoo size overrides for every model, e.g. layers=2,batch=12"
    )
    args = parser.parse_args()
    sizes = {k: int(v) for k, v in (kv.split("=") for kv in args.sizes.split(",") if kv)}
    models = args.models.split(",") if args.models else (QUICK_MODELS if args.quick else zoo.MODELS)
    meshes = args.meshes.split(",") if args.meshes else (QUICK_MESHES if args.quick else MESHES)
    time_limit = args.time_limit or (30.0 if args.quick else 120.0)
    info = run_info(__file__, quick=args.quick, time_limit=time_limit)
    rows = []
    for name in models:
        for mesh in meshes:
            start = time.perf_counter()
            row = run_case(name, mesh, time_limit, args.top, args.ilp_cache, sizes)
            rows.append(row)
            gap = f"{row['gap']:.3f}" if "gap" in row else "-"
            print(
                f"{name:12s} {mesh:4s} ilp={row['ilp_status'][:60]:60s} gap={gap} "
                f"({time.perf_counter() - start:.1f} s)",
                flush=True,
            )
    md = markdown(rows, info["command"], time_limit, info["source"])
    if sizes:  # the sizes line of `markdown` names the defaults these override
        md = md.replace("\n\n", f"\n\nSize overrides for every model: {args.sizes}.\n\n", 1)
    if plot(rows, RESULTS / f"{args.name}.png"):
        md += f"\n![D-Rec / optimum per case]({args.name}.png)\n"
    done = [r for r in rows if r.get("ilp_status") == "optimal"]
    summary = {
        "proven_cases": len(done),
        "cases": len(rows),
        "gap_geomean": geomean([r["gap"] for r in done]),
        "gap_worst": max((r["gap"] for r in done), default=None),
        "expert_gap_geomean": geomean([r["expert_gap"] for r in done]),
        "worse_than_best_expert": sum(
            1 for r in rows if r["drec_cost"] > r["expert_cost"] * (1 + 1e-9)
        ),
    }
    write(
        args.name,
        {
            **info,
            "summary": summary,
        }
        | {"cases": rows},
        md,
    )


if __name__ == "__main__":
    main()
