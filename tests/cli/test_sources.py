"""Model sources of the CLI: --hf, --torch, --onnx (need the torch/onnx extras)."""

import json
import textwrap

import pytest

from shardplan.cli.main import main

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_hf_gpt2_small_version(tmp_path, capsys):
    out = tmp_path / "p.json"
    code = main(["plan", "--hf", "gpt2", "--layers", "1", "--hidden", "64", "--heads", "4",
                 "--batch", "4", "--seq", "16", "--mesh", "2x2", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["model"] == "gpt2" and data["ops"]


def test_hf_unknown_name_is_a_clear_error(capsys):
    assert main(["plan", "--hf", "gpt5", "--mesh", "2"]) == 2
    assert "not supported offline" in capsys.readouterr().err


def test_torch_module_function(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_models.py").write_text(textwrap.dedent("""
        import torch
        def build():
            return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 8))
    """))
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "--torch", "my_models:build", "--args", "16x32", "--mesh", "4"]) == 0
    assert "summary" in capsys.readouterr().out


def test_two_sources_are_rejected(capsys):
    assert main(["plan", "mlp", "--hf", "gpt2", "--mesh", "2"]) == 2
    assert "exactly one model" in capsys.readouterr().err


def test_onnx_file(tmp_path, capsys):
    pytest.importorskip("onnx")
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    path = tmp_path / "m.onnx"
    torch.onnx.export(model, (torch.randn(8, 16),), str(path), dynamo=False)
    assert main(["plan", "--onnx", str(path), "--mesh", "2", "--ops", "all"]) == 0
    out = capsys.readouterr().out
    assert "summary" in out and ("Gemm" in out or "linear" in out or "matmul" in out)


def test_verify_with_the_torch_engine(capsys):
    code = main(["verify", "mlp", "--small", "--mesh", "2", "--method", "megatron",
                 "--engine", "torch"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.startswith("OK: mlp (megatron) on mesh 2")
