"""D-Rec's axis swaps (`search/drec/columns.py`): two rounds of equal ways on different mesh
axes exchange their cuts. Found probing 3-D meshes against the ILP: ViT-B/16 (1 layer, batch 40)
on 2x5x2, whose last axis is the fast one, was 1.125 of the optimum."""

from __future__ import annotations

import shardplan as sp
from shardplan.search.drec import columns, redecide, roundorder


def test_exchanged_swaps_rounds_of_equal_ways_on_different_axes_once_per_column_pair():
    mesh = sp.parse_mesh("2x5x2")  # rounds: 2 (axis 0), 5 (axis 1), 2 (axis 2)
    plan = {"a": ("b", "b", "n"), "c": ("d0", "d0", "d1")}
    assert list(columns.exchanged(mesh, plan)) == [{"a": ("n", "b", "b"), "c": ("d1", "d0", "d0")}]
    assert list(columns.exchanged(mesh, {"a": ("b", "n", "b")})) == []  # alike columns
    assert list(columns.exchanged(sp.parse_mesh("8"), {"a": ("b", "n", "k")})) == []  # 1 axis
    # 4x4: rounds 2, 2 | 2, 2; equal column pairs across the axes are tried once
    out = list(columns.exchanged(sp.parse_mesh("4x4"), {"a": ("b", "b", "n", "n")}))
    assert out == [{"a": ("n", "b", "b", "n")}]


def test_vit_on_2x5x2_takes_the_hidden_units_on_the_slow_axis(monkeypatch):
    graph, mesh = sp.zoo.build("vit-b16", layers=1, batch=40), sp.parse_mesh("2x5x2")
    exact = sp.plan(graph, mesh, method="ilp", time_limit=120)  # optimal in under a second
    found = sp.plan(graph, mesh)
    assert found.cost.total <= exact.cost.total * 1.02
    assert found.strategies["block.0.mlp.fc.linear"][0] == "n"  # the slow axis of 2
    monkeypatch.setattr(columns, "TRIED", 0)
    _one_axis_order(monkeypatch)
    assert sp.plan(graph, mesh).cost.total > exact.cost.total * 1.1


def test_copied_gives_a_round_another_rounds_cuts_where_an_op_may_take_them():
    graph = sp.zoo.build("mlp", batch=4)
    mesh = sp.parse_mesh("2x2")
    names = [op.name for op in graph.ops]
    plan = {name: ("b", None) for name in names}
    out = list(columns.copied(graph, mesh, plan, lambda i, s: i != 0))
    assert (
        out
        == [  # round 0 takes round 1's cuts, then round 1 takes round 0's
            {names[0]: ("b", None), **{n: (None, None) for n in names[1:]}},
            {names[0]: ("b", None), **{n: ("b", "b") for n in names[1:]}},
        ]
    )
    plan = {name: ("b", "b") for name in names}  # alike columns: nothing to copy
    assert list(columns.copied(graph, mesh, plan, lambda i, s: True)) == []


def test_vit_on_2x2x7_gives_round_0_the_hidden_units_of_round_1(monkeypatch):
    graph, mesh = sp.zoo.build("vit-b16", layers=2, batch=28), sp.parse_mesh("2x2x7")
    exact = sp.plan(graph, mesh, method="ilp", time_limit=120)
    found = sp.plan(graph, mesh)
    assert found.cost.total <= exact.cost.total * 1.02
    assert found.strategies["block.0.mlp.fc.linear"][:2] == ("n", "n")
    monkeypatch.setattr(columns, "TRIED", 0)
    _one_axis_order(monkeypatch)
    assert sp.plan(graph, mesh).cost.total > exact.cost.total * 1.1


def test_bert_on_28_polishes_the_lowest_copy_when_none_scores_below_the_plan(monkeypatch):
    """Round 0 taking round 2's batch cut moves the embeddings too: as copied it scores above
    the plan, polished (the embeddings split along their width again, `runs.split_runs` seeding
    each region with the cut its first op's row prices lowest) it is the ILP optimum."""
    from shardplan.search.drec import runs

    graph = sp.zoo.build("bert-base", layers=1, batch=56, seq=160)
    mesh = sp.parse_mesh("28")
    exact = sp.plan(graph, mesh, method="ilp", time_limit=120)  # optimal in about a second
    found = sp.plan(graph, mesh)
    assert found.cost.total <= exact.cost.total * 1.01
    assert found.strategies["layer.0.mlp.fc.linear"][0] == "b"  # round 0 took the batch
    monkeypatch.setattr(redecide, "redecided_rounds", lambda mesh: [])  # which reaches it too
    monkeypatch.setattr(columns, "ABOVE", 0)
    assert sp.plan(graph, mesh).cost.total > exact.cost.total * 1.04
    monkeypatch.setattr(columns, "ABOVE", 1)
    monkeypatch.setattr(runs, "own_best", lambda rows, k, options: options[0] if options else None)
    assert sp.plan(graph, mesh).cost.total > exact.cost.total * 1.04  # the first dim: the batch


def _one_axis_order(monkeypatch):
    """No rounds tried across axes (`roundorder.py`) nor round 0 decided again last
    (`redecide.py`), which reach this case's plan too."""
    monkeypatch.setattr(roundorder, "largest_overall", lambda mesh: None)
    monkeypatch.setattr(roundorder, "innermost_first", lambda mesh: None)
    monkeypatch.setattr(redecide, "redecided_rounds", lambda mesh: [])
