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
    assert "model TFLOP/s per device" in captured.out and "node axis:" in captured.out
    assert "S=1" in captured.err  # progress on stderr
    data = json.loads(out_file.read_text())
    assert data["schema"] == "shardplan.training/3" and data["model"] == "gpt2-small"
    assert training_json.from_json(data).micro_batches == data["micro_batches"]


def test_dtype_needs_a_training_method(capsys):
    args = ["plan", "gpt2-small", "--small", "--mesh", "2x2", "--dtype", "bf16"]
    assert main([*args, "--method", "ilp"]) == 9
    assert "--dtype plans a training step (--method step or megatron-recipe)" in (
        capsys.readouterr().err
    )


def test_spmd_only_flags_are_refused_in_one_line_not_ignored(capsys):
    args = ["plan", "gpt2-small", "--small", "--mesh", "2x2", "--dtype", "bf16"]
    for extra, said in (
        (["--force", "h.0.mlp.fc=row"], "--force pins one op"),
        (["--plot", "x.png"], "--plot draws a single SPMD plan"),
        (["--top", "3"], "--top lists one SPMD plan"),
        (["--tensor", "2"], "add --method megatron-recipe"),
    ):
        assert main([*args, *extra]) == 9
        err = capsys.readouterr().err.strip()
        assert said in err and len(err.splitlines()) == 1


def test_megatron_recipe_from_the_cli_with_its_knobs(tmp_path, capsys):
    out_file = tmp_path / "recipe.json"
    args = ["plan", "gpt3", "--small", "--batch", "8", "--mesh", "2x2", "--dtype", "bf16"]
    knobs = ["--method", "megatron-recipe", "--tensor", "2", "--pipeline", "2"]
    assert main([*args, *knobs, "--recompute", "selective", "--json", str(out_file)]) == 0
    assert "tensor x2, pipeline x2" in capsys.readouterr().out
    tp = training_json.from_json(out_file.read_text())
    assert tp.method == "megatron-recipe" and tp.pipeline_stages == 2
    assert {s.levers.recompute.value for s in tp.stages} == {"selective"}


def test_a_saved_training_plan_prints_and_spmd_commands_refuse_it(tmp_path, capsys):
    out_file = tmp_path / "t.json"
    args = ["plan", "gpt2-small", "--small", "--batch", "8", "--mesh", "2x2", "--dtype", "bf16"]
    assert main([*args, "--memory", "1GB", "--json", str(out_file), "-q"]) == 0
    capsys.readouterr()
    assert main(["plan", str(out_file), "--mesh", "2x2"]) == 0
    assert "training step (predicted)" in capsys.readouterr().out
    assert main(["explain", str(out_file), "--op", "h.0.mlp.fc"]) != 0
    err = capsys.readouterr().err
    assert "is a training plan (pipeline stages)" in err and "not a shardplan plan" not in err


def test_dtype_without_a_published_rate_is_a_mesh_error(capsys):
    args = ["plan", "gpt2-small", "--small", "--mesh", "2x2", "--machine", "ascend910"]
    assert main([*args, "--dtype", "bf16"]) == 4
    assert "no published bf16 rate" in capsys.readouterr().err
