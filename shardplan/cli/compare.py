"""`shardplan compare MODEL --mesh M`: every method on the same problem, side by side.

Each method (D-Rec, the exact ILP, the DP baseline, the expert plans) plans the same graph on the
same mesh with the same cost options; the one evaluator scores each plan. A method that fails is
reported, not hidden: "infeasible" (memory budget), "did not finish" (time limit or a problem too
large for an exact method) or the error's message. One rich table on stdout (method, total cost,
cost / best, memory per device, search seconds, status), a spinner on stderr while a method
runs, and `--json FILE` with the same rows.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from shardplan.cli.models import add_model_arguments, load_graph, model_label
from shardplan.errors import InfeasibleError, ShardplanError, SolverError
from shardplan.hardware import DEFAULT_MACHINE, MACHINES
from shardplan.mesh import parse_mesh
from shardplan.search import METHODS, plan

DEFAULT_METHODS = ("drec", "ilp", "dp", "data-parallel", "megatron", "fsdp")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "compare",
        help="run several methods on one model and mesh and compare their costs",
        description="Plan MODEL on a mesh with every method (D-Rec, exact ILP, DP baseline, "
        "expert plans) and print total cost, cost relative to the best, memory per device, "
        "search time and each method's status.",
    )
    add_model_arguments(p)
    p.add_argument("--mesh", required=True, help="device mesh, e.g. 8, 2x8, 4x8 (outermost first)")
    p.add_argument(
        "--methods",
        default=",".join(DEFAULT_METHODS),
        help=f"comma-separated methods (default {','.join(DEFAULT_METHODS)})",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=60.0,
        help="seconds each of ilp and dp may run (default 60)",
    )
    p.add_argument(
        "--machine",
        default=DEFAULT_MACHINE,
        choices=sorted(MACHINES),
        help=f"bandwidth/FLOP/memory preset of the devices (default {DEFAULT_MACHINE})",
    )
    p.add_argument("--memory", default=None, help="per-device memory budget, e.g. 80GB")
    p.add_argument(
        "--preset", default="shardplan", choices=("shardplan", "mindspore"), help="cost preset"
    )
    p.add_argument("--infer", action="store_true", help="plan inference (no backward pass)")
    p.add_argument(
        "--optimizer",
        default="adam",
        choices=("adam", "sgd-momentum", "none"),
        help="optimizer state counted in memory (training)",
    )
    p.add_argument("--json", metavar="FILE", help="also write the rows as JSON to FILE")
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
    progress: Console | None = None,
    **plan_options: Any,
) -> list[dict[str, Any]]:
    """One row per method: cost, memory, seconds, status (failures included)."""
    rows: list[dict[str, Any]] = []
    for method in methods:
        extra = {"time_limit": time_limit} if method in ("ilp", "dp") else {}
        start = time.perf_counter()
        row: dict[str, Any] = {"method": method}
        try:
            if progress is not None:
                with progress.status(f"[bold]{method}[/] planning {graph.name} on {mesh.text()}"):
                    p = plan(graph, mesh, method, **plan_options, **extra)
            else:
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
            row.update(
                ok=True,
                total=p.cost.total,
                units=p.cost.units,
                memory_per_device_bytes=p.cost.memory_per_device,
                search_seconds=p.search_seconds,
                status=p.status,
                notes=list(p.notes),
            )
        rows.append(row)
        if progress is not None:
            progress.print(f"{method}: {row['status']}", highlight=False, soft_wrap=True)
    totals = [r["total"] for r in rows if r["ok"]]
    best = min(totals) if totals else None
    for r in rows:
        r["cost_over_best"] = r["total"] / best if r["ok"] and best else None
    return rows


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000:
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} PB"


def run_compare(args: argparse.Namespace) -> int:
    from shardplan.cli.inputs import output_path

    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    unknown = [m for m in methods if m not in METHODS]
    if unknown or not methods:
        Console(stderr=True).print(
            f"[bold red]error[/]: unknown method(s) {unknown}; choose from {list(METHODS)}",
            highlight=False,
            soft_wrap=True,
        )
        return 2
    output_path(args.json, "--json")  # before the searches
    graph = load_graph(args)
    mesh = parse_mesh(args.mesh, machine=args.machine)
    err = Console(stderr=True)
    rows = compare_methods(
        graph,
        mesh,
        methods,
        args.time_limit,
        progress=err,
        train=not args.infer,
        memory=args.memory,
        preset=args.preset,
        optimizer=args.optimizer,
    )
    units = next((r["units"] for r in rows if r["ok"]), "s")
    table = Table(
        title=f"{model_label(args)} on mesh {mesh.text()} "
        f"(rounds q={[r.q for r in mesh.rounds]}), {'training' if not args.infer else 'inference'}"
    )
    for col in (
        "method",
        f"total cost ({units})",
        "cost / best",
        "memory / device",
        "search s",
        "status",
    ):
        table.add_column(col, overflow="fold")
    for r in rows:
        table.add_row(
            r["method"],
            f"{r['total']:.4g}" if r["ok"] else "-",
            f"{r['cost_over_best']:.3f}" if r["ok"] else "-",
            _fmt_bytes(r["memory_per_device_bytes"]) if r["ok"] else "-",
            f"{r['search_seconds']:.3f}",
            r["status"],
        )
    console = Console() if sys.stdout.isatty() else Console(width=200)
    console.print(table)
    ilp = next((r for r in rows if r["method"] == "ilp" and r["ok"]), None)
    if ilp is not None and ilp["status"] == "optimal":
        console.print("best = the ILP's proven optimum of the cost model", highlight=False)
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
        console.print(f"rows written to {args.json}")
    return 0 if any(r["ok"] for r in rows) else 1
