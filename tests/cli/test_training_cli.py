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
    assert "model FLOP/s per device" in captured.out and "node axis:" in captured.out
    assert "S=1" not in captured.err  # progress lines on a terminal only (docs/cli.md)
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
    assert "is a training plan (pipeline stages" in err and "not a shardplan plan" not in err


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
        assert "model FLOP/s per device" in capsys.readouterr().out


def test_overlap_flags_reach_the_plan_and_its_breakdown(tmp_path, capsys):
    out_file = tmp_path / "train.json"
    args = ["plan", "gpt3", "--small", "--batch", "8", "--mesh", "4x2", "--dtype", "bf16"]
    recipe = [*args, "--method", "megatron-recipe", "--pipeline", "2", "--virtual-stages", "2"]
    assert main([*recipe, "--overlap-grad-reduce", "--json", str(out_file), "-q"]) == 0
    out = capsys.readouterr().out
    assert "p2p hidden under compute (not counted)" in out  # the recipe's default when interleaved
    lv = training_json.from_json(out_file.read_text()).stages[0].levers
    assert lv.overlap_grad_reduce and lv.overlap_p2p
    assert main([*recipe, "--no-overlap-p2p", "--json", str(out_file), "-q"]) == 0
    assert "p2p hidden" not in capsys.readouterr().out
    assert not training_json.from_json(out_file.read_text()).stages[0].levers.overlap_p2p


def test_overlap_flags_that_do_not_apply_are_refused(capsys):
    args = ["plan", "gpt3", "--small", "--batch", "8", "--mesh", "4x2", "--dtype", "bf16"]
    assert main([*args, "--method", "megatron-recipe", "--prefetch"]) == 9
    assert "--prefetch overlaps ZeRO-3's gathers" in capsys.readouterr().err
    assert main([*args, "--target", "torchtitan", "--overlap-p2p"]) == 2
    assert "torchtitan never overlaps pipeline sends" in capsys.readouterr().err


def test_tp_comm_overlap_flag_reaches_the_search_and_the_recipe(tmp_path, capsys):
    out_file = tmp_path / "train.json"
    args = ["plan", "gpt2-small", "--small", "--batch", "8", "--mesh", "2x4", "--dtype", "bf16"]
    args += ["--memory", "80GB", "-q", "--json", str(out_file)]

    def levers():
        return [s.levers for s in training_json.from_json(out_file.read_text()).stages]

    assert main(args) == 0
    assert not any(lv.tp_comm_overlap for lv in levers())  # off unless asked for
    assert main([*args, "--tp-comm-overlap"]) == 0
    on = levers()
    assert any(lv.tp_comm_overlap for lv in on)  # the search priced it and kept it
    assert all(lv.tp_comm_overlap == lv.sequence_parallel for lv in on)  # only with SP
    recipe = [*args, "--method", "megatron-recipe", "--tensor", "2", "--pipeline", "2"]
    assert main([*recipe, "--sequence-parallel", "--tp-comm-overlap"]) == 0
    assert {(lv.sequence_parallel, lv.tp_comm_overlap) for lv in levers()} == {(True, True)}
    assert main([*recipe, "--sequence-parallel", "--no-tp-comm-overlap"]) == 0
    assert not any(lv.tp_comm_overlap for lv in levers())
    capsys.readouterr()
    assert main([*recipe, "--tp-comm-overlap"]) != 0  # the recipe needs sequence parallelism
    assert "--tp-comm-overlap needs --sequence-parallel" in capsys.readouterr().err
    assert main([*args, "--target", "megatron", "--tp-comm-overlap"]) == 0  # a switch it has
    assert all(lv.tp_comm_overlap == lv.sequence_parallel for lv in levers())

