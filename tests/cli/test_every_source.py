"""Every model source x every command, through the CLI entry point, at tiny sizes.

Sources: a zoo model, --hf (an offline architecture), --torch MODULE:FUNCTION, --onnx FILE.
Commands: show, plan, compare, explain, verify (JAX, data-parallel plans so collectives run).
The Hugging Face import (torch.export of a built model) is the slow step: it runs once for real
and is memoised for the other commands (their CLI paths are unchanged).
"""

from __future__ import annotations

import functools
import json
import sys
import textwrap

import pytest

from shardplan.cli.main import main

torch = pytest.importorskip("torch")

COMMANDS = ("show", "plan", "compare", "explain", "verify")


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    pytest.importorskip("transformers")
    pytest.importorskip("onnx")
    folder = tmp_path_factory.mktemp("sources")
    (folder / "tiny_cli_models.py").write_text(
        textwrap.dedent("""
            import torch

            def build():
                torch.manual_seed(0)
                return torch.nn.Sequential(
                    torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8)
                )
        """)
    )
    sys.path.insert(0, str(folder))
    import tiny_cli_models

    onnx_path = folder / "tiny.onnx"
    torch.onnx.export(tiny_cli_models.build(), (torch.randn(8, 16),), str(onnx_path), dynamo=False)
    from shardplan.importers import hf

    real = hf.import_hf
    mp = pytest.MonkeyPatch()
    mp.setattr(hf, "import_hf", functools.cache(real))
    hf_args = [
        "--hf",
        "gpt2",
        "--layers",
        "1",
        "--hidden",
        "32",
        "--heads",
        "2",
        "--batch",
        "4",
        "--seq",
        "8",
    ]
    yield {
        "zoo": (
            ["gpt2-small", "--small", "--layers", "1", "--batch", "4", "--seq", "16"],
            "h.0.mlp.fc",
        ),
        "hf": (hf_args, "transformer.h.0.mlp.c_fc"),
        "torch": (["--torch", "tiny_cli_models:build", "--args", "8x16"], "0"),
        "onnx": (["--onnx", str(onnx_path)], "/0/Gemm_output_0/mm"),
    }
    mp.undo()
    sys.path.remove(str(folder))


def _args(command: str, source: list[str], op: str, tmp_path) -> list[str]:
    if command == "show":
        return ["show", *source, "--limit", "5", "-q"]
    if command == "plan":
        return ["plan", *source, "--mesh", "2", "-q", "--json", str(tmp_path / "p.json")]
    if command == "compare":
        return ["compare", *source, "--mesh", "2", "-q", "--json", str(tmp_path / "c.json")]
    if command == "explain":
        return [
            "explain",
            *source,
            "--mesh",
            "2",
            "--op",
            op,
            "-q",
            "--json",
            str(tmp_path / "e.json"),
        ]
    return [
        "verify",
        *source,
        "--mesh",
        "2",
        "--method",
        "data-parallel",
        "-q",
        "--json",
        str(tmp_path / "v.json"),
    ]


@pytest.mark.parametrize("source", ["zoo", "hf", "torch", "onnx"])
@pytest.mark.parametrize("command", COMMANDS)
def test_every_source_every_command(sources, source, command, tmp_path, capsys, request):
    if command == "verify":
        request.getfixturevalue("devices8")
    args, op = sources[source]
    code = main(_args(command, args, op, tmp_path))
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "Traceback" not in out.err
    if command == "show":
        assert "ops" in out.out and "params" in out.out
    elif command == "plan":
        data = json.loads((tmp_path / "p.json").read_text())
        assert data["ops"] and data["cost"]["total"] > 0
        assert "summary" in out.out and "axis" in out.out
    elif command == "compare":
        rows = json.loads((tmp_path / "c.json").read_text())["rows"]
        assert [r["method"] for r in rows] == ["drec", "data-parallel", "megatron", "fsdp"]
        assert rows[0]["ok"]
    elif command == "explain":
        data = json.loads((tmp_path / "e.json").read_text())
        valid = [c for c in data["candidates"] if "total" in c]
        assert len(valid) >= 2
        assert any(c["chosen"] for c in valid)
    else:
        data = json.loads((tmp_path / "v.json").read_text())
        assert data["numerics"]["ok"] is True
        assert data["communication"]["measured_total"] > 0
