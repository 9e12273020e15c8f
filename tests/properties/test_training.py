"""Invariants of the training-step planner on random zoo models, meshes (primes, 3-D), batches,
budgets, dtypes and machines (issue 28's property suite).

Every call `sp.plan(builder, mesh, method="step", ...)` returns a TrainingPlan or raises a typed
`ShardplanError`; a plan
* fits its budget (the step's memory per device <= the budget);
* has a step equal to its parts (pipeline + sync; pipeline = (m + S - 1) slots of which the
  bubble is S - 1) and re-scores exactly (`evaluate_training`);
* round-trips through its JSON exactly (the same JSON, the same step);
* has stages that are non-empty, ordered and cover the model at the micro-batch size once;
* is never slower than the Megatron recipe with one stage when that recipe fits the budget;
* is the same plan when planned again (deterministic).
CI runs the "ci" profile (few examples); `--hypothesis-profile=long` runs thousands.
"""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

import shardplan as sp
from shardplan import zoo
from shardplan.errors import ShardplanError
from shardplan.exporters import training_json
from shardplan.training import TrainingPlan, evaluate_training

MODELS = st.sampled_from(
    [
        ("gpt2-small", {"layers": 1}),
        ("gpt2-small", {"layers": 2}),
        ("gpt2-small", {"layers": 3, "hidden": 32}),
        ("bert-base", {"layers": 2}),
        ("vit-b16", {"layers": 2}),
        ("mlp", {}),
        ("moe", {}),
        ("wide-deep", {}),
    ]
)
MESHES = st.sampled_from(
    ["1", "2", "3", "4", "5", "7", "2x2", "2x3", "3x2", "2x4", "4x2", "1x4", "2x2x2", "3x2x2"]
)
BATCHES = st.sampled_from([1, 2, 3, 4, 6, 8, 16])
DTYPES = st.sampled_from([None, "bf16", "fp16", "fp32"])
MACHINES = st.sampled_from(["a100", "h100", "ascend910", "uniform"])
BUDGETS = st.one_of(st.none(), st.floats(1e4, 1e9).map(float))
REL = 1e-9


def _builder(name, sizes):
    return lambda b: zoo.build(name, small=True, batch=b, **sizes)


def _plan(model, mesh, batch, dtype, machine, budget, method="step", **options):
    name, sizes = model
    return sp.plan(_builder(name, sizes), mesh, method, batch=batch, dtype=dtype,
                   machine=machine, memory=budget, **options)  # fmt: skip


def _parts(tp: TrainingPlan) -> None:
    s = tp.step
    assert s is not None and all(math.isfinite(x) and x >= 0 for x in (s.step_s, s.sync_s))
    assert math.isclose(s.step_s, s.pipeline_s + s.sync_s + s.optimizer_s, rel_tol=REL)
    n, m, v = tp.pipeline_stages, tp.micro_batches, tp.virtual_stages
    assert math.isclose(  # interleaved 1F1B: (m + (S - 1) / v) slots, (S - 1) / v of them idle
        s.bubble_s * (m + (n - 1) / v), s.pipeline_s * (n - 1) / v, rel_tol=REL, abs_tol=1e-18
    )
    assert evaluate_training(tp) == s  # re-scored exactly


def _stages_cover(tp: TrainingPlan, model) -> None:
    name, sizes = model
    whole = zoo.build(name, small=True, batch=tp.batch // tp.micro_batches, **sizes)
    names = [op.name for st_ in tp.stages for op in st_.plan.graph.ops]
    assert all(st_.plan.graph.ops for st_ in tp.stages)
    assert names == [op.name for op in whole.ops]  # ordered, each op once, nothing left out


@given(MODELS, MESHES, BATCHES, DTYPES, MACHINES, BUDGETS)
def test_training_plans_fit_add_up_round_trip_and_repeat(
    model, mesh, batch, dtype, machine, budget
):
    try:
        tp = _plan(model, mesh, batch, dtype, machine, budget)
    except ShardplanError:
        return  # a typed error (infeasible budget, dtype the machine lacks, ...) is an answer
    assert isinstance(tp, TrainingPlan)
    if budget is not None:
        assert tp.step.memory_per_device <= budget * (1 + REL)
    _parts(tp)
    _stages_cover(tp, model)
    text = training_json.to_json(tp)
    back = training_json.from_json(text)
    assert training_json.to_json(back) == text and back.step == tp.step
    again = _plan(model, mesh, batch, dtype, machine, budget)
    assert training_json.to_dict(again) | {"search_seconds": 0} == training_json.to_dict(tp) | {
        "search_seconds": 0
    }
    try:
        recipe = _plan(model, mesh, batch, dtype, machine, budget, "megatron-recipe")
    except ShardplanError:
        return
    if budget is None or recipe.step.memory_per_device <= budget:
        assert tp.step.step_s <= recipe.step.step_s * (1 + REL)
