"""`shardplan compare`: one table with every method, honest statuses, JSON rows."""

import json

import pytest

from shardplan.cli.main import main


def test_compare_prints_every_method(tmp_path, capsys):
    out_file = tmp_path / "rows.json"
    args = ["compare", "mlp", "--small", "--mesh", "8", "--exact", "--json", str(out_file)]
    assert main(args) == 0
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
    assert not rows["dp"]["ok"]
    assert rows["dp"]["status"].startswith("did not finish within 0.001 s")
    # the ILP had no plan of its own: D-Rec's plan is its incumbent, and the status says so
    assert rows["ilp"]["ok"] and rows["ilp"]["total"] == rows["drec"]["total"]
    assert (
        rows["ilp"]["status"]
        == "did not finish: no ILP plan, D-Rec's plan kept (not proven optimal)"
    )
    out = capsys.readouterr().out
    assert "did not finish" in out
    assert all(len(line) <= 100 for line in out.splitlines())


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


def test_compare_defaults_to_drec_and_the_expert_plans(tmp_path, capsys):
    out_file = tmp_path / "rows.json"
    assert main(["compare", "mlp", "--small", "--mesh", "4", "--json", str(out_file)]) == 0
    rows = json.loads(out_file.read_text())["rows"]
    assert [r["method"] for r in rows] == ["drec", "data-parallel", "megatron", "fsdp"]


def test_compare_plot_writes_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "compare.png"
    assert main(["compare", "mlp", "--small", "--mesh", "4", "--plot", str(png), "-q"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
