"""The training-step search and the Megatron recipe on degenerate input (issue 28 items 1, 2,
7, 8): a plan or a typed error naming the argument, never a crash or an empty stage."""

from __future__ import annotations

import math

import pytest

from shardplan import zoo
from shardplan.cost import CostOptions
from shardplan.errors import ArgumentError, MeshError, PlanError
from shardplan.exporters import plan_json, training_json
from shardplan.mesh import parse_mesh
from shardplan.search.step.recipes import megatron_recipe
from shardplan.search.step.search import micro_batch_options, plan_training

BF16 = CostOptions.make(dtype="bf16")


def _gpt(batch: int):
    return zoo.build("gpt2-small", small=True, batch=batch)


def test_a_batch_smaller_than_the_outer_axis_is_planned():
    assert micro_batch_options(1, parse_mesh("2x4")) == [1]
    tp = plan_training(_gpt, 1, parse_mesh("2x4"), BF16, None)
    assert tp.batch == 1 and tp.micro_batches == 1
    training_json.from_json(training_json.to_json(tp))


def test_the_cli_plans_batch_1_on_2x4(tmp_path, capsys):
    from shardplan.cli.main import main

    out = tmp_path / "t.json"
    args = ["plan", "gpt2-small", "--small", "--batch", "1", "--mesh", "2x4", "--dtype", "bf16"]
    assert main([*args, "--json", str(out)]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert training_json.from_json(out.read_text()).batch == 1


def test_more_stages_than_segments_is_a_plan_error_never_empty_stages():
    with pytest.raises(PlanError, match="16 pipeline stages need at least as many segments"):
        plan_training(_gpt, 16, parse_mesh("16x1"), BF16, None, stages=[16])
    tp = megatron_recipe(_gpt, 16, parse_mesh("8x1"), BF16, tensor=1, pipeline=8)
    assert all(s.plan.graph.ops for s in tp.stages)
    names = [op.name for s in tp.stages for op in s.plan.graph.ops]
    assert names == [op.name for op in _gpt(16 // tp.micro_batches).ops]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"tensor": 0}, ArgumentError, "tensor degree"),
        ({"pipeline": 0}, ArgumentError, "pipeline degree"),
        ({"micro_batch_size": 0}, ArgumentError, "micro-batch size"),
        ({"tensor": 1.5}, ArgumentError, "tensor degree"),
        ({"pipeline": True}, ArgumentError, "pipeline degree"),
    ],
)
def test_degenerate_recipe_degrees(kwargs, error, match):
    args = {"tensor": 2, "pipeline": 2, **kwargs}
    with pytest.raises(error, match=match):
        megatron_recipe(_gpt, 16, parse_mesh("4x2"), BF16, **args)


@pytest.mark.parametrize(
    ("budget", "stages", "error", "match"),
    [
        (None, [0], ArgumentError, "pipeline stages"),
        (None, [3], PlanError, "3 pipeline stages must divide"),
        (None, [2.0], ArgumentError, "pipeline stages"),
        (math.nan, None, MeshError, "training memory budget"),
        (math.inf, None, MeshError, "training memory budget"),
        (-1.0, None, MeshError, "training memory budget"),
    ],
)
def test_degenerate_search_arguments(budget, stages, error, match):
    with pytest.raises(error, match=match):
        plan_training(_gpt, 16, parse_mesh("4x2"), BF16, budget, stages=stages)


def test_stages_of_one_structure_report_their_own_per_op_costs():
    four = lambda b: zoo.build("gpt2-small", small=True, batch=b, layers=4)  # noqa: E731
    tp = plan_training(four, 16, parse_mesh("4x1"), BF16, None, stages=[4])  # 33, 30, 30, 33 ops
    rows = [plan_json.op_rows(s.plan) for s in tp.stages]
    for stage, stage_rows in zip(tp.stages, rows, strict=True):
        assert stage.plan.cost is not None
        assert {c.name for c in stage.plan.cost.ops} == {op.name for op in stage.plan.graph.ops}
        assert sum(r["activation_bytes"] for r in stage_rows) > 0
    # stages of one structure (same ops in the same order) were priced once: the later one
    # shows the same per-op costs under its own names (it showed 0 for every op)
    kinds = [tuple(op.kind for op in s.plan.graph.ops) for s in tp.stages]
    pairs = [(a, b) for a in range(4) for b in range(a + 1, 4) if kinds[a] == kinds[b]]
    assert pairs
    for a, b in pairs:
        assert [r["activation_bytes"] for r in rows[a]] == [r["activation_bytes"] for r in rows[b]]
        assert [r["comm"] for r in rows[a]] == [r["comm"] for r in rows[b]]
