"""D-Rec's compound run moves (`search/drec/compound.py`): one region cut in two rounds at once.
Found by benchmarks/quality_random.py --axes 3 (seed 31: a DeepSeek-MoE-style model, 2 layers,
batch 30, sequence 192, on 3x5 left replicated, where the optimum cuts the language-model head
along the sequence over 3 and the vocabulary over 5: 1.055 of the ILP optimum)."""

from __future__ import annotations

import pytest

import shardplan as sp
from shardplan.cost import CostOptions
from shardplan.cost.evaluate import ScoreCache
from shardplan.plans import Plan
from shardplan.search.drec import compound, polish

MOE = dict(layers=2, batch=30, seq=192)
HEAD = ("ln_f.norm", "lm_head.linear", "loss")


@pytest.fixture(scope="module")
def case():
    return sp.zoo.build("deepseek-moe", **MOE), sp.parse_mesh("3x5")


def test_neither_round_alone_pays_but_both_together_do(case):
    graph, mesh = case
    replicated = {op.name: (None, None) for op in graph.ops}
    cost = Plan(graph, mesh, replicated, "x", CostOptions.make()).cost.total

    def with_head(head):
        cuts = dict(zip(HEAD, head, strict=True))
        return Plan(graph, mesh, {**replicated, **cuts}, "x", CostOptions.make()).cost.total

    tokens = with_head([("d1", None), ("m", None), ("d1", None)])  # round 0 alone
    vocab = with_head([(None, None), (None, "n"), (None, "d0")])  # round 1 alone
    both = with_head([("d1", None), ("m", "n"), ("d1", "d0")])
    assert tokens > cost and vocab > cost  # what split_runs, one round at a time, rejects
    assert both < cost * 0.96


def test_the_compound_move_cuts_the_head_in_both_rounds(case):
    graph, mesh = case
    cache = ScoreCache(graph, mesh, CostOptions.make())
    replicated = {op.name: (None, None) for op in graph.ops}
    rows = polish._Rows(graph, mesh, dict(replicated), cache, None)
    assert compound.compound_runs(rows, {}, ())
    head = [rows.plan[name] for name in HEAD]
    assert all(cut[0] is not None for cut in head[1:])  # cut in both rounds
    assert head[1][1] is not None
    before = Plan(graph, mesh, replicated, "x", CostOptions.make()).cost.total
    after = Plan(graph, mesh, rows.plan, "x", CostOptions.make()).cost.total
    assert after < before


def test_drec_reaches_the_optimum_there(case, monkeypatch):
    graph, mesh = case
    optimum = sp.plan(graph, mesh, "ilp", time_limit=60)
    found = sp.plan(graph, mesh)
    assert found.cost.total <= optimum.cost.total * (1 + 1e-6)
    monkeypatch.setattr(polish, "compound_runs", lambda *args, **kwargs: False)
    without = sp.plan(graph, mesh)
    assert without.cost.total > found.cost.total * 1.03  # what the move adds


def test_a_pinned_op_is_never_moved(case):
    graph, mesh = case
    cache = ScoreCache(graph, mesh, CostOptions.make())
    rows = polish._Rows(graph, mesh, {op.name: (None, None) for op in graph.ops}, cache, None)
    frozen = {graph.op_index["lm_head.linear"]}
    compound.compound_runs(rows, {}, frozen)
    assert rows.plan["lm_head.linear"] == (None, None)


def test_idle_rounds_take_a_head_cut_in_a_later_round(monkeypatch):
    """benchmarks/quality_random.py --axes 3, seed 35: the same model, batch 30, sequence 96, on
    2x5x2: D-Rec left both leading rounds idle and cut the head along the vocabulary in the
    last only; the optimum cuts it along the vocabulary in the idle rounds too, the loss along
    the tokens (1.070 -> 1.005). On that shape of plan the idle-round walks find it."""
    graph = sp.zoo.build("deepseek-moe", layers=2, batch=30, seq=96)
    mesh = sp.parse_mesh("2x5x2")
    cache = ScoreCache(graph, mesh, CostOptions.make())
    plan = {op.name: (None, None, None) for op in graph.ops}
    plan.update({"lm_head.linear": (None, None, "n"), "loss": (None, None, "d0")})
    before = Plan(graph, mesh, dict(plan), "x", CostOptions.make()).cost.total
    rows = polish._Rows(graph, mesh, dict(plan), cache, None)
    assert compound.compound_runs(rows, {}, ())
    assert all(cut is not None for cut in rows.plan["lm_head.linear"])  # the idle rounds too
    after = Plan(graph, mesh, rows.plan, "x", CostOptions.make()).cost.total
    assert after < before * 0.9
    monkeypatch.setattr(compound, "_idle_rounds", lambda rows: [])  # no idle-round walks
    rows = polish._Rows(graph, mesh, dict(plan), cache, None)
    compound.compound_runs(rows, {}, ())
    assert rows.plan["lm_head.linear"][:2] == (None, None)
    optimum = sp.plan(graph, mesh, "ilp", time_limit=60)
    assert sp.plan(graph, mesh).cost.total <= optimum.cost.total * 1.01


def test_two_idle_rounds_cut_a_head_left_whole_in_both(monkeypatch):
    """benchmarks/quality_random.py, seed 46: the same model, 1 layer, batch 50, sequence 64, on
    5x5, left replicated; the optimum cuts the head along the vocabulary in both rounds and the
    loss along the tokens (1.173 -> 1.000)."""
    graph = sp.zoo.build("deepseek-moe", layers=1, batch=50, seq=64)
    mesh = sp.parse_mesh("5x5")
    optimum = sp.plan(graph, mesh, "ilp", time_limit=60)
    found = sp.plan(graph, mesh)
    assert found.cost.total <= optimum.cost.total * 1.001
    assert all(cut is not None for cut in found.strategies["lm_head.linear"])
    monkeypatch.setattr(compound, "_idle_rounds", lambda rows: [])
    without = sp.plan(graph, mesh)
    assert without.cost.total > found.cost.total * 1.1
