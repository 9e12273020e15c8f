"""The `models`, `show` and `plan` sub-commands (rich tables on stdout, JSON on request)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from shardplan import zoo
from shardplan.cli.models import load_graph, model_label
from shardplan.cli.options import (
    output_flags,
    plot_flag,
    progress_of,
    search_flags,
    source_flags,
)
from shardplan.cli.render import (
    batch_warning,
    fmt_bytes,
    fmt_count,
    fmt_params,
    make_console,
    print_plan,
    warn_split,
)
from shardplan.exporters.plan_json import to_dict


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "models",
        help="list the zoo models with parameter and op counts",
        description="List every zoo model with its parameter and op counts at default sizes.",
    )
    p.set_defaults(run=run_models)

    p = sub.add_parser(
        "show",
        parents=[source_flags(), output_flags()],
        help="print a model's graph: ops, kinds, shapes, FLOPs, params",
        description="Print a model's graph as a table.",
    )
    p.add_argument("--limit", type=int, default=0, help="print at most N ops (0: all)")
    p.set_defaults(run=run_show)

    p = sub.add_parser(
        "plan",
        parents=[source_flags(), search_flags(), output_flags()],
        help="find a parallel plan and print it",
        description="Plan MODEL on a mesh: what each mesh axis does, a per-operator table "
        "(readable strategy per axis, output layout, compute, communication, activations; "
        "repeated layers collapsed) and a summary.",
    )
    p.add_argument(
        "--ops",
        default="heavy",
        choices=("heavy", "all", "none"),
        help="which ops to list: heavy (default; identical layers collapsed), all, none",
    )
    p.add_argument("--top", type=int, default=0, metavar="N", help="list the N costliest ops")
    p.add_argument(
        "--zero",
        type=int,
        choices=(0, 1, 2, 3),
        default=None,
        help="ZeRO stage of the plan: 1 splits optimizer state over each parameter's "
        "data-parallel group, 2 also gradients, 3 also parameters (default: 0, or with --memory "
        "the stage of the cheapest plan that fits; see docs/cost-model.md)",
    )
    plot_flag(p)
    from shardplan.cli.training import add_dtype_argument

    add_dtype_argument(p)
    p.set_defaults(run=run_plan)


def run_models(args: argparse.Namespace) -> int:
    table = Table(title="shardplan zoo (default sizes)", title_justify="left")
    for col in ("model", "params", "published", "ops", "description"):
        table.add_column(col, overflow="fold")
    for name, entry in zoo.MODELS.items():
        g = zoo.build(name)
        table.add_row(
            name,
            fmt_params(g.num_params),
            fmt_params(entry.published_params) if entry.published_params else "-",
            str(len(g.ops)),
            entry.description,
        )
    make_console().print(table)
    return 0


def run_show(args: argparse.Namespace) -> int:
    check_output_path(args.json)
    g = load_graph(args, progress_of(args))
    table = Table(
        title=f"{g.name}: {len(g.ops)} ops, {fmt_params(g.num_params)} params, "
        f"{fmt_count(g.flops)}FLOPs",
        title_justify="left",
    )
    for col in ("#", "op", "kind", "signature", "output shape", "FLOPs", "params"):
        table.add_column(col, overflow="fold")
    limit = args.limit or len(g.ops)
    rows = []
    for i, op in enumerate(g.ops[:limit]):
        pbytes = sum(
            g.tensors[t].nbytes for t in op.inputs if g.tensors[t].role.value == "parameter"
        )
        shape = " ".join(str(tuple(g.tensors[t].shape)) for t in op.outputs)
        table.add_row(
            str(i),
            escape(op.name),
            op.kind,
            op.signature.text(),
            shape,
            fmt_count(op.flops),
            fmt_bytes(pbytes) if pbytes else "",
        )
        rows.append(
            {
                "name": op.name,
                "kind": op.kind,
                "signature": op.signature.text(),
                "flops": op.flops,
                "param_bytes": pbytes,
            }
        )
    console = make_console()
    console.print(table)
    if limit < len(g.ops):
        console.print(f"(showing {limit} of {len(g.ops)} ops; --limit 0 shows all)")
    if args.json:
        Path(args.json).write_text(json.dumps({"model": g.name, "ops": rows}, indent=1))
    return 0


def check_output_path(path: str | None, flag: str = "--json") -> None:
    """Fail (ArgumentError) before any slow work when an output file cannot be written;
    a --plot file must also be .png, .svg or .pdf."""
    from shardplan.cli.inputs import output_path

    output_path(path, flag)
    if flag == "--plot" and path:
        from shardplan.cli.plot import check_suffix

        check_suffix(path)


def run_plan(args: argparse.Namespace) -> int:
    from shardplan.cli.plans import plan_for
    from shardplan.cli.training import reprint_training_plan, run_training_plan, wants_training_plan

    if (args.target or args.from_config) and not args.dtype:
        from shardplan.errors import SolverError

        raise SolverError("--target and --from-config plan a training step: add --dtype bf16")
    if wants_training_plan(args):
        check_output_path(args.json)
        return run_training_plan(args)
    if reprint_training_plan(args):
        return 0
    check_output_path(args.json)
    check_output_path(args.plot, "--plot")
    progress = progress_of(args)
    p, base = plan_for(args, progress)
    console = make_console()
    print_plan(console, p, args.ops, args.top, base)
    warning = batch_warning(p)
    if warning:
        console.print(f"warning: {escape(warning)}", highlight=False)
    warn_split(p)
    if args.json:
        data = to_dict(p)
        data["model"] = model_label(args)
        Path(args.json).write_text(json.dumps(data, indent=1))
        console.print(f"plan written to {escape(args.json)}", highlight=False)
    if args.plot:
        from shardplan.cli.plot import plot_plan

        with progress.step(f"drawing {args.plot}"):
            plot_plan(p, args.plot)
        console.print(f"plot written to {escape(args.plot)}", highlight=False)
    return 0
