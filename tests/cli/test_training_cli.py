"""`shardplan plan ... --dtype`: the training-step plan on the command line."""

import json

from shardplan.cli.main import main
from shardplan.exporters import training_json


def test_plan_with_dtype_prints_stages_and_the_step_and_writes_json(tmp_path, capsys):
    out_file = tmp_path / "train.json"
    args = ["plan", "gpt2-small", "--small", "--batch", "16", "--mesh", "4x2", "--dtype", "bf16"]
    assert main([*args, "--memory", "80GB", "--json", str(out_file)]) == 0
    captured = capsys.readouterr()
    assert "training step (predicted)" in captured.out
    assert "model FLOP/s per device" in captured.out and "node axis:" in captured.out
    assert "S=1" not in captured.err  # progress lines on a terminal only (docs/cli.md)
    data = json.loads(out_file.read_text())
    assert data["schema"] == "shardplan.training/1" and data["model"] == "gpt2-small"
    assert training_json.from_json(data).micro_batches == data["micro_batches"]


def test_dtype_needs_drec_and_training(capsys):
    args = ["plan", "gpt2-small", "--small", "--mesh", "2x2", "--dtype", "bf16"]
    assert main([*args, "--method", "ilp"]) == 9
    assert "--dtype plans a training step with method drec" in capsys.readouterr().err


def test_dtype_without_a_published_rate_is_a_mesh_error(capsys):
    args = ["plan", "gpt2-small", "--small", "--mesh", "2x2", "--machine", "ascend910"]
    assert main([*args, "--dtype", "bf16"]) == 4
    assert "no published bf16 rate" in capsys.readouterr().err
