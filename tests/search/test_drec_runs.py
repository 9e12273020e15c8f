"""D-Rec's split runs (`search/drec/runs.py`): a walk that kept nothing is not walked again
while the strategies its rows read hold (`TriedWalk`), a follower's cut is remembered per the
strategies its row reads (`round_pick`), and neither changes a plan."""

from __future__ import annotations

import pytest

import shardplan as sp
from shardplan.cost import CostOptions
from shardplan.cost.evaluate import ScoreCache
from shardplan.search.drec import polish, runs

CASES = [
    ("bert-base", "30", dict(layers=1, batch=30, seq=128)),
    ("alexnet", "3x5", dict(batch=60)),
    ("moe", "12", dict(batch=6, seq=128)),  # a later pass finds a region where one failed
    ("resnet50", "12", {}),
]


@pytest.mark.parametrize(("model", "mesh", "sizes"), CASES)
def test_skipping_tried_walks_changes_no_plan(model, mesh, sizes, monkeypatch):
    graph = sp.zoo.build(model, **sizes)
    hits = []
    holds = runs.TriedWalk.holds

    def counted(self, rows, suffix):
        found = holds(self, rows, suffix)
        hits.append(found)
        return found

    monkeypatch.setattr(runs.TriedWalk, "holds", counted)
    skipping = sp.plan(graph, mesh)
    assert any(hits)  # the case skips walks
    monkeypatch.setattr(runs.TriedWalk, "holds", lambda self, rows, suffix: False)
    walking = sp.plan(graph, mesh)
    assert skipping.strategies == walking.strategies
    assert skipping.cost.total == walking.cost.total


def test_a_tried_walk_holds_until_an_op_its_rows_read_moves():
    graph = sp.zoo.build("bert-base", layers=1, batch=30, seq=128)
    mesh = sp.parse_mesh("30")
    cache = ScoreCache(graph, mesh, CostOptions.make())
    plan = dict(sp.plan(graph, mesh).strategies)  # settled: its walks keep nothing
    rows = polish._Rows(graph, mesh, plan, cache, None)
    assert not runs.split_runs(rows, {}, ())
    memo = rows.splits_tried[frozenset(), ()]
    assert memo
    (r, _), tried = max(memo.items(), key=lambda item: len(item[1].ops))
    suffix = runs.paid_suffix(rows, r, 1.0 - 1.0 / mesh.rounds[r].q)
    assert tried.holds(rows, suffix)
    read, name = tried.ops[-1], graph.ops[tried.ops[-1]].name
    before = rows.plan[name]
    other = next(s for s in runs.round_cuts(rows, read, r))
    rows.set(read, other)
    assert not tried.holds(rows, suffix)
    rows.set(read, before)
    assert tried.holds(rows, suffix)
    unread = next(
        i for i in range(len(graph.ops)) if i not in tried.ops and runs.round_cuts(rows, i, r)
    )
    rows.set(unread, runs.round_cuts(rows, unread, r)[0])
    assert tried.holds(rows, suffix)  # an op no row of the walk reads
    if tried.stop is not None:  # the bound where it stopped grew: it may walk further now
        grown = list(suffix)
        grown[tried.stop] = tried.bound * 2 + 1.0
        assert not tried.holds(rows, grown)


@pytest.mark.parametrize(("model", "mesh", "sizes"), CASES)
def test_remembered_follower_cuts_change_no_plan(model, mesh, sizes, monkeypatch):
    graph = sp.zoo.build(model, **sizes)
    remembered = sp.plan(graph, mesh)

    def priced(rows, e, r):  # every follower priced afresh
        current = rows.plan[rows.graph.ops[e].name]
        return runs.own_best(rows, e, [current, *runs.round_cuts(rows, e, r)])

    monkeypatch.setattr(runs, "round_pick", priced)
    afresh = sp.plan(graph, mesh)
    assert remembered.strategies == afresh.strategies


@pytest.mark.parametrize(("model", "mesh", "sizes"), CASES)
def test_remembered_pair_tries_change_no_plan(model, mesh, sizes, monkeypatch):
    """`polish._pair_moves` skips a pair whose rows read the strategies they read when it last
    moved nothing: the plan is the one trying every pair afresh gives."""
    graph = sp.zoo.build(model, **sizes)
    remembered = sp.plan(graph, mesh)
    pair_moves = polish._pair_moves

    def afresh(rows, i, twins, frozen, tried):
        return pair_moves(rows, i, twins, frozen, {})

    monkeypatch.setattr(polish, "_pair_moves", afresh)
    assert sp.plan(graph, mesh).strategies == remembered.strategies


def test_a_pair_is_tried_again_once_an_op_its_rows_read_moves():
    graph = sp.zoo.build("bert-base", layers=1, batch=30, seq=128)
    mesh = sp.parse_mesh("30")
    cache = ScoreCache(graph, mesh, CostOptions.make())
    rows = polish._Rows(graph, mesh, dict(sp.plan(graph, mesh).strategies), cache, None)
    tried: dict = {}
    assert not any(polish._pair_moves(rows, i, {}, (), tried) for i in range(len(graph.ops)))
    (i, _, j, _), seen = max(tried.items(), key=lambda item: len(item[1]))
    reads = polish._pair_reads(rows, i, j, {})
    assert {i, j} <= set(reads)
    assert {graph.producer[name] for name in graph.ops[j].inputs if name in graph.producer} <= set(
        reads
    )

    def now():
        return tuple(rows.plan[graph.ops[d].name] for d in reads)

    assert now() == seen
    other = next(d for d in reads if runs.round_cuts(rows, d, 0))
    rows.set(other, runs.round_cuts(rows, other, 0)[0])
    assert now() != seen  # the pair is priced again
