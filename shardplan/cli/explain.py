"""`shardplan explain` (why an op has its strategy, and what-if) and `shardplan diff` (two plans).

`explain MODEL|plan.json --mesh M --op NAME`: per round, every candidate cut of the op with its
cost terms (intra-op, compute, redistribution against each neighbour, the rest of the plan) and
the plan-wide total and memory if the op took it (`shardplan.search.explain`); `--replan` also
re-plans the other ops around each candidate. `--layer N`: each heavy op of layer N with its
cheapest alternative. With `--force OP=STRATEGY` the plan explained is the forced one and the
summary shows the delta to the unforced plan.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from shardplan.cli.commands import check_output_path
from shardplan.cli.options import (
    output_flags,
    progress_of,
    resolve_op,
    search_flags,
    source_flags,
)
from shardplan.cli.render import (
    cut_label,
    fmt_bytes,
    fmt_cost,
    make_console,
    plan_title,
    strategy_text,
    summary_table,
)
from shardplan.errors import PlanError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "explain",
        parents=[source_flags(), search_flags(mesh_required=False), output_flags()],
        help="why an op has its strategy: every candidate with its cost terms, and what-if",
        description="For one op (--op) of MODEL's plan or a saved plan.json: every candidate cut "
        "per round with its cost terms (intra-op, compute, redistribution against each "
        "neighbour, the rest of the plan) and the plan's total and memory if the op took it. "
        "--layer N summarises every heavy op of layer N. Example: shardplan explain gpt2-small "
        "--mesh 8 --op h.0.mlp.fc",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--op", metavar="NAME", help="op name or module path (h.0.mlp.fc)")
    what.add_argument("--layer", type=int, metavar="N", help="every heavy op of layer N")
    p.add_argument(
        "--replan",
        action="store_true",
        help="also re-plan the other ops around each candidate (one search per candidate)",
    )
    p.set_defaults(run=run_explain)

    p = sub.add_parser(
        "diff",
        parents=[output_flags()],
        help="list the ops whose strategy differs between two saved plans, with cost deltas",
        description="Compare two plans of one graph (files written by `plan --json`): every op "
        "whose strategy differs, with its own cost in each plan, and the totals.",
    )
    p.add_argument("a", help="first plan.json")
    p.add_argument("b", help="second plan.json")
    p.add_argument("--limit", type=int, default=40, help="list at most N ops (0: all)")
    p.set_defaults(run=run_diff)


def run_explain(args: argparse.Namespace) -> int:
    from shardplan.cli.plans import plan_for

    check_output_path(args.json)
    progress = progress_of(args)
    p, base = plan_for(args, progress)
    console = make_console()
    if args.layer is not None:
        return _explain_layer(console, p, args.layer, progress)
    name = resolve_op(p.graph, args.op)
    from shardplan.search.explain import candidates, replan

    with progress.step(f"pricing every candidate of {name}"):
        cands = candidates(p, name)
    replanned: dict[tuple[Any, ...], float] = {}
    if args.replan:
        for c in cands:
            if c.problem is None and not c.chosen and c.strategy not in replanned:
                with progress.step(f"re-planning around {name}={c.strategy}"):
                    method = p.method if p.method in ("drec", "ilp") else "drec"
                    q = replan(p, {name: c.strategy}, method)
                replanned[c.strategy] = q.cost.total
    op = p.graph.op(name)
    units = p.cost.units
    console.print(escape(plan_title(p)), highlight=False)
    console.print(
        escape(
            f"{name} ({op.kind}: {op.signature.text()}) has strategy "
            f"{strategy_text(p.graph, op, p.strategies[name], p.mesh)}; plan total "
            f"{fmt_cost(p.cost.total, units)}"
        ),
        highlight=False,
    )
    for r, rnd in enumerate(p.mesh.rounds):
        table = Table(
            title=f"round {r}: {rnd.axis_name} axis, q={rnd.q}",
            title_justify="left",
        )
        for col in ("cut", "intra", "compute", "redistrib.", "rest", "total", "Δ", "memory"):
            table.add_column(col, justify="left" if col == "cut" else "right", overflow="fold")
        if args.replan:
            table.add_column("replanned", justify="right", overflow="fold")
        for c in (c for c in cands if c.round == r):
            mark = " ◀" if c.chosen else ""
            label = cut_label(p.graph, op, c.cut) + mark
            if c.problem is not None:
                table.add_row(escape(label), f"[dim]{escape(c.problem)}[/]")
                continue
            row = [
                escape(label),
                fmt_cost(c.intra, units),
                fmt_cost(c.compute, units),
                fmt_cost(c.redistribution, units),
                fmt_cost(c.rest, units),
                fmt_cost(c.total, units),
                _delta(c.total - p.cost.total, units, p.cost.total),
                fmt_bytes(c.memory_per_device),
            ]
            if args.replan:
                again = replanned.get(c.strategy)
                row.append(fmt_cost(again, units) if again is not None else "-")
            table.add_row(*row)
        console.print(table)
        for c in (c for c in cands if c.round == r and c.problem is None and c.edges):
            parts = [
                f"{e.neighbour} ({e.direction}) {fmt_cost(e.cost, units)}"
                for e in c.edges
                if e.cost
            ]
            if parts:
                console.print(
                    escape(
                        f"  {cut_label(p.graph, op, c.cut)} redistribution: " + "; ".join(parts)
                    ),
                    highlight=False,
                    soft_wrap=False,
                )
    console.print(
        "intra + compute + redistribution + rest = total: the plan's cost with this op's "
        "strategy swapped (others unchanged); ◀ marks the plan's own cut",
        highlight=False,
    )
    if base is not None:
        console.print(summary_table(p, base))
    if args.json:
        data = {
            "op": name,
            "plan_total": p.cost.total,
            "units": units,
            "candidates": [_candidate_dict(c, replanned) for c in cands],
        }
        Path(args.json).write_text(json.dumps(data, indent=1))
        console.print(f"candidates written to {escape(args.json)}", highlight=False)
    return 0


def _delta(value: float, units: str, scale: float) -> str:
    """A signed difference of two totals of about `scale`; float noise against it prints 0."""
    text = fmt_cost(abs(value), units, scale)
    return text if text == "0" else ("+" if value > 0 else "-") + text


def _candidate_dict(c: Any, replanned: dict[tuple[Any, ...], float]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "round": c.round,
        "cut": c.cut,
        "strategy": list(c.strategy),
        "chosen": c.chosen,
    }
    if c.problem is not None:
        out["problem"] = c.problem
        return out
    out.update(
        intra=c.intra,
        compute=c.compute,
        redistribution=c.redistribution,
        edges=[
            {"neighbour": e.neighbour, "tensor": e.tensor, "direction": e.direction, "cost": e.cost}
            for e in c.edges
        ],
        rest=c.rest,
        total=c.total,
        memory_per_device_bytes=c.memory_per_device,
    )
    if c.strategy in replanned:
        out["replanned_total"] = replanned[c.strategy]
    return out


def _explain_layer(console: Any, p: Any, layer: int, progress: Any) -> int:
    from shardplan.search.drec.flex import is_transparent
    from shardplan.search.explain import candidates

    pattern = re.compile(rf"^(.*?[._/-]){layer}[._/-]")
    ops = [op for op in p.graph.ops if pattern.match(op.name) and not is_transparent(op)]
    if not ops:
        raise PlanError(f"no heavy op of layer {layer} in {p.graph.name}; try `shardplan show`")
    units = p.cost.units
    table = Table(
        title=f"layer {layer}: {escape(plan_title(p))}",
        title_justify="left",
        caption="best other: the cheapest single-round change (others unchanged)",
        caption_justify="left",
    )
    for col in ("op", "strategy", "best other", "Δ total"):
        table.add_column(col, overflow="fold")
    for op in ops:
        with progress.step(f"pricing every candidate of {op.name}"):
            cands = [c for c in candidates(p, op.name) if c.problem is None and not c.chosen]
        best = min(cands, key=lambda c: c.total, default=None)
        table.add_row(
            escape(op.name),
            strategy_text(p.graph, op, p.strategies[op.name], p.mesh),
            "-" if best is None else strategy_text(p.graph, op, best.strategy, p.mesh),
            "-" if best is None else _delta(best.total - p.cost.total, units, p.cost.total),
        )
    console.print(table)
    return 0


def run_diff(args: argparse.Namespace) -> int:
    from shardplan.cli.plans import load_plan_file
    from shardplan.search.explain import strategy_diff

    check_output_path(args.json)
    a, b = load_plan_file(args.a), load_plan_file(args.b)
    rows = strategy_diff(a, b)
    units = a.cost.units
    console = make_console()
    table = Table(
        title=f"{a.graph.name}: {len(rows)} of {len(a.graph.ops)} ops differ "
        f"({a.method} on {a.mesh.text()} vs {b.method} on {b.mesh.text()})",
        title_justify="left",
    )
    for col in ("op", f"strategy in {Path(args.a).name}", f"in {Path(args.b).name}", "Δ op cost"):
        table.add_column(col, overflow="fold")
    limit = args.limit or len(rows)
    for name, sa, sb, delta in rows[:limit]:
        op = a.graph.op(name)
        table.add_row(
            escape(name),
            strategy_text(a.graph, op, sa, a.mesh),
            strategy_text(b.graph, op, sb, b.mesh),
            _delta(delta, units, a.cost.total),
        )
    console.print(table)
    if limit < len(rows):
        console.print(f"(showing {limit} of {len(rows)}; --limit 0 lists all)", highlight=False)
    total = b.cost.total - a.cost.total
    console.print(
        f"total: {fmt_cost(a.cost.total, units)} -> {fmt_cost(b.cost.total, units)} "
        f"({_delta(total, units, a.cost.total)}); "
        f"memory / device: {fmt_bytes(a.cost.memory_per_device)} -> "
        f"{fmt_bytes(b.cost.memory_per_device)}",
        highlight=False,
    )
    if args.json:
        data = {
            "a": args.a,
            "b": args.b,
            "total_a": a.cost.total,
            "total_b": b.cost.total,
            "ops": [{"name": n, "a": list(sa), "b": list(sb), "delta": d} for n, sa, sb, d in rows],
        }
        Path(args.json).write_text(json.dumps(data, indent=1))
    return 0
