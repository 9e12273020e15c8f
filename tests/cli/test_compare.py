"""`shardplan compare`: one table with every method, honest statuses, JSON rows."""

import json

import pytest

from shardplan.cli.main import main


def test_compare_prints_every_method(tmp_path, capsys):
    out_file = tmp_path / "rows.json"
    assert main(["compare", "mlp", "--small", "--mesh", "8", "--json", str(out_file)]) == 0
    out = capsys.readouterr().out
    for word in (
        "drec",
        "ilp",
        "dp",
        "data-parallel",
        "megatron",
        "fsdp",
        "optimal",
        "cost / best",
    ):
        assert word in out
    data = json.loads(out_file.read_text())
    rows = {r["method"]: r for r in data["rows"]}
    assert set(rows) == {"drec", "ilp", "dp", "data-parallel", "megatron", "fsdp"}
    assert rows["ilp"]["status"] == "optimal" and rows["dp"]["status"] == "optimal"
    assert rows["ilp"]["total"] == pytest.approx(rows["dp"]["total"], rel=1e-6)
    best = min(r["total"] for r in rows.values())
    assert rows["ilp"]["total"] == pytest.approx(best, rel=1e-6)
    for r in rows.values():
        assert r["ok"] and r["cost_over_best"] >= 1 - 1e-6
        assert r["memory_per_device_bytes"] > 0 and r["search_seconds"] >= 0


def test_compare_reports_failures_as_statuses(tmp_path, capsys):
    out_file = tmp_path / "rows.json"
    code = main(
        [
            "compare",
            "gpt2-small",
            "--small",
            "--mesh",
            "8",
            "--methods",
            "drec,ilp,dp",
            "--time-limit",
            "0.001",
            "--json",
            str(out_file),
        ]
    )
    assert code == 0
    rows = {r["method"]: r for r in json.loads(out_file.read_text())["rows"]}
    assert rows["drec"]["ok"]
    for method in ("ilp", "dp"):
        assert not rows[method]["ok"]
        assert rows[method]["status"].startswith("did not finish within 0.001 s")
    assert "did not finish" in capsys.readouterr().out


def test_compare_memory_budget_marks_infeasible(tmp_path, capsys):
    out_file = tmp_path / "rows.json"
    args = ["compare", "mlp", "--small", "--mesh", "8", "--methods", "ilp,megatron"]
    assert main([*args, "--memory", "1KB", "--json", str(out_file)]) == 1  # no plan at all
    rows = json.loads(out_file.read_text())["rows"]
    assert [r["status"].split(":")[0] for r in rows] == ["infeasible", "infeasible"]
    assert "infeasible" in capsys.readouterr().out


def test_compare_rejects_unknown_methods(capsys):
    assert main(["compare", "mlp", "--mesh", "8", "--methods", "drec,magic"]) == 2
    assert "magic" in capsys.readouterr().err
