"""Training plans as JSON (schema "shardplan.training/1"): `to_json` / `from_json` round-trip.

The stage plans (model chunks when interleaved: `virtual_stages` per device) are stored in the
plan schema (`plan_json`), with each stage's levers (recompute, zero, sequence_parallel,
context_parallel), the mesh,
the batch and the number of micro-batches; the step cost is stored for readers and recomputed
on load (`TrainingPlan.__post_init__`). O(stages * plan JSON).
"""

from __future__ import annotations

import json
from typing import Any

from shardplan.cost.step import Levers, Recompute
from shardplan.errors import PlanError
from shardplan.exporters import plan_json
from shardplan.mesh import Mesh
from shardplan.training import Stage, TrainingPlan

SCHEMA = "shardplan.training/1"


def to_dict(tp: TrainingPlan) -> dict[str, Any]:
    """The training plan as a JSON-ready dict (schema SCHEMA)."""
    return {
        "schema": SCHEMA,
        "model": tp.model,
        "mesh": tp.mesh.to_dict(),
        "batch": tp.batch,
        "micro_batches": tp.micro_batches,
        "pipeline_stages": tp.pipeline_stages,
        "virtual_stages": tp.virtual_stages,
        "method": tp.method,
        "tokens_per_sample": tp.tokens_per_sample,
        "axes": list(tp.axes),
        "search_seconds": tp.search_seconds,
        "notes": list(tp.notes),
        "step": tp.step.to_dict() if tp.step else None,
        "stages": [
            {
                "recompute": s.levers.recompute.value,
                "zero": s.levers.zero,
                "sequence_parallel": s.levers.sequence_parallel,
                "context_parallel": s.levers.context_parallel,
                "first_op": s.plan.graph.ops[0].name,
                "last_op": s.plan.graph.ops[-1].name,
                "plan": plan_json.to_dict(s.plan),
            }
            for s in tp.stages
        ],
    }


def to_json(tp: TrainingPlan, indent: int | None = None) -> str:
    return json.dumps(to_dict(tp), indent=indent)


def is_training_json(data: Any) -> bool:
    """Does this parsed JSON hold a training plan (rather than a single SPMD plan)?"""
    return isinstance(data, dict) and data.get("schema") == SCHEMA


def from_json(text: str | dict[str, Any]) -> TrainingPlan:
    """Read a training plan written by `to_json` (PlanError when it is not one or malformed)."""
    try:
        data = json.loads(text) if isinstance(text, str) else text
    except json.JSONDecodeError as e:
        raise PlanError(f"training plan JSON does not parse: {e}") from e
    if not is_training_json(data):
        raise PlanError(
            f"not a shardplan training plan (schema must be {SCHEMA!r}); write one with "
            "`shardplan plan MODEL --mesh M --dtype bf16 --json FILE`"
        )
    try:
        stages = tuple(
            Stage(
                plan_json.from_json(s["plan"]),
                Levers(
                    Recompute(s["recompute"]),
                    int(s["zero"]),
                    bool(s.get("sequence_parallel", False)),
                    bool(s.get("context_parallel", False)),
                ),
            )
            for s in data["stages"]
        )
        return TrainingPlan(
            str(data["model"]),
            Mesh.from_dict(data["mesh"]),
            int(data["batch"]),
            int(data["micro_batches"]),
            stages,
            str(data["method"]),
            int(data.get("tokens_per_sample", 1)),
            tuple(data.get("axes", ())),
            float(data.get("search_seconds", 0.0)),
            tuple(data.get("notes", ())),
            virtual_stages=int(data.get("virtual_stages", 1)),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise PlanError(f"training plan JSON is malformed: {e!r}") from e


__all__ = ["SCHEMA", "from_json", "is_training_json", "to_dict", "to_json"]
