"""Model sources of the CLI: --hf, --torch, --onnx (need the torch/onnx extras)."""

import json
import textwrap

import pytest

from shardplan.cli.main import main

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_hf_gpt2_small_version(tmp_path, capsys):
    out = tmp_path / "p.json"
    code = main(
        [
            "plan",
            "--hf",
            "gpt2",
            "--layers",
            "1",
            "--hidden",
            "64",
            "--heads",
            "4",
            "--batch",
            "4",
            "--seq",
            "16",
            "--mesh",
            "2x2",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    data = json.loads(out.read_text())
    assert data["model"] == "gpt2" and data["ops"]


def test_hf_unknown_name_is_a_clear_error(capsys):
    assert main(["plan", "--hf", "gpt5", "--mesh", "2"]) == 2
    assert "not supported offline" in capsys.readouterr().err


def test_torch_module_function(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_models.py").write_text(
        textwrap.dedent("""
        import torch
        def build():
            return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                       torch.nn.Linear(64, 8))
    """)
    )
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
    code = main(
        ["verify", "mlp", "--small", "--mesh", "2", "--method", "megatron", "--engine", "torch"]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.startswith("OK: mlp (megatron) on mesh 2")


def test_hf_local_config_folder_and_file(tmp_path, capsys):
    config = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_layer": 1,
        "n_embd": 32,
        "n_head": 2,
        "vocab_size": 128,
        "n_positions": 32,
        "bos_token_id": 0,
        "eos_token_id": 0,
    }
    folder = tmp_path / "tiny-gpt2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    out = tmp_path / "p.json"
    args = ["--batch", "2", "--seq", "8", "--mesh", "2", "-q", "--json", str(out)]
    assert main(["plan", "--hf", str(folder), *args]) == 0
    data = json.loads(out.read_text())
    assert data["model"] == str(folder)
    names = [op["name"] for op in data["ops"]]
    assert any(n.startswith("transformer.h.0.mlp.c_fc.") for n in names)  # module paths
    assert (
        main(["show", "--hf", str(folder / "config.json"), "--batch", "2", "--seq", "8", "-q"]) == 0
    )
    assert main(["show", "--hf", str(tmp_path / "missing.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_unsupported_op_names_the_cli_flag(tmp_path, monkeypatch, capsys):
    (tmp_path / "inv_models.py").write_text(
        textwrap.dedent("""
        import torch
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(8, 8)
            def forward(self, x):
                return torch.erfinv(torch.tanh(self.fc(x)))
        def build():
            return M()
    """)
    )
    monkeypatch.chdir(tmp_path)
    assert main(["show", "--torch", "inv_models:build", "--args", "8x8"]) == 7
    err = " ".join(capsys.readouterr().err.split())
    assert "--unknown replicate" in err and "unknown='replicate'" not in err
    assert (
        main(["show", "--torch", "inv_models:build", "--args", "8x8", "--unknown", "replicate"])
        == 0
    )
    assert "replicated (opaque, never cut): 1" in capsys.readouterr().err


def test_unknown_replicate_takes_an_op_with_several_results(tmp_path, monkeypatch, capsys):
    # lu_factor: 3 results (LU, pivots, info) and an error check behind an effect token
    (tmp_path / "lu_models.py").write_text(
        textwrap.dedent("""
        import torch
        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(4, 4)
            def forward(self, x):
                lu, pivots = torch.linalg.lu_factor(self.fc(x).reshape(-1, 2, 2))
                return lu.sum() + pivots.sum()
        def build():
            return M()
    """)
    )
    monkeypatch.chdir(tmp_path)
    args = ["plan", "--torch", "lu_models:build", "--args", "4x4", "--mesh", "2"]
    assert main(args) == 7
    assert "linalg_lu_factor_ex" in capsys.readouterr().err
    assert main([*args, "--unknown", "replicate"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert "replicated (opaque, never cut): 1" in err
    assert "(aten.linalg_lu_factor_ex.default): 3 results" in err
