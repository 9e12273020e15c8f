"""D-Rec's exact polish (`search/drec/polish.py`): a round priced under assumptions about the
rounds after it can pick a cut no later round repairs. On mesh 12 = 2 x 2 x 3 the round of 3 is
left unused, so round 0's price of an MoE down projection's weight-gradient all-reduce (assumed
shrunk 6 ways) and of its output's all-to-all (assumed to stay matched) were both wrong: it cut
the token groups where continuing the experts cut is cheaper (benchmarks/quality.py at e287b21:
qwen3-235b-a22b on 12, 1.158 of the ILP optimum; 1 layer 1.095, mixtral-8x7b 1 layer 1.019)."""

from __future__ import annotations

import pytest

import shardplan as sp
from shardplan.cost import CostOptions
from shardplan.cost.evaluate import ScoreCache, evaluate_strategies
from shardplan.search.drec import columns, redecide, roundorder
from shardplan.search.drec import polish as polish_module
from shardplan.search.drec.polish import polish

PROJ = "layers.0.experts.expert_proj"


@pytest.fixture(scope="module")
def moe_case():
    graph, mesh = sp.zoo.build("qwen3-235b-a22b", layers=1), sp.parse_mesh("12")
    exact = sp.plan(graph, mesh, method="ilp", time_limit=120)  # optimal in about 2 s
    return graph, mesh, exact


def test_drec_matches_the_ilp_on_an_moe_layer_on_mesh_12(moe_case):
    graph, mesh, exact = moe_case
    drec = sp.plan(graph, mesh, method="drec")
    assert drec.cost.total <= exact.cost.total * (1 + 1e-9)


def test_drec_matches_the_ilp_on_mixtral_on_mesh_12():
    graph, mesh = sp.zoo.build("mixtral-8x7b", layers=1), sp.parse_mesh("12")
    exact = sp.plan(graph, mesh, method="ilp", time_limit=120)
    assert sp.plan(graph, mesh).cost.total <= exact.cost.total * (1 + 1e-9)


def test_polish_moves_an_early_round_cut_and_prices_it_exactly(moe_case):
    graph, mesh, exact = moe_case
    opts = CostOptions.make()
    assert exact.strategies[PROJ] == ("e", "e", None)  # the optimum continues the experts cut
    start = dict(exact.strategies) | {PROJ: ("a0", "e", None)}  # what the greedy chose
    before = evaluate_strategies(graph, mesh, start, opts).total
    assert before > exact.cost.total * 1.05
    polished = polish(graph, mesh, start, ScoreCache(graph, mesh, opts))
    assert polished[PROJ] == ("e", "e", None)
    after = evaluate_strategies(graph, mesh, polished, opts).total
    assert after == pytest.approx(exact.cost.total, rel=1e-12)


def test_polish_keeps_frozen_ops_and_never_costs_more(moe_case):
    graph, mesh, exact = moe_case
    opts = CostOptions.make()
    start = dict(exact.strategies) | {PROJ: ("a0", "e", None)}
    frozen = {graph.op_index[PROJ]}
    polished = polish(graph, mesh, start, ScoreCache(graph, mesh, opts), frozen=frozen)
    assert polished[PROJ] == ("a0", "e", None)
    before = evaluate_strategies(graph, mesh, start, opts).total
    assert evaluate_strategies(graph, mesh, polished, opts).total <= before
    replicated = {op.name: (None,) * len(mesh.rounds) for op in graph.ops}
    worst = evaluate_strategies(graph, mesh, replicated, opts).total
    better = polish(graph, mesh, replicated, ScoreCache(graph, mesh, opts))
    assert evaluate_strategies(graph, mesh, better, opts).total <= worst


def test_polish_tries_no_cut_for_a_reduction_cut_its_neighbours_agree_with():
    # BERT-base (2 layers) on 30: the attention's output projection cut its contraction in round
    # 1, where its input is cut alike (heads): no neighbour disagrees, so only "no cut" is left
    # to try, trading the partial sums' all-reduce for the input's gather (1.054 -> 1.016 of
    # the ILP optimum, benchmarks/results/quality_layers2.md)
    graph, mesh = sp.zoo.build("bert-base", layers=2), sp.parse_mesh("30")
    opts = CostOptions.make()
    out = "layer.0.attn.out.linear"
    start = dict(sp.plan(graph, mesh).strategies) | {out: ("b", "k", None)}
    before = evaluate_strategies(graph, mesh, start, opts).total
    polished = polish(graph, mesh, start, ScoreCache(graph, mesh, opts))
    assert polished[out] == ("b", None, None)
    assert evaluate_strategies(graph, mesh, polished, opts).total < before * (1 - 1e-3)


LLAMA_4X7 = dict(layers=1, batch=84, seq=96, hidden=1024, heads=16, kv_heads=4, ffn=2816)


def test_polish_cuts_a_weight_its_neighbours_agree_on_splitting_the_batch(monkeypatch):
    # Llama (1 layer, batch 84, vocab 32000) on 4x7, found by benchmarks/quality_random.py
    # (seed 10): every neighbour of the output head split the batch in round 0, so no single
    # move was tried there, yet cutting the vocabulary instead drops the table's gradient sum
    graph, mesh = sp.zoo.build("llama", **LLAMA_4X7, vocab=32000), sp.parse_mesh("4x7")
    exact = sp.plan(graph, mesh, method="ilp", time_limit=120)  # optimal in about 2 s
    found = sp.plan(graph, mesh)
    assert found.cost.total <= exact.cost.total * 1.05
    assert [c for c in found.strategies["lm_head.linear"][:2]] == ["n", "n"]
    monkeypatch.setattr(polish_module, "_weight_cuts", lambda graph, op: [])
    monkeypatch.setattr(columns, "TRIED", 0)  # its copies of a round's cuts reach 1.063
    _one_axis_order(monkeypatch)
    assert sp.plan(graph, mesh).cost.total > exact.cost.total * 1.15


def _one_axis_order(monkeypatch):
    """No rounds tried across axes (`roundorder.py`) nor round 0 decided again last
    (`redecide.py`), which reach this case's plan too."""
    monkeypatch.setattr(roundorder, "largest_overall", lambda mesh: None)
    monkeypatch.setattr(roundorder, "innermost_first", lambda mesh: None)
    monkeypatch.setattr(redecide, "redecided_rounds", lambda mesh: [])
