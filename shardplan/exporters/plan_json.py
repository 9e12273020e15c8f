"""Plans as JSON (schema "shardplan.plan/2"): `to_json` / `from_json` round-trip exactly.

The graph, the mesh, the options and the strategies are stored; the cost is stored for readers
and recomputed on load (`Plan.__post_init__` validates and scores); `from_json` first checks the
data against the schema (`plan_schema.checked_plan_data`: typed fields, finite numbers, bounded
depth and size), so a corrupt file is a PlanError naming the field. `op_rows` are the per-op
display rows (strategy, MindSpore in_strategy, local operand shapes, output layout text) that the
JSON and the CLI table share. O(|ops| * rounds * rank).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from shardplan.cost import CostOptions, Optimizer, get_preset
from shardplan.errors import PlanError
from shardplan.exporters.mindspore import in_strategy
from shardplan.exporters.plan_schema import checked_plan_data
from shardplan.ir.graph import Graph
from shardplan.ir.serialize import graph_from_dict, graph_to_dict
from shardplan.mesh import Mesh
from shardplan.plans import Plan
from shardplan.problem import Problem
from shardplan.sharding import local_shape, operand_layout, output_placements

SCHEMA = "shardplan.plan/2"
"""/2 (issue 22) adds `problem` (budget, ZeRO stage, batch); /1 files still read."""


def op_rows(plan: Plan) -> list[dict[str, Any]]:
    """One display row per op: strategy, MindSpore in_strategy, local shapes, output layout."""
    rounds = plan.mesh.rounds
    rows = []
    costs = {c.name: c for c in (plan.cost.ops if plan.cost else ())}
    for op in plan.graph.ops:
        strategy = plan.strategies[op.name]
        c = costs.get(op.name)
        rows.append(
            {
                "name": op.name,
                "kind": op.kind,
                "layer": op.layer,
                "strategy": [d for d in strategy],
                "in_strategy": [list(s) for s in in_strategy(plan, op.name)],
                "local_shapes": [
                    list(
                        local_shape(
                            plan.graph.tensors[t].shape, operand_layout(op, strategy, i), rounds
                        )
                    )
                    for i, t in enumerate(op.inputs)
                ],
                "output_layout": [
                    " ".join(str(p) for p in output_placements(op, strategy, i))
                    for i in range(len(op.outputs))
                ],
                "comm": (c.intra + c.redistribution) if c else 0.0,
                "activation_bytes": c.activation_bytes if c else 0.0,
            }
        )
    return rows


def to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as a JSON-ready dict (schema SCHEMA)."""
    return {
        "schema": SCHEMA,
        "model": plan.graph.name,
        "mesh": plan.mesh.to_dict(),
        "method": plan.method,
        "status": plan.status,
        "search_seconds": plan.search_seconds,
        "options": {
            "preset": plan.options.preset.name,
            "train": plan.options.train,
            "optimizer": plan.options.optimizer.value,
            # precision only when set: plans of the graph's own widths keep their schema
            **({"dtype": plan.options.precision.name} if plan.options.precision else {}),
            **({"zero": plan.zero} if plan.zero else {}),  # likewise the ZeRO stage
        },
        "cost": plan.cost.to_dict() if plan.cost else None,
        "notes": list(plan.notes),
        "ops": op_rows(plan),
        "param_layouts": {k: list(v) for k, v in plan.param_layouts.items()},
        "problem": problem_to_dict(plan.problem),
        "graph": graph_to_dict(plan.graph),
    }


def problem_to_dict(problem: Problem | None) -> dict[str, Any] | None:
    """What a plan's Problem adds to its graph, mesh and options: budget, ZeRO stage, batch."""
    if problem is None:
        return None
    return {"budget": problem.budget, "zero": problem.zero, "batch": problem.batch}


def problem_from_dict(
    data: dict[str, Any] | None, graph: Graph, mesh: Mesh, options: CostOptions
) -> Problem:
    """The Problem of a plan file (schema /1, or a plan built by hand: no budget)."""
    data = data or {}
    budget = data.get("budget", mesh.memory_bytes)
    return Problem(graph, mesh, options, budget, data.get("zero"), data.get("batch"))


def to_json(plan: Plan, indent: int | None = None) -> str:
    """The plan as JSON text; `from_json` reads it back exactly."""
    return json.dumps(to_dict(plan), indent=indent)


def from_json(text: str | dict[str, Any]) -> Plan:
    """The Plan of JSON text (or its parsed dict); PlanError if it is not one."""
    data = checked_plan_data(text)  # the schema check: typed fields, bounded, finite
    try:
        graph = graph_from_dict(data["graph"])
        mesh = Mesh.from_dict(data["mesh"])
        o = data["options"]
        options = replace(
            CostOptions.make(
                get_preset(o["preset"]), bool(o["train"]), Optimizer(o["optimizer"]), o.get("dtype")
            ),
            zero=o.get("zero", 0),
        )
        strategies = {row["name"]: tuple(row["strategy"]) for row in data["ops"]}
        params = {k: tuple(v) for k, v in data.get("param_layouts", {}).items()}
        problem = problem_from_dict(data.get("problem"), graph, mesh, options)
        return Plan(
            graph,
            mesh,
            strategies,
            str(data["method"]),
            options,
            float(data["search_seconds"]),
            params,
            str(data.get("status", "ok")),
            tuple(data.get("notes", ())),
            problem=problem,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise PlanError(f"plan JSON is malformed: {e!r}") from e


__all__ = [
    "SCHEMA",
    "from_json",
    "op_rows",
    "problem_from_dict",
    "problem_to_dict",
    "to_dict",
    "to_json",
]
