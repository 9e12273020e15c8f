"""D-Rec's stream moves (`search/drec/streams.py`): one round dropped on a stream of
transparent ops that pass tensors to one another split alike. Found by
benchmarks/quality_random.py --axes 3 (seed 11: an MoE model, 3 layers, batch 24, on 2x2x3 split
its residual stream along the hidden units, each norm gathering it: 1.121 of the ILP optimum)."""

from __future__ import annotations

import shardplan as sp
from shardplan.cost import CostOptions
from shardplan.cost.evaluate import ScoreCache
from shardplan.search.drec import polish, redecide, roundorder, streams

MOE = dict(layers=3, batch=24, seq=64)
STREAM = ("attn.out.bias_add", "residual_1", "shared_add", "residual_2")


def _without_streams(monkeypatch):
    graph, mesh = sp.zoo.build("deepseek-moe", **MOE), sp.parse_mesh("2x2x3")
    monkeypatch.setattr(polish, "stream_moves", lambda *args, **kwargs: False)
    _one_axis_order(monkeypatch)
    plan = sp.plan(graph, mesh)
    monkeypatch.undo()
    return graph, mesh, plan


def test_the_residual_stream_is_one_stream_of_transparent_ops(monkeypatch):
    graph, mesh, plan = _without_streams(monkeypatch)
    cache = ScoreCache(graph, mesh, CostOptions.make())
    rows = polish._Rows(graph, mesh, dict(plan.strategies), cache, None)
    split = [r for r in range(3) if plan.strategies["layer.0.residual_1"][r] is not None]
    assert split  # D-Rec alone splits the residual stream in some round
    found = streams._streams(rows, split[0], (), streams._wanted(rows))
    names = [{graph.ops[i].name for i in s} for s in found]
    stream = next(s for s in names if "layer.0.residual_1" in s)
    assert {f"layer.{k}.{n}" for k in range(3) for n in STREAM} <= stream
    assert not any(n.endswith(".linear") or n.endswith(".norm") for n in stream)


def test_dropping_a_round_on_the_stream_lowers_the_plan(monkeypatch):
    graph, mesh, without = _without_streams(monkeypatch)
    found = sp.plan(graph, mesh)
    assert found.cost.total < without.cost.total * 0.97
    dropped = [
        r
        for r in range(3)
        if without.strategies["layer.1.residual_1"][r] is not None
        and all(found.strategies[f"layer.{k}.residual_1"][r] is None for k in range(3))
    ]
    assert dropped  # the stream left whole in a round D-Rec alone split it in


def test_a_pair_polish_never_raises_the_total(monkeypatch):
    graph, mesh, without = _without_streams(monkeypatch)
    cache = ScoreCache(graph, mesh, CostOptions.make())
    before = polish.plan_score(graph, mesh, cache.opts, 0.0, None, cache, without.strategies)
    after = polish.polish(graph, mesh, without.strategies, cache, pairs=True)
    assert polish.plan_score(graph, mesh, cache.opts, 0.0, None, cache, after) <= before


def _one_axis_order(monkeypatch):
    """No rounds tried across axes (`roundorder.py`) nor round 0 decided again last
    (`redecide.py`), which reach this case's plan too."""
    monkeypatch.setattr(roundorder, "largest_overall", lambda mesh: None)
    monkeypatch.setattr(roundorder, "innermost_first", lambda mesh: None)
    monkeypatch.setattr(redecide, "redecided_rounds", lambda mesh: [])
