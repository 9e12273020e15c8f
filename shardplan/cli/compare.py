"""`shardplan compare MODEL --mesh M`: several methods on the same problem, side by side.

By default D-Rec and the expert plans (data parallel, Megatron, FSDP); `--exact` adds the ILP and
the DP (or name methods with `--methods`). Every method plans the same graph on the same mesh with
the same cost options and the one evaluator scores each plan. The ILP starts from D-Rec's plan as
its incumbent: if HiGHS ends without a plan, or with a costlier one, D-Rec's plan is kept and the
status says so. A method that fails is reported, not hidden: "infeasible" (memory budget), "did
not finish" (time limit or a problem too large for an exact method) or the error's first line.
Statuses print on one line; `--json FILE` has the full text and `--plot FILE` draws bars.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from shardplan.cli.commands import check_output_path
from shardplan.cli.models import load_graph, model_label
from shardplan.cli.options import (
    Progress,
    output_flags,
    parse_forces,
    plan_options,
    plot_flag,
    progress_of,
    search_flags,
    source_flags,
)
from shardplan.cli.render import fmt_bytes, fmt_cost, make_console, one_line
from shardplan.errors import InfeasibleError, ShardplanError, SolverError, UnknownModelError
from shardplan.problem import Problem
from shardplan.search import METHODS, plan
from shardplan.search.solvers import SOLVERS

DEFAULT_METHODS = ("drec", "data-parallel", "megatron", "fsdp")
EXACT_METHODS = ("ilp", "dp")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "compare",
        parents=[source_flags(), search_flags(method=False), output_flags()],
        help="run several methods on one model and mesh and compare their costs",
        description="Plan MODEL on a mesh with D-Rec and the expert plans (--exact adds the ILP "
        "and the DP) and print total cost, cost relative to the best, memory per device, search "
        "time and each method's status.",
    )
    p.add_argument(
        "--methods",
        default=None,
        help="comma-separated SPMD methods from "
        f"{','.join(m for m in METHODS if not SOLVERS[m].training)} "
        f"(default {','.join(DEFAULT_METHODS)})",
    )
    p.add_argument(
        "--exact", action="store_true", help="also run the exact methods (ilp, dp); slow"
    )
    plot_flag(p)
    p.set_defaults(run=run_compare)


def _status_of(error: ShardplanError) -> str:
    text = str(error)
    if isinstance(error, InfeasibleError):
        return f"infeasible: {text}"
    if isinstance(error, SolverError) and "did not finish" in text:
        return "did not finish" + text.split("did not finish", 1)[1]
    return f"error: {type(error).__name__}: {text}"


def compare_methods(
    graph: Any,
    mesh: Any,
    methods: list[str],
    time_limit: float,
    progress: Progress | None = None,
    fixed: dict[str, Any] | None = None,
    **plan_options: Any,
) -> list[dict[str, Any]]:
    """One row per method: cost, memory, seconds, status (failures included). D-Rec runs first
    so that its plan can be the ILP's incumbent."""
    progress = progress or Progress(quiet=True)
    rows: dict[str, dict[str, Any]] = {}
    order = sorted(methods, key=lambda m: m != "drec")
    drec_strategies = None
    for method in order:
        extra: dict[str, Any] = {"time_limit": time_limit} if method in ("ilp", "dp") else {}
        if fixed and method in ("drec", "ilp"):
            extra["fixed"] = fixed
        if method == "ilp" and drec_strategies is not None:
            extra["incumbent"] = drec_strategies
        start = time.perf_counter()
        row: dict[str, Any] = {"method": method}
        try:
            with progress.step(f"{method} planning {graph.name} on mesh {mesh.text()}"):
                p = plan(graph, mesh, method, **plan_options, **extra)
        except ShardplanError as e:
            row.update(
                ok=False,
                total=None,
                units=None,
                memory_per_device_bytes=None,
                search_seconds=time.perf_counter() - start,
                status=_status_of(e),
            )
        else:
            assert p.cost is not None
            if method == "drec":
                drec_strategies = p.strategies
            row.update(
                ok=True,
                total=p.cost.total,
                units=p.cost.units,
                compute=p.cost.compute,
                communication=p.cost.comm.total,
                memory_per_device_bytes=p.cost.memory_per_device,
                search_seconds=p.search_seconds,
                status=p.status,
                notes=list(p.notes),
            )
        rows[method] = row
    out = [rows[m] for m in methods]
    totals = [r["total"] for r in out if r["ok"]]
    best = min(totals) if totals else None
    for r in out:
        r["cost_over_best"] = r["total"] / best if r["ok"] and best else None
    return out


def run_compare(args: argparse.Namespace) -> int:
    if args.methods:
        methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    else:
        methods = list(DEFAULT_METHODS)
    if args.exact:
        methods += [m for m in EXACT_METHODS if m not in methods]
    spmd = [m for m in METHODS if not SOLVERS[m].training]
    unknown = [m for m in methods if m not in spmd]
    if unknown or not methods:
        raise UnknownModelError(
            f"unknown method(s) {unknown}; compare takes SPMD methods: choose from {spmd} "
            "(training plans: `shardplan plan --method step|megatron-recipe`)"
        )
    check_output_path(args.json)
    check_output_path(args.plot, "--plot")
    progress = progress_of(args)
    graph = load_graph(args, progress)
    mesh = Problem.make(graph, args.mesh, machine=args.machine).mesh  # the one parser of text
    forced = parse_forces(graph, mesh, args.force) or None
    rows = compare_methods(
        graph, mesh, methods, args.time_limit, progress, forced, **plan_options(args)
    )
    units = next((r["units"] for r in rows if r["ok"]), "s")
    mode = "training" if args.train is not False else "inference"
    table = Table(
        title=f"{model_label(args)} on mesh {mesh.text()}, {mode}",
        title_justify="left",
    )
    for col, justify in (
        ("method", "left"),
        ("total / step", "right"),
        ("cost / best", "right"),
        ("memory / device", "right"),
        ("search", "right"),
        ("status", "left"),
    ):
        table.add_column(col, justify=justify, overflow="fold")  # type: ignore[arg-type]
    for r in rows:
        table.add_row(
            r["method"],
            fmt_cost(r["total"], units) if r["ok"] else "-",
            f"{r['cost_over_best']:.3f}" if r["ok"] else "-",
            fmt_bytes(r["memory_per_device_bytes"]) if r["ok"] else "-",
            f"{r['search_seconds']:.2f} s",
            escape(one_line(r["status"], 48)),
        )
    console = make_console()
    console.print(table)
    ilp = next((r for r in rows if r["method"] == "ilp" and r["ok"]), None)
    if ilp is not None and ilp["status"] == "optimal":
        console.print("best = the ILP's proven optimum of the cost model", highlight=False)
    if any(len(r["status"]) > 48 for r in rows):
        console.print("(statuses cut to one line; --json FILE has them in full)", highlight=False)
    if args.json:
        data = {
            "model": model_label(args),
            "graph": graph.name,
            "ops": len(graph.ops),
            "mesh": mesh.to_dict(),
            "time_limit": args.time_limit,
            "rows": rows,
        }
        Path(args.json).write_text(json.dumps(data, indent=1))
        console.print(f"rows written to {escape(args.json)}", highlight=False)
    if args.plot:
        from shardplan.cli.plot import plot_compare

        with progress.step(f"drawing {args.plot}"):
            plot_compare(rows, f"{model_label(args)} on mesh {mesh.text()}", args.plot)
        console.print(f"plot written to {escape(args.plot)}", highlight=False)
    return 0 if any(r["ok"] for r in rows) else 1
