"""D-Rec's round swaps (`search/drec/swaps.py`): when the all-replicated plan beats every cut
plan, the best cut plans are tried with two rounds of one axis exchanged. Found by
benchmarks/quality_random.py (seed 5: Llama, 3 layers, batch 36, on 4x3 was 1.090 of the ILP
optimum, all replicated)."""

from __future__ import annotations

import shardplan as sp
from shardplan.cost import CostOptions, evaluate_strategies
from shardplan.search.drec import redecide, swaps, variants

LLAMA = dict(layers=3, batch=36, seq=128, hidden=1024, heads=16, kv_heads=4, ffn=2816, vocab=32000)


def test_swapped_rounds_exchange_rounds_of_one_axis_with_equal_ways():
    mesh = sp.parse_mesh("4x3")  # rounds: 2, 2 on axis 0; 3 on axis 1
    plan = {"a": ("b", "n", "b"), "c": ("b", "b", None)}
    out = list(swaps.swapped_rounds(mesh, plan))
    assert out == [{"a": ("n", "b", "b"), "c": ("b", "b", None)}]
    assert list(swaps.swapped_rounds(mesh, {"a": ("b", "b", "n")})) == []  # alike: nothing new
    assert list(swaps.swapped_rounds(sp.parse_mesh("2x2"), {"a": ("b", "n")})) == []  # 2 axes


def test_a_plan_that_cuts_is_kept_as_it_is():
    mesh = sp.parse_mesh("4x3")
    best = {"a": ("b", None, None)}
    tried = []
    out = swaps.with_round_swaps(mesh, [(best, 1.0)], best, 1.0, lambda p: tried.append(p))
    assert out == (best, 1.0) and not tried


def test_when_replication_wins_a_swapped_cut_plan_that_scores_lower_replaces_it():
    mesh = sp.parse_mesh("4x3")
    whole = {"a": (None, None, None)}
    cut = {"a": ("b", "n", "b")}
    scores = {("n", "b", "b"): 0.5}  # only the swapped plan, once improved, beats replication
    out = swaps.with_round_swaps(
        mesh, [(cut, 2.0), (whole, 1.0)], whole, 1.0, lambda p: (p, scores.get(p["a"], 3.0))
    )
    assert out == ({"a": ("n", "b", "b")}, 0.5)
    worse = swaps.with_round_swaps(mesh, [(cut, 2.0)], whole, 0.4, lambda p: (p, 0.5))
    assert worse == (whole, 0.4)  # kept: no swapped plan beat it


def test_llama_on_4x3_finds_a_cut_plan_below_replication():
    # the case that made the swaps: replication won; the polish's weight cuts now reach it too
    graph, mesh = sp.zoo.build("llama", **LLAMA), sp.parse_mesh("4x3")
    whole = {op.name: (None,) * len(mesh.rounds) for op in graph.ops}
    replicated = evaluate_strategies(graph, mesh, whole, CostOptions.make()).total
    assert sp.plan(graph, mesh).cost.total < replicated * 0.96


def test_a_search_with_pinned_readers_swaps_too(monkeypatch):
    # GPT-2 medium, 3 layers, batch 18, on 18 (benchmarks/quality_random.py --axes 3, seed 12):
    # with its tied readers pinned whole (tiedwhole.py) replication won every variant; the best
    # cut plan with its two rounds of 3 exchanged and polished is the ILP optimum
    graph = sp.zoo.build("gpt2-medium", layers=3, batch=18, seq=256)
    exact = sp.plan(graph, "18", method="ilp", time_limit=120)  # optimal in under a second
    assert sp.plan(graph, "18").cost.total <= exact.cost.total * 1.01
    original = variants._with_swaps

    def unpinned_only(*args):
        return args[7] if args[8] else original(*args)  # pinned: the variants' best, as it was

    monkeypatch.setattr(variants, "_with_swaps", unpinned_only)
    monkeypatch.setattr(redecide, "_seeded", lambda *args: None)  # which reach it too
    assert sp.plan(graph, "18").cost.total > exact.cost.total * 1.05
