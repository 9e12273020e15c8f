"""`explain`, `--force` and `diff` through the CLI entry point."""

from __future__ import annotations

import json
import math

import pytest

from shardplan.cli.main import main
from shardplan.exporters.plan_json import from_json
from shardplan.plans import Plan

# a small GPT-2 whose h.0.mlp.fc is cut on this mesh (the default --small one replicates it)
MODEL = [
    "gpt2-small",
    "--small",
    "--batch",
    "16",
    "--seq",
    "128",
    "--hidden",
    "256",
    "--heads",
    "4",
    "--mesh",
    "2x2",
    "-q",
]
FC = "h.0.mlp.fc.linear"


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    folder = tmp_path_factory.mktemp("explain")
    plan_file = folder / "plan.json"
    assert main(["plan", *MODEL, "--json", str(plan_file)]) == 0
    explained = folder / "explain.json"
    assert (
        main(["explain", *MODEL, "--op", "h.0.mlp.fc", "--replan", "--json", str(explained)]) == 0
    )
    return from_json(plan_file.read_text()), json.loads(explained.read_text()), folder


def test_explain_lists_every_candidate_with_terms_that_add_up(planned):
    p, data, _ = planned
    assert data["op"] == FC and data["plan_total"] == pytest.approx(p.cost.total, rel=1e-12)
    for r in range(len(p.mesh.rounds)):
        valid = [c for c in data["candidates"] if c["round"] == r and "total" in c]
        assert len(valid) >= 3
        assert sum(c["chosen"] for c in valid) == 1
        for c in valid:
            parts = math.fsum((c["intra"], c["compute"], c["redistribution"], c["rest"]))
            assert parts == pytest.approx(c["total"], rel=1e-9)
            assert c["redistribution"] == pytest.approx(
                math.fsum(e["cost"] for e in c["edges"]), rel=1e-12, abs=1e-30
            )
            # the same swap scored independently: a Plan built from the strategies alone
            strategies = dict(p.strategies)
            strategies[FC] = tuple(c["strategy"])
            swapped = Plan(p.graph, p.mesh, strategies, "swap", p.options)
            assert swapped.cost.total == pytest.approx(c["total"], rel=1e-9)
            assert swapped.cost.memory_per_device == pytest.approx(
                c["memory_per_device_bytes"], rel=1e-9
            )
            if c["chosen"]:
                assert c["total"] == pytest.approx(p.cost.total, rel=1e-9)
    # not every candidate costs the same: the explanation discriminates
    assert len({round(c["total"], 15) for c in data["candidates"] if "total" in c}) > 2


def test_force_keeps_the_strategy_and_matches_explain_replanned(planned, capsys):
    p, data, folder = planned
    alternative = next(c for c in data["candidates"] if "total" in c and not c["chosen"])
    text = ",".join(d or "-" for d in alternative["strategy"])
    out_file = folder / "forced.json"
    assert main(["plan", *MODEL, "--force", f"h.0.mlp.fc={text}", "--json", str(out_file)]) == 0
    out = capsys.readouterr().out
    assert "vs unforced" in out
    forced = from_json(out_file.read_text())  # validates every strategy
    assert tuple(forced.strategies[FC]) == tuple(alternative["strategy"])
    assert forced.cost.total == pytest.approx(alternative["replanned_total"], rel=1e-9)
    # the search re-planned the rest around it: never worse than just swapping the one op
    assert forced.cost.total <= alternative["total"] * (1 + 1e-9)


def test_force_readable_name_on_every_round(tmp_path, capsys):
    out_file = tmp_path / "forced.json"
    assert main(["plan", *MODEL, "--force", "h.0.mlp.fc=row", "--json", str(out_file)]) == 0
    forced = from_json(out_file.read_text())
    assert forced.strategies[FC] == ("k", "k")


def test_force_on_a_saved_plan_replans_its_problem(tmp_path, capsys):
    saved, direct, again = (tmp_path / f"{n}.json" for n in ("saved", "direct", "again"))
    assert main(["plan", *MODEL, "--json", str(saved)]) == 0
    force = ["--force", "h.0.mlp.fc=row"]
    assert main(["plan", *MODEL, *force, "--json", str(direct)]) == 0
    assert main(["plan", str(saved), "--mesh", "2x2", *force, "--json", str(again), "-q"]) == 0
    assert "vs unforced" in capsys.readouterr().out
    a, b = (from_json(f.read_text()) for f in (direct, again))
    assert b.strategies[FC] == ("k", "k")
    assert b.strategies == a.strategies and b.cost.total == pytest.approx(a.cost.total, rel=1e-12)


def test_force_with_the_ilp(tmp_path, capsys):
    out_file = tmp_path / "forced.json"
    args = ["plan", "mlp", "--small", "--mesh", "4", "--method", "ilp", "-q"]
    assert main([*args, "--json", str(tmp_path / "free.json")]) == 0
    free = from_json((tmp_path / "free.json").read_text())
    op = next(o for o in free.graph.ops if o.kind == "linear")
    dims = [d.name for d in op.signature.loop_dims if d.splittable]
    pick = next(d for d in dims if free.strategies[op.name] != (d, d))
    assert main([*args, "--force", f"{op.name}={pick}", "--json", str(out_file)]) == 0
    forced = from_json(out_file.read_text())
    assert forced.strategies[op.name] == (pick, pick)
    assert forced.cost.total >= free.cost.total * (1 - 1e-9)  # the free ILP optimum is a bound


def test_force_errors_name_the_op_and_the_choices(capsys):
    assert main(["plan", *MODEL, "--force", "h.0.mlp.fcc=row"]) == 5
    assert "did you mean" in capsys.readouterr().err
    assert main(["plan", *MODEL, "--force", "h.0.mlp.fc=zz"]) == 5
    err = capsys.readouterr().err
    assert "'zz' is not a loop dim" in err and "k (row)" in err
    assert main(["plan", *MODEL, "--force", "h.0.mlp.fc=k,k,k"]) == 5
    assert "one cut per round" in capsys.readouterr().err
    assert main(["plan", *MODEL, "--method", "megatron", "--force", "h.0.mlp.fc=k"]) == 9


def test_explain_layer_and_plan_file(planned, capsys):
    p, _, folder = planned
    assert main(["explain", str(folder / "plan.json"), "--layer", "0", "-q"]) == 0
    out = capsys.readouterr().out
    assert "h.0.mlp.fc.linear" in out and "best other" in out


def test_diff_lists_the_ops_that_differ(planned, tmp_path, capsys):
    p, _, folder = planned
    other = tmp_path / "megatron.json"
    assert main(["plan", *MODEL, "--method", "megatron", "--json", str(other)]) == 0
    q = from_json(other.read_text())
    expected = [op.name for op in p.graph.ops if p.strategies[op.name] != q.strategies[op.name]]
    out_file = tmp_path / "diff.json"
    assert main(["diff", str(folder / "plan.json"), str(other), "--json", str(out_file)]) == 0
    data = json.loads(out_file.read_text())
    assert [o["name"] for o in data["ops"]] == expected and expected
    assert data["total_b"] - data["total_a"] == pytest.approx(q.cost.total - p.cost.total)
    assert f"{len(expected)} of {len(p.graph.ops)} ops differ" in capsys.readouterr().out
