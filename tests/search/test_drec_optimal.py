"""D-Rec reaches the exact optimum (the ILP, an independent method) on cases its greedy used to
miss: a round of 3 on models sized in powers of two (mesh 12 = 2 x 2 x 3), where pricing the
first rounds' all-reduces as if that round would shrink them, pricing a cut without the credits
it makes another reader repay, or ordering heavy ops by their dearest cut left it 3-9 % above
the optimum (benchmarks/quality.py at 6cfe1a9: moe 1.092, wide-deep 1.030, gpt2-large 1.010)."""

from __future__ import annotations

import pytest

import shardplan as sp


@pytest.mark.parametrize(
    ("model", "sizes"),
    [("moe", {}), ("wide-deep", {}), ("gpt2-large", {"layers": 1})],
)
def test_drec_matches_the_ilp_on_mesh_12(model, sizes):
    graph, mesh = sp.zoo.build(model, **sizes), sp.parse_mesh("12")
    exact = sp.plan(graph, mesh, method="ilp", time_limit=120)  # optimal in about 1 s
    drec = sp.plan(graph, mesh, method="drec")
    assert drec.cost.total <= exact.cost.total * (1 + 1e-9)


@pytest.mark.parametrize(
    ("model", "within"),
    # D-Rec / ILP at c1648f8: bert-large 1.127 (attention scores took the batch cut before q, k
    # and v, priced one by one, chose heads), gpt3-175b 1.121 (the tied output layer's
    # contraction cut left the round of 3 whole logits to all-reduce)
    [("bert-large", 1.05), ("gpt3-175b", 1.02)],
)
def test_drec_near_the_ilp_where_rounds_differ(model, within):
    graph, mesh = sp.zoo.build(model, layers=1), sp.parse_mesh("12")
    exact = sp.plan(graph, mesh, method="ilp", time_limit=120)  # optimal in 0.3-1.5 s
    drec = sp.plan(graph, mesh, method="drec")
    assert drec.cost.total <= exact.cost.total * within
