"""A plan from the command line: a saved plan file, or a model planned as the flags say."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from shardplan.cli.models import is_plan_file, load_graph, model_label
from shardplan.cli.options import Progress, parse_forces, plan_from_args
from shardplan.errors import PlanError
from shardplan.problem import Problem


def load_plan_file(path_text: str) -> Any:
    """Read a plan written by `shardplan plan --json FILE` (PlanError if missing or malformed)."""
    from shardplan.exporters.plan_json import from_json
    from shardplan.exporters.training_json import is_training_json

    path = Path(path_text)
    if not path.is_file():
        raise PlanError(f"plan file {path_text!r} does not exist; write one with `plan --json`")
    text = path.read_text()
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        data = None  # the plan reader says what is wrong with it
    if is_training_json(data):
        raise PlanError(
            f"{path_text} is a training plan (pipeline stages); this command works on one SPMD "
            f"plan: `shardplan plan {path_text}` prints it, `verify {path_text} --engine torch` "
            "runs it"
        )
    return from_json(text)


def plan_for(
    args: argparse.Namespace,
    progress: Progress,
    check: Callable[[Any, bool | None], None] | None = None,
) -> tuple[Any, Any]:
    """(plan, unforced plan or None): from a plan file, or by planning the model with --force.
    `check(graph, train or None)` runs on the graph before any search (e.g. verify's size check)."""
    forced_items = getattr(args, "force", []) or []
    if is_plan_file(args.model) and not (args.torch or args.hf or args.onnx):
        p = load_plan_file(args.model)
        if check is not None:
            check(p.graph, p.options.train)
        if args.mesh is not None and Problem.make(p.graph, args.mesh).mesh.shape != p.mesh.shape:
            raise PlanError(
                f"{args.model} is a plan for mesh {p.mesh.text()}, not {args.mesh}; "
                "drop --mesh or plan again"
            )
        if not forced_items:
            return p, None
        from shardplan.search.explain import replan

        forced = parse_forces(p.graph, p.mesh, forced_items)
        method = p.method if p.method in ("drec", "ilp") else "drec"
        with progress.step(f"{method} re-planning around {', '.join(forced)}"):
            again = replan(p, forced, method)  # the saved plan's problem, forced ops pinned
        return again, p
    if args.mesh is None:
        raise PlanError(f"{model_label(args)} needs --mesh (e.g. --mesh 8); a plan.json has one")
    graph = load_graph(args, progress)
    if check is not None:
        check(graph, None)
    mesh = Problem.make(graph, args.mesh, machine=args.machine).mesh  # the one parser of text
    forced = parse_forces(graph, mesh, forced_items)
    p = plan_from_args(args, graph, mesh, progress, forced=forced or None)
    base = plan_from_args(args, graph, mesh, progress) if forced else None
    return p, base
