"""A pipelined training plan on torch.distributed.pipelining: 2 stages x 2-way tensor parallel
on 4 gloo processes (PipelineStage + Schedule1F1B, 4 micro-batches), loss and every gradient
equal to the single-process run in float64. One run (process start-up dominates its time)."""

import json

import pytest

pytest.importorskip("torch")

from shardplan import zoo  # noqa: E402
from shardplan.cli.main import main  # noqa: E402
from shardplan.cost import CostOptions  # noqa: E402
from shardplan.exporters import training_json  # noqa: E402
from shardplan.mesh import parse_mesh  # noqa: E402
from shardplan.search.step.recipes import megatron_recipe  # noqa: E402


def _megatron_plan_file(tmp_path):
    """Megatron's recipe for small GPT-2 on 2x2 (pipeline 2, tensor 2), saved as JSON."""
    tp = megatron_recipe(
        lambda b: zoo.build("gpt2-small", small=True, batch=b),
        4,
        parse_mesh("2x2"),
        CostOptions.make(dtype="bf16"),
        tensor=2,
        pipeline=2,
    )
    plan_file = tmp_path / "train.json"
    plan_file.write_text(training_json.to_json(tp))
    return tp, plan_file


def test_pipeline_plan_runs_with_1f1b_and_matches_one_process(tmp_path, capsys):
    tp, plan_file = _megatron_plan_file(tmp_path)
    assert tp.pipeline_stages == 2 and tp.micro_batches == 4
    assert tp.axes == ("node axis: pipeline x2", "gpu axis: tensor x2")
    report_file = tmp_path / "report.json"
    args = ["verify", str(plan_file), "--engine", "torch", "--json", str(report_file)]
    assert main(args) == 0, capsys.readouterr().out
    report = json.loads(report_file.read_text())
    assert report["world_size"] == 4 and report["micro_batches"] == 4
    assert report["failed"] == []
    assert report["loss"] == pytest.approx(report["reference_loss"], rel=1e-9)
    # every parameter of the model, the tied embedding once (its two stages' gradients summed)
    assert report["grads_checked"] == len(zoo.build("gpt2-small", small=True).parameters)
    assert report["worst_grad_ratio"] <= 1.0
    assert "OK" in capsys.readouterr().out


def test_a_training_plan_needs_the_torch_engine(tmp_path, capsys):
    _, plan_file = _megatron_plan_file(tmp_path)
    assert main(["verify", str(plan_file)]) == 9
    assert "verify it with --engine torch" in capsys.readouterr().err


def test_a_one_stage_training_plan_verifies(tmp_path, capsys):
    """S = 1: the only stage both feeds the batch and takes the loss (was a TypeError inside
    torch's schedule, exit 10). 1 stage x 2 devices, 2 micro-batches."""
    tp = megatron_recipe(
        lambda b: zoo.build("gpt2-small", small=True, batch=b),
        4,
        parse_mesh("1x2"),
        CostOptions.make(dtype="bf16"),
        tensor=2,
        pipeline=1,
        micro_batch_size=2,
    )
    assert tp.pipeline_stages == 1 and tp.micro_batches == 2
    plan_file = tmp_path / "train.json"
    plan_file.write_text(training_json.to_json(tp))
    report_file = tmp_path / "report.json"
    args = ["verify", str(plan_file), "--engine", "torch", "--json", str(report_file)]
    assert main(args) == 0, capsys.readouterr()
    report = json.loads(report_file.read_text())
    assert report["failed"] == [] and report["loss"] == pytest.approx(report["reference_loss"])
