"""Training plans as JSON (schema "shardplan.training/3"): `to_json` / `from_json` round-trip.

The stage plans (model chunks when interleaved: `virtual_stages` per device) are stored in the
plan schema (`plan_json`), with each stage's levers (recompute, zero, sequence_parallel,
context_parallel, overlap_grad_reduce, overlap_p2p, prefetch, bucket_elements,
tp_comm_overlap; all but the first two optional, default false / 0) and its
place in the model (`first_index`: the index of its first op; `model_ops`: the model's op
count), the mesh, the batch, the micro-batch size, the number of micro-batches and the Problem
(budget, batch); the step cost is stored for readers and recomputed on load
(`TrainingPlan.__post_init__`). /1 and /2 files (without the stage positions and micro-batch
size) are still read, without the checks that need those fields.

Reading never trusts the file: every field is type- and range-checked (no coercion, finite
numbers, bounded size and depth, `plan_schema`), and what can be derived is re-derived and
compared — the stages cover the model's ops in order without gaps, micro-batches x micro-batch
size = batch, each stage's mesh is its share of the top-level mesh, and a later stage's incoming
activation needs a gradient when the stage producing it computes one (set from the producer,
stage by stage). Any contradiction is a one-line PlanError naming the field.
O(stages * plan JSON).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from shardplan.cost.levers import LEVER_FLAGS
from shardplan.cost.step import Levers, Recompute
from shardplan.errors import PlanError
from shardplan.exporters import plan_json
from shardplan.exporters.plan_schema import (
    MAX_BYTES,
    _depth_ok,
    _dict,
    _fail,
    _int,
    _list,
    _mesh,
    _num,
    _problem,
    _str,
)
from shardplan.ir.graph import make_graph
from shardplan.ir.op import Role
from shardplan.mesh import Mesh
from shardplan.plans import Plan
from shardplan.training import Stage, TrainingPlan

SCHEMA = "shardplan.training/3"
"""/2 (issue 22) adds `problem` (budget, batch); /3 (issue 28) `first_index`, `model_ops` and
`micro_batch_size`, so a missing or moved stage is found; /1 and /2 files still read."""
SCHEMAS = ("shardplan.training/1", "shardplan.training/2", SCHEMA)
_FLAGS = LEVER_FLAGS
"""The stage levers stored as true / false (optional on read: false)."""
_FIX = "regenerate it with `shardplan plan MODEL --mesh M --dtype bf16 --json FILE`"


def to_dict(tp: TrainingPlan) -> dict[str, Any]:
    """The training plan as a JSON-ready dict (schema SCHEMA)."""
    firsts, n = [], 0
    for s in tp.stages:
        firsts.append(n)
        n += len(s.plan.graph.ops)
    return {
        "schema": SCHEMA,
        "model": tp.model,
        "mesh": tp.mesh.to_dict(),
        "batch": tp.batch,
        "micro_batches": tp.micro_batches,
        "micro_batch_size": tp.batch // tp.micro_batches,
        "pipeline_stages": tp.pipeline_stages,
        "model_ops": n,
        "virtual_stages": tp.virtual_stages,
        "method": tp.method,
        "tokens_per_sample": tp.tokens_per_sample,
        "axes": list(tp.axes),
        "search_seconds": tp.search_seconds,
        "step_floor_s": tp.step_floor_s,
        "notes": list(tp.notes),
        "problem": plan_json.problem_to_dict(tp.problem),
        "step": tp.step.to_dict() if tp.step else None,
        "stages": [
            {
                "recompute": s.levers.recompute.value,
                "zero": s.levers.zero,
                "first_index": first,
                "sequence_parallel": s.levers.sequence_parallel,
                "context_parallel": s.levers.context_parallel,
                "overlap_grad_reduce": s.levers.overlap_grad_reduce,
                "overlap_p2p": s.levers.overlap_p2p,
                "prefetch": s.levers.prefetch,
                "bucket_elements": s.levers.bucket_elements,
                "tp_comm_overlap": s.levers.tp_comm_overlap,
                "first_op": s.plan.graph.ops[0].name,
                "last_op": s.plan.graph.ops[-1].name,
                "plan": plan_json.to_dict(s.plan),
            }
            for s, first in zip(tp.stages, firsts, strict=True)
        ],
    }


def to_json(tp: TrainingPlan, indent: int | None = None) -> str:
    return json.dumps(to_dict(tp), indent=indent)


def is_training_json(data: Any) -> bool:
    """Does this parsed JSON hold a training plan (rather than a single SPMD plan)?"""
    return isinstance(data, dict) and data.get("schema") in SCHEMAS


def _parse(text: str | bytes | dict[str, Any]) -> dict[str, Any]:
    if not isinstance(text, (str, bytes)):
        data = text
    elif len(text) > MAX_BYTES:
        raise PlanError(f"training plan file is larger than {MAX_BYTES:,} bytes; {_FIX}")
    else:
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise PlanError(f"training plan JSON does not parse: {e}") from e
        except RecursionError as e:
            raise PlanError(f"training plan file is nested too deeply; {_FIX}") from e
    if not is_training_json(data):
        raise PlanError(
            f"not a shardplan training plan (schema must be one of {list(SCHEMAS)}); {_FIX}"
        )
    _depth_ok(data)
    return data


def _check_top(data: dict[str, Any]) -> None:
    """The scalar fields: types and ranges (the stage plans are checked by `plan_json`)."""
    _str(data.get("model"), "model")
    _str(data.get("method"), "method")
    _mesh(data.get("mesh"))
    new = data["schema"] == SCHEMA  # older files lack the positions and the micro-batch size
    batch = _int(data.get("batch"), "batch", 1)
    m = _int(data.get("micro_batches"), "micro_batches", 1)
    size = _int(data.get("micro_batch_size"), "micro_batch_size", 1) if new else batch // m
    if m * size != batch:
        raise PlanError(
            f"training plan fields micro_batches {m} x micro_batch_size {size} != batch "
            f"{batch}; {_FIX}"
        )
    _int(data.get("tokens_per_sample", 1), "tokens_per_sample", 1)
    _num(data.get("search_seconds", 0.0), "search_seconds")
    if data.get("step_floor_s") is not None:
        _num(data["step_floor_s"], "step_floor_s")
    for key in ("axes", "notes"):
        for j, x in enumerate(_list(data.get(key, []), key)):
            _str(x, f"{key}[{j}]")
    stages = _list(data.get("stages"), "stages")
    chunks = _int(data.get("pipeline_stages"), "pipeline_stages", 1) * _int(
        data.get("virtual_stages", 1), "virtual_stages", 1
    )
    if len(stages) != chunks:
        raise _fail("stages", f"a list of pipeline_stages x virtual_stages = {chunks}", stages)
    if data.get("problem") is not None:
        _problem(data["problem"])
    total, n = _int(data.get("model_ops"), "model_ops", 1) if new else None, 0
    for i, s in enumerate(stages):
        p = f"stages[{i}]"
        s = _dict(s, p)
        if new and _int(s.get("first_index"), f"{p}.first_index", 0) != n:
            raise PlanError(
                f"training plan field {p}.first_index is {s['first_index']}, but the stages "
                f"before it hold ops 0..{n - 1}: a stage is missing or out of order; {_FIX}"
            )
        ops = _list(
            _dict(_dict(s.get("plan"), f"{p}.plan").get("graph"), f"{p}.plan.graph").get("ops"),
            f"{p}.plan.graph.ops",
        )
        if not ops:
            raise _fail(f"{p}.plan.graph.ops", "a stage of at least one op", ops)
        for key, op in (("first_op", ops[0]), ("last_op", ops[-1])):
            if _str(s.get(key), f"{p}.{key}") != _dict(op, f"{p}.{key}").get("name"):
                raise _fail(f"{p}.{key}", f"the name of its plan's {key[:-3]} op", s[key])
        n += len(ops)
        _str(s.get("recompute"), f"{p}.recompute")
        _int(s.get("zero"), f"{p}.zero (the ZeRO stage)", 0, 3)
        for lever in _FLAGS:
            if not isinstance(s.get(lever, False), bool):
                raise _fail(f"{p}.{lever}", "true or false", s[lever])
        _int(s.get("bucket_elements", 0), f"{p}.bucket_elements", 0)
    if total is not None and n != total:
        raise PlanError(
            f"training plan stages hold {n} ops but the model has model_ops={total}: a stage is "
            f"missing; {_FIX}"
        )


def _stage_plan(data: dict[str, Any]) -> Plan:
    """A stage's plan; stage plans are solved without a Problem of their own (the training
    plan holds it), so none is made up for them on load."""
    plan = plan_json.from_json(data)
    return replace(plan, problem=None) if data.get("problem") is None else plan


def _with_incoming_grads(plans: list[Plan]) -> list[Plan]:
    """Each stage's plan with what the plan schema does not store re-derived: an input an
    earlier stage produces is a received activation (`Tensor.received`), and it needs a
    gradient when that stage computes one."""
    grad: set[str] = set()
    produced: set[str] = set()
    out = []
    for p in plans:
        g = p.graph
        received = {n for n, t in g.tensors.items() if t.role is Role.INPUT and n in produced}
        seeds = frozenset(n for n in received if n in grad)
        if received:
            tensors = {
                n: replace(t, received=True) if n in received else t for n, t in g.tensors.items()
            }
            g = make_graph(g.name, tensors, g.ops, seeds)
            p = replace(p, graph=g, cost=None)
        grad |= g.requires_grad
        produced.update(t for op in g.ops for t in op.outputs)
        out.append(p)
    return out


def from_json(text: str | bytes | dict[str, Any]) -> TrainingPlan:
    """Read a training plan written by `to_json`; PlanError (naming the field) when it is not
    one, is malformed or contradicts itself (module docstring)."""
    data = _parse(text)
    _check_top(data)
    try:
        plans = _with_incoming_grads([_stage_plan(s["plan"]) for s in data["stages"]])
        stages = tuple(
            Stage(
                p,
                Levers(
                    Recompute(s["recompute"]),
                    s["zero"],
                    **{lever: s.get(lever, False) for lever in _FLAGS},
                    bucket_elements=s.get("bucket_elements", 0),
                ),
            )
            for p, s in zip(plans, data["stages"], strict=True)
        )
        mesh = Mesh.from_dict(data["mesh"])
    except ValueError as e:  # an unknown recompute value
        raise PlanError(f"training plan JSON is malformed: {e}; {_FIX}") from e
    first = stages[0].plan
    problem = (  # a plan solved without a Problem (plan_training called directly) keeps none
        replace(
            plan_json.problem_from_dict(data.get("problem"), first.graph, mesh, first.options),
            build=None,
        )
        if data.get("problem") is not None or data["schema"] != SCHEMA
        else None
    )
    return TrainingPlan(
        data["model"],
        mesh,
        data["batch"],
        data["micro_batches"],
        stages,
        data["method"],
        data.get("tokens_per_sample", 1),
        tuple(data.get("axes", ())),
        float(data.get("search_seconds", 0.0)),
        tuple(data.get("notes", ())),
        virtual_stages=data.get("virtual_stages", 1),
        problem=problem,
        step_floor_s=None if data.get("step_floor_s") is None else float(data["step_floor_s"]),
    )


__all__ = ["SCHEMA", "from_json", "is_training_json", "to_dict", "to_json"]
