import json

import pytest

from shardplan.cli.main import main


def test_models_lists_every_zoo_model(capsys):
    from shardplan.zoo import MODELS

    assert main(["models"]) == 0
    out = capsys.readouterr().out
    for name in MODELS:
        assert name in out


def test_show_prints_ops(capsys):
    assert main(["show", "gpt2-small", "--small"]) == 0
    out = capsys.readouterr().out
    assert "h.0.attn.q.linear" in out and "linear" in out


def test_plan_writes_json(tmp_path, capsys):
    out_file = tmp_path / "plan.json"
    assert main(["plan", "gpt2-small", "--small", "--mesh", "2x2", "--json", str(out_file)]) == 0
    data = json.loads(out_file.read_text())
    for key in ("model", "mesh", "method", "search_seconds", "cost", "ops"):
        assert key in data
    assert data["model"] == "gpt2-small" and "total" in data["cost"]
    assert {"name", "kind", "strategy", "in_strategy"} <= set(data["ops"][0])
    assert "summary" in capsys.readouterr().out


def test_errors_have_exit_codes(capsys):
    assert main(["plan", "gpt9", "--mesh", "8"]) == 2
    assert "no zoo model 'gpt9'" in capsys.readouterr().err
    assert main(["plan", "mlp", "--mesh", "8x"]) == 4
    assert main(["plan", "mlp", "--mesh", "8", "--memory", "1KB"]) == 6
    assert main(["plan", "mlp", "--mesh", "8", "--memory", "lots"]) == 4


def test_plan_with_a_zero_stage_says_so_and_saves_it(tmp_path, capsys):
    from shardplan.exporters.plan_json import from_json

    out_file = tmp_path / "plan.json"
    args = ["plan", "gpt2-small", "--small", "--mesh", "2x2", "--method", "data-parallel"]
    assert main([*args, "--zero", "2", "--json", str(out_file)]) == 0
    out = capsys.readouterr().out
    assert "ZeRO" in out and "stage 2: optimizer state, master weights and gradients" in out
    data = json.loads(out_file.read_text())
    assert data["options"]["zero"] == 2
    assert data["cost"]["collective_bytes"]["reduce-scatter"] > 0
    assert from_json(data).zero == 2


def test_zero_flag_errors(capsys):
    args = ["plan", "gpt2-small", "--small", "--mesh", "2x2"]
    with pytest.raises(SystemExit):  # argparse: not a stage
        main([*args, "--zero", "5"])
    assert "invalid choice: 5" in capsys.readouterr().err
    assert main([*args, "--zero", "1", "--infer"]) != 0
    assert "inference does not have" in capsys.readouterr().err
    assert main([*args, "--zero", "1", "--dtype", "bf16"]) == 9
    assert "--zero sets the ZeRO stage of a single SPMD plan" in capsys.readouterr().err


def test_a_plan_file_replanned_with_force_keeps_its_budget(tmp_path, capsys):
    first, again = tmp_path / "p.json", tmp_path / "q.json"
    args = ["plan", "gpt2-small", "--small", "--mesh", "2x4", "--memory", "30MB"]
    assert main([*args, "--json", str(first), "-q"]) == 0
    stored = json.loads(first.read_text())
    assert stored["problem"]["budget"] == 30e6
    force = ["--force", "h.0.mlp.fc=n,-,-", "--json", str(again), "-q"]
    assert main(["plan", str(first), "--mesh", "2x4", *force]) == 0
    replanned = json.loads(again.read_text())
    assert replanned["problem"]["budget"] == 30e6
    assert replanned["cost"]["memory_per_device_bytes"] <= 30e6
    capsys.readouterr()


def test_an_interleaved_training_plan_prints_one_row_per_device_group(capsys):
    # v chunks per device: the step has S device rows, the plan S x v chunks
    code = main(
        ["plan", "gpt2-small", "--mesh", "2x4", "--batch", "32", "--dtype", "bf16", "--method",
         "megatron-recipe", "--tensor", "2", "--pipeline", "2", "--virtual-stages", "2"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "interleaved 1F1B, 2 chunks per device" in out
    assert "(m + (S - 1)/v slots)" in out
    assert out.count(" chunks)") == 2  # one row per device group, each holding 2 chunks
