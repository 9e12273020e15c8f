"""`shardplan verify --engine torch --user-module`: the user's module through `parallelize`."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from shardplan.cli.main import main  # noqa: E402

MODULE = """
import torch


def build():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return model, (torch.randn(4, 8),)
"""


def test_user_module_trains_equal_to_one_process(tmp_path, monkeypatch, capsys):
    (tmp_path / "user_mlp.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "report.json"
    code = main(
        [
            "verify",
            "--torch",
            "user_mlp:build",
            "--engine",
            "torch",
            "--user-module",
            "--mesh",
            "2",
            "--method",
            "data-parallel",
            "--json",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert code == 0, text
    assert "OK" in text and "| all-reduce |" in text
    report = json.loads(out.read_text())
    assert report["ok"] and report["measured_counts"]["all-reduce"] > 0  # gradient sync
    assert report["parallel_losses"] == pytest.approx(report["reference_losses"], rel=1e-12)


@pytest.mark.parametrize("extra", [["--engine", "jax"], []])
def test_user_module_needs_torch_engine_and_a_torch_module(extra, capsys):
    code = main(["verify", "gpt2-small", "--small", "--mesh", "2", "--user-module", *extra])
    assert code == 2  # ArgumentError: a usage error
    assert "--user-module" in capsys.readouterr().err
