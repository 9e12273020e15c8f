"""`shardplan plan ... --dtype`: the training-step plan on the command line."""

import json
from pathlib import Path

from shardplan.cli.main import main
from shardplan.exporters import training_json


def test_plan_with_dtype_prints_stages_and_the_step_and_writes_json(tmp_path, capsys):
    out_file = tmp_path / "train.json"
    args = ["plan", "gpt2-small", "--small", "--batch", "16", "--mesh", "4x2", "--dtype", "bf16"]
    assert main([*args, "--memory", "80GB", "--json", str(out_file)]) == 0
    captured = capsys.readouterr()
    assert "training step (predicted)" in captured.out
    assert "model TFLOP/s per device" in captured.out and "node axis:" in captured.out
    assert "S=1" in captured.err  # progress on stderr
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


def test_hf_config_is_reimported_at_each_micro_batch(capsys):
    # a published config cut to 1 layer of width 64: the search tries several micro-batch sizes
    hf = str(Path(__file__).resolve().parents[1] / "data" / "hf" / "llama3-8b")
    sizes = ["--layers", "1", "--hidden", "64", "--heads", "4", "--seq", "8", "--batch", "8"]
    args = ["plan", "--hf", hf, *sizes, "--mesh", "2x2", "--dtype", "bf16", "--memory", "80GB"]
    assert main([*args, "-q"]) == 0
    out = capsys.readouterr()
    assert "training step (predicted)" in out.out
    assert "cannot be rebuilt" not in out.err


def test_zoo_llms_plan_a_training_step(capsys):
    for name in ("llama3-8b", "mixtral-8x7b", "deepseek-v3"):
        args = ["plan", name, "--small", "--batch", "8", "--mesh", "2x4", "--dtype", "bf16"]
        assert main([*args, "--memory", "80GB"]) == 0
        assert "model TFLOP/s per device" in capsys.readouterr().out
