"""`shardplan verify`: a zoo model or a plan.json, numerics and communication, typed errors."""

from __future__ import annotations

import json
import os
import sys

import pytest

jax = pytest.importorskip("jax")

from shardplan.cli import verify as cli_verify  # noqa: E402
from shardplan.cli.main import build_parser, main  # noqa: E402
from shardplan.errors import MissingDependencyError, UnsupportedOpError  # noqa: E402
from shardplan.exporters.plan_json import to_json  # noqa: E402


def test_verify_is_registered():
    args = build_parser().parse_args(["verify", "mlp", "--small", "--mesh", "8", "--infer"])
    assert args.run is cli_verify.run_verify and args.train is False
    args = build_parser().parse_args(["verify", "plan.json"])
    assert args.train is None and args.mesh is None


def test_verify_model_prints_numerics_and_communication(devices8, capsys, tmp_path):
    out = tmp_path / "report.json"
    code = main(
        [
            "verify",
            "mlp",
            "--small",
            "--batch",
            "8",
            "--mesh",
            "8",
            "--method",
            "data-parallel",
            "--json",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert code == 0
    assert "numerics: OK" in text and "max error" in text and "tolerance" in text
    assert "(float64)" in text and "1e-09" in text  # numerics in float64 by default
    assert "all-reduce" in text and "predicted" in text and "measured" in text and "1.000" in text
    data = json.loads(out.read_text())
    assert data["numerics"]["ok"] is True
    kinds = {k["kind"]: k for k in data["communication"]["kinds"]}
    assert kinds["all-reduce"]["ratio"] == pytest.approx(1.0)
    assert data["plan"]["method"] == "data-parallel"


def test_verify_plan_json_lists_causes(devices8, capsys, tmp_path):
    plan_file = tmp_path / "plan.json"
    assert (
        main(
            [
                "plan",
                "gpt2-small",
                "--small",
                "--batch",
                "8",
                "--mesh",
                "2x4",
                "--method",
                "megatron",
                "--ops",
                "none",
                "--json",
                str(plan_file),
            ]
        )
        == 0
    )
    capsys.readouterr()
    code = main(
        ["verify", str(plan_file), "--infer", "--differences", "3", "--check-dtype", "float32"]
    )
    text = capsys.readouterr().out
    assert code == 0 and "numerics: OK" in text and "forward pass" in text
    assert "(float32)" in text and "0.0001" in text
    assert "mesh 2x4" in text and "causes" in text


def test_verify_needs_a_mesh_for_a_model(capsys):
    assert main(["verify", "mlp", "--small"]) == 5
    assert "--mesh" in capsys.readouterr().err


def test_too_few_devices_is_a_backend_error(capsys):
    code = main(
        ["verify", "mlp", "--small", "--batch", "64", "--mesh", "64", "--method", "data-parallel"]
    )
    err = capsys.readouterr().err
    assert code == 10 and "BackendError" in err
    assert "XLA_FLAGS=--xla_force_host_platform_device_count=64" in err


def test_missing_jax_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "jax", None)
    with pytest.raises(MissingDependencyError, match=r"shardplan\[jax\]"):
        from shardplan.engines import jax as jb

        jb.jax_mesh("8")
    code = main(["verify", "mlp", "--small", "--mesh", "8", "--method", "data-parallel"])
    assert code == 8 and "shardplan[jax]" in capsys.readouterr().err  # markup kept


def test_op_without_jax_kernel_is_unsupported(devices8, capsys, tmp_path):
    from shardplan.importers.jaxpr import from_jaxpr
    from shardplan.search import plan

    def f(p, x):
        return jax.numpy.cumsum(x @ p, axis=1).sum()

    with pytest.warns(UserWarning):
        g = from_jaxpr(f, jax.numpy.ones((8, 8)), jax.numpy.ones((8, 8)), unknown="replicate")
    plan_file = tmp_path / "opaque.json"
    plan_file.write_text(to_json(plan(g, "8", "data-parallel")))
    code = main(["verify", str(plan_file)])
    err = capsys.readouterr().err
    assert code == UnsupportedOpError.exit_code and "opaque" in err


def test_ensure_devices_sets_the_flag_only_before_jax(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_foo=1 --xla_force_host_platform_device_count=2")
    monkeypatch.delitem(sys.modules, "jax")  # as if jax had not started (restored afterwards)
    cli_verify.ensure_devices(16)
    assert os.environ["XLA_FLAGS"] == "--xla_cpu_foo=1 --xla_force_host_platform_device_count=16"
    cli_verify.ensure_devices(4)  # already enough
    assert os.environ["XLA_FLAGS"].endswith("=16")
    monkeypatch.setenv("XLA_FLAGS", "")
    cli_verify.ensure_devices(8)
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"
    monkeypatch.setitem(sys.modules, "jax", jax)  # jax already started: leave XLA_FLAGS alone
    monkeypatch.setenv("XLA_FLAGS", "")
    cli_verify.ensure_devices(32)
    assert os.environ["XLA_FLAGS"] == ""
