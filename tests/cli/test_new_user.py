"""Issue 27, the CLI as a new user meets it: loud when nothing is split, each axis's link, size-1
axes, mesh text, suggestions, training plans given to explain, the --dtype table in 100 columns,
and `verify --user-module` on a hand-written model (conv stem, RMSNorm, attention, SwiGLU)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from shardplan.cli.main import main

USER_MODEL = Path(__file__).resolve().parents[1] / "torch" / "user_model.py"


def test_a_plan_that_splits_nothing_says_so_on_stderr_and_size_one_axes_are_unused(capsys):
    assert main(["plan", "gpt2-small", "--small", "--mesh", "2x4x1", "--ops", "none"]) == 0
    out, err = capsys.readouterr()
    assert "axis2 axis (1): unused (size 1)" in out
    assert "axis1 axis (4, intra-node 300 GB/s)" in out  # 8 devices: one node, NVLink
    assert "'axis2'" not in out  # the size-1 axis is in no note
    assert err.startswith("warning: nothing was split")
    assert "--memory" in err and "--method" in err and "larger batch" in err


def test_a_16_way_axis_crosses_8_gpu_nodes_and_says_so(capsys):
    assert main(["plan", "gpt2-small", "--small", "--mesh", "4x16", "--ops", "none", "-q"]) == 0
    out = capsys.readouterr().out
    assert "gpu axis (16, inter-node 25 GB/s)" in out
    assert "node axis (4, inter-node 25 GB/s)" in out


@pytest.mark.parametrize(("text", "code"), [("2X4", 0), ("2×4", 0), ("2*4", 4), ("2,4", 4)])
def test_mesh_text_is_sizes_joined_by_x(text, code, capsys):
    assert main(["plan", "mlp", "--small", "--mesh", text, "--ops", "none", "-q"]) == code
    if code:
        assert "joined by 'x'" in capsys.readouterr().err


def test_force_suggests_the_nearest_whole_name(capsys):
    assert main(["plan", "gpt2-small", "--mesh", "8", "--force", "h.0.mlp.fcc=row"]) == 5
    err = capsys.readouterr().err
    assert "did you mean 'h.0.mlp.fc'?" in err and "act" not in err


def test_an_unknown_hf_name_says_nothing_is_close(capsys):
    assert main(["plan", "--hf", "nosuch/model", "--mesh", "4"]) == 2
    err = capsys.readouterr().err
    assert "similar: []" not in err and "nothing is close" in err


def test_explain_on_a_training_plan_says_what_it_is(tmp_path, capsys):
    path = tmp_path / "train.json"
    args = ["plan", "gpt2-small", "--small", "--mesh", "2x2", "--dtype", "bf16"]
    assert main([*args, "--json", str(path)]) == 0
    capsys.readouterr()
    assert main(["explain", str(path), "--layer", "0"]) == 5
    err = capsys.readouterr().err
    assert "is a training plan" in err and "verify FILE --engine torch" in err
    assert "not a shardplan plan" not in err


def test_the_dtype_table_fits_100_columns_with_whole_op_names(capsys):
    args = ["plan", "gpt2-small", "--mesh", "4x8", "--batch", "64", "--dtype", "bf16"]
    assert main([*args, "--memory", "3GB"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100, out
    assert "S=" not in err  # progress on a terminal only
    for name in re.findall(r"(h\.\d+\.\w+) \.\.", out):  # each range's first op reads whole
        assert re.fullmatch(r"h\.\d+\.[a-z_0-9]+", name)
    assert "on stages 0" not in out and not re.search(r"\d\.\d{4,}|e\+\d", out)


def test_verify_says_nothing_was_split_under_its_verdict(capsys):
    pytest.importorskip("jax")
    args = ["verify", "gpt2-small", "--small", "--batch", "8", "--mesh", "2x4"]
    assert main(args) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "numerics: OK" in out and "warning: nothing was split" in out


def test_verify_user_module_trains_the_hand_written_megatron_plan(tmp_path, monkeypatch, capsys):
    pytest.importorskip("torch")
    shutil.copy(USER_MODEL, tmp_path / "user_model.py")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    report = tmp_path / "report.json"
    args = ["verify", "--torch", "user_model:build", "--mesh", "2x2", "--engine", "torch"]
    code = main([*args, "--user-module", "--method", "megatron", "--json", str(report)])
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads(report.read_text())
    assert data["ok"] and data["sharded_params"] == 6  # gate, up, down of both blocks
    assert data["max_param_error"] < 1e-9  # float64, 4 gloo processes against one
    assert "largest loss difference" in out
