"""Training-plan JSON: exact round trip, every field checked, contradictions refused (issue 28
items 3, 5, 6)."""

from __future__ import annotations

import copy
import json

import pytest

from shardplan import zoo
from shardplan.cost import CostOptions
from shardplan.errors import PlanError
from shardplan.exporters import training_json
from shardplan.mesh import parse_mesh
from shardplan.search.scale import plan_training
from shardplan.training import evaluate_training

BF16 = CostOptions.make(dtype="bf16")


def _gpt(batch: int):
    return zoo.build("gpt2-small", small=True, batch=batch)


@pytest.fixture(scope="module")
def two_stages():
    return plan_training(_gpt, 16, parse_mesh("4x2"), BF16, None, stages=[2])


@pytest.fixture
def data(two_stages):
    return training_json.to_dict(two_stages)


def test_round_trip_keeps_that_incoming_activations_need_a_gradient(two_stages):
    back = training_json.from_json(training_json.to_json(two_stages))
    for a, b in zip(two_stages.stages, back.stages, strict=True):
        assert a.plan.graph.requires_grad == b.plan.graph.requires_grad
    entry = next(
        t
        for t, x in back.stages[1].plan.graph.tensors.items()
        if x.role.value == "input" and t in back.stages[0].plan.graph.producer
    )
    assert entry in back.stages[1].plan.graph.requires_grad
    assert back.step == evaluate_training(two_stages)  # re-scored exactly, not approximately
    assert training_json.to_json(back) == training_json.to_json(two_stages)
    assert back.step_floor_s == two_stages.step_floor_s is not None  # the search's certificate


def _swap(d):
    d["stages"].reverse()


def _delete_first(d):
    d["stages"].pop(0)
    d["pipeline_stages"] = 1


def _delete_last(d):
    d["stages"].pop()
    d["pipeline_stages"] = 1


def _set(key, value):
    def edit(d):
        d[key] = value

    return edit


def _mesh_bandwidth(d):
    d["mesh"]["bandwidth_bytes_per_s"][0] *= 2  # the stage meshes keep the old links


def _mesh_shape(d):
    d["mesh"]["shape"] = [2, 4]


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (_swap, "first_index"),
        (_delete_first, "first_index"),
        (_delete_last, "model_ops"),
        (lambda d: d["stages"].pop(), "pipeline_stages"),
        (_mesh_bandwidth, "stage 0 runs on mesh"),
        (_mesh_shape, "stage 0 runs on mesh"),
        (_set("tokens_per_sample", -3), "tokens_per_sample"),
        (_set("search_seconds", float("nan")), "search_seconds"),
        (_set("search_seconds", float("inf")), "search_seconds"),
        (_set("step_floor_s", float("nan")), "step_floor_s"),
        (_set("step_floor_s", -1.0), "step_floor_s"),
        (_set("micro_batches", 1.5), "micro_batches"),
        (_set("micro_batches", "2"), "micro_batches"),
        (_set("micro_batches", 0), "micro_batches"),
        (_set("micro_batches", float("inf")), "micro_batches"),
        (_set("batch", 1e308), "batch"),
        (_set("batch", 10**400), "batch"),
        (_set("micro_batch_size", 3), "micro_batch_size"),
        (_set("model", None), "model"),
        (lambda d: d["stages"][0].update(zero=7), "zero"),
        (lambda d: d["stages"][0].update(recompute="sometimes"), "sometimes"),
        (lambda d: d["stages"][1].update(first_op="x"), "first_op"),
    ],
)
def test_corrupt_training_plans_are_plan_errors(data, edit, match):
    d = copy.deepcopy(data)
    edit(d)
    with pytest.raises(PlanError, match=match):
        training_json.from_json(json.dumps(d))


def test_deep_nesting_and_garbage_are_plan_errors(data):
    deep = '{"schema": "shardplan.training/1", "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
    with pytest.raises(PlanError, match="nested"):
        training_json.from_json(deep)
    with pytest.raises(PlanError, match="does not parse"):
        training_json.from_json("{")
    d = copy.deepcopy(data)
    d["notes"] = [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["x"]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]
    with pytest.raises(PlanError, match="nested deeper"):
        training_json.from_json(d)


def test_verify_of_a_corrupt_training_file_is_one_line_and_exit_5(data, tmp_path, capsys):
    from shardplan.cli.main import main

    d = copy.deepcopy(data)
    d["micro_batches"] = 0
    path = tmp_path / "t.json"
    path.write_text(json.dumps(d))
    assert main(["verify", str(path), "--engine", "torch"]) == 5
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: PlanError: ") and "micro_batches" in err[0]


@pytest.fixture(scope="module")
def tp_overlap():
    import shardplan

    return shardplan.plan(
        _gpt, "2x4", "megatron-recipe", batch=8, dtype="bf16", tensor=2, pipeline=2,
        sequence_parallel=True, tp_comm_overlap=True,
    )  # fmt: skip


def test_tp_comm_overlap_round_trips_per_stage_and_older_files_read_it_off(tp_overlap):
    assert {s.levers.tp_comm_overlap for s in tp_overlap.stages} == {True}
    d = training_json.to_dict(tp_overlap)
    assert [s["tp_comm_overlap"] for s in d["stages"]] == [True, True]
    back = training_json.from_json(json.dumps(d))
    assert [s.levers for s in back.stages] == [s.levers for s in tp_overlap.stages]
    assert back.step == tp_overlap.step
    for s in d["stages"]:  # a file written before the lever existed
        del s["tp_comm_overlap"]
    old = training_json.from_json(json.dumps(d))
    assert {s.levers.tp_comm_overlap for s in old.stages} == {False}
    assert old.step is not None and old.step.step_s >= tp_overlap.step.step_s


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda s: s.update(tp_comm_overlap="yes"), r"stages\[0\].tp_comm_overlap"),
        (lambda s: s.update(sequence_parallel=False), "tp_comm_overlap"),
    ],
)
def test_a_bad_tp_comm_overlap_is_a_plan_error(tp_overlap, edit, match):
    d = training_json.to_dict(tp_overlap)
    edit(d["stages"][0])
    with pytest.raises(PlanError, match=match):
        training_json.from_json(json.dumps(d))
