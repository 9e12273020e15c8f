"""The `models`, `show` and `plan` sub-commands (rich tables on stdout, JSON on request)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from shardplan import zoo
from shardplan.cli.models import add_model_arguments, load_graph, model_label
from shardplan.exporters.plan_json import op_rows, to_dict
from shardplan.mesh import MACHINES
from shardplan.search import METHODS, plan
from shardplan.search.flex import is_transparent


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "models",
        help="list the zoo models with parameter and op counts",
        description="List every zoo model with its parameter and op counts at default sizes.",
    )
    p.set_defaults(run=run_models)

    p = sub.add_parser(
        "show",
        help="print a model's graph: ops, kinds, shapes, FLOPs, params",
        description="Print a model's graph as a table.",
    )
    add_model_arguments(p)
    p.add_argument("--limit", type=int, default=0, help="print at most N ops (0: all)")
    p.set_defaults(run=run_show)

    p = sub.add_parser(
        "plan",
        help="find a parallel plan and print it",
        description="Plan MODEL on a mesh: a per-operator table (strategy, "
        "in_strategy, local shapes, comm, memory) and a summary.",
    )
    add_model_arguments(p)
    add_plan_arguments(p)
    p.add_argument(
        "--ops",
        default=None,
        help="which ops to list: 'heavy' (default: ops with reductions/windows), 'all', or 'none'"
        " (with --dtype: per stage, default none)",
    )
    p.add_argument("--json", metavar="FILE", help="also write the plan as JSON to FILE")
    from shardplan.cli.training import add_dtype_argument

    add_dtype_argument(p)
    p.set_defaults(run=run_plan)


def add_plan_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mesh", required=True, help="device mesh, e.g. 8, 2x8, 4x8 (outermost first)")
    p.add_argument("--method", default="drec", choices=METHODS, help="search method")
    p.add_argument(
        "--machine",
        default="a100",
        choices=sorted(MACHINES),
        help="bandwidth/FLOP/memory preset of the devices (default a100)",
    )
    p.add_argument(
        "--memory",
        default=None,
        help="per-device memory budget, e.g. 80GB; the plan must fit or it fails",
    )
    p.add_argument(
        "--preset",
        default="shardplan",
        choices=("shardplan", "mindspore"),
        help="cost model preset",
    )
    p.add_argument("--infer", action="store_true", help="plan inference (no backward pass)")
    p.add_argument(
        "--optimizer",
        default="adam",
        choices=("adam", "sgd-momentum", "none"),
        help="optimizer state counted in memory (training)",
    )
    p.add_argument(
        "--time-limit", type=float, default=60.0, help="seconds for the ilp/dp methods (default 60)"
    )


def make_console() -> Console:
    """Wide tables when the output is a file or a pipe (rich would fold them at 80 columns)."""
    return Console() if sys.stdout.isatty() else Console(width=200)


def _human(n: float) -> str:
    for unit in ("", "K", "M", "G", "T"):
        if abs(n) < 1000:
            return f"{n:.3g}{unit}"
        n /= 1000
    return f"{n:.3g}P"


def _bytes(n: float) -> str:
    return _human(n) + "B"


def run_models(args: argparse.Namespace) -> int:
    table = Table(title="shardplan zoo (default sizes)")
    for col in ("model", "params", "published", "ops", "description"):
        table.add_column(col)
    for name, entry in zoo.MODELS.items():
        g = zoo.build(name)
        table.add_row(
            name,
            _human(g.num_params),
            _human(entry.published_params) if entry.published_params else "-",
            str(len(g.ops)),
            entry.description,
        )
    make_console().print(table)
    return 0


def run_show(args: argparse.Namespace) -> int:
    g = load_graph(args)
    table = Table(
        title=f"{g.name}: {len(g.ops)} ops, {_human(g.num_params)} params, {_human(g.flops)}FLOPs"
    )
    for col in ("#", "op", "kind", "signature", "output shape", "FLOPs", "param bytes"):
        table.add_column(col, overflow="fold")
    limit = args.limit or len(g.ops)
    for i, op in enumerate(g.ops[:limit]):
        pbytes = sum(
            g.tensors[t].nbytes for t in op.inputs if g.tensors[t].role.value == "parameter"
        )
        shape = " ".join(str(tuple(g.tensors[t].shape)) for t in op.outputs)
        table.add_row(
            str(i),
            op.name,
            op.kind,
            op.signature.text(),
            shape,
            _human(op.flops),
            _bytes(pbytes) if pbytes else "",
        )
    console = make_console()
    console.print(table)
    if limit < len(g.ops):
        console.print(f"(showing {limit} of {len(g.ops)} ops; --limit 0 shows all)")
    return 0


def run_plan(args: argparse.Namespace) -> int:
    from shardplan.mesh import parse_mesh

    g = load_graph(args)
    if args.dtype:
        from shardplan.cli.training import run_training_plan

        return run_training_plan(args, g)
    mesh = parse_mesh(args.mesh, machine=args.machine)
    extra = {"time_limit": args.time_limit} if args.method in ("ilp", "dp") else {}
    p = plan(
        g,
        mesh,
        args.method,
        train=not args.infer,
        memory=args.memory,
        preset=args.preset,
        optimizer=args.optimizer,
        **extra,
    )
    console = make_console()
    print_plan(console, p, args.ops or "heavy")
    if args.json:
        data = to_dict(p)
        data["model"] = model_label(args)
        Path(args.json).write_text(json.dumps(data, indent=1))
        console.print(f"plan written to {args.json}")
    return 0


def print_plan(console: Console, p, which: str = "heavy") -> None:  # noqa: ANN001
    rows = op_rows(p)
    units = p.cost.units
    if which not in ("heavy", "all", "none"):
        raise SystemExit(f"--ops must be heavy, all or none, not {which!r}")
    if which != "none":
        shown = [
            r
            for r, op in zip(rows, p.graph.ops, strict=True)
            if which == "all" or not is_transparent(op)
        ]
        table = Table(
            title=f"{p.graph.name} on mesh {p.mesh.text()} "
            f"(rounds q={[r.q for r in p.mesh.rounds]}), method {p.method}"
        )
        for col in (
            "op",
            "kind",
            "strategy",
            "in_strategy",
            "local input shapes",
            "out",
            f"comm ({units})",
            "act bytes",
        ):
            table.add_column(col, overflow="fold")
        for r in shown:
            table.add_row(
                r["name"],
                r["kind"],
                " ".join(d or "-" for d in r["strategy"]),
                str(tuple(tuple(s) for s in r["in_strategy"])),
                " ".join(str(tuple(s)) for s in r["local_shapes"]),
                " ".join(r["output_layout"]),
                f"{r['comm']:.3g}",
                _bytes(r["activation_bytes"]),
            )
        console.print(table)
        if which == "heavy" and len(shown) < len(rows):
            console.print(
                f"({len(shown)} heavy ops listed of {len(rows)}; layout-transparent "
                "ops follow their neighbours — `--ops all` lists every op)"
            )
    c = p.cost
    summary = Table(title="summary", show_header=False)
    summary.add_column("item")
    summary.add_column("value")
    summary.add_row("total cost", f"{c.total:.4g} {units}")
    summary.add_row("  compute", f"{c.compute:.4g} {units}")
    summary.add_row("  communication", f"{c.comm.total:.4g} {units}")
    summary.add_row("    intra-op forward", f"{c.comm.intra_fwd:.4g}")
    summary.add_row("    intra-op backward", f"{c.comm.intra_bwd:.4g}")
    summary.add_row("    gradient sync", f"{c.comm.grad_sync:.4g}")
    summary.add_row(
        "    redistribution", f"{c.comm.redistribution_fwd + c.comm.redistribution_bwd:.4g}"
    )
    summary.add_row("    halo", f"{c.comm.halo:.4g}")
    summary.add_row(
        "memory per device",
        f"{_bytes(c.memory_per_device)} "
        f"(params+grads+optimizer {_bytes(c.param_memory)}, "
        f"activations {_bytes(c.activation_memory)})",
    )
    hbm = MACHINES[p.mesh.machine].memory_bytes
    if p.mesh.memory_bytes is None and c.memory_per_device > hbm:
        summary.add_row(
            "[bold yellow]warning[/]",
            f"needs more than the {p.mesh.machine}'s {_bytes(hbm)} per device; pass "
            "--memory to make the search fit it (or fail saying by how much)",
        )
    summary.add_row("search time", f"{p.search_seconds:.3f} s")
    summary.add_row("status", p.status)
    for note in p.notes:
        summary.add_row("note", note)
    console.print(summary)
