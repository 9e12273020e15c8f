"""D-Rec and a tied parameter (`search/drec/tied.py`, `search/drec/tiedwhole.py`): GPT-2's token
embedding table is read by the lookup and by the output head. Found by
benchmarks/quality_random.py (seed 2: GPT-2 small, 2 layers, batch 5, on 2x2 was 1.155 of the
ILP optimum) and quality_sweep.py (GPT-3, 2 layers, batch 6, on 12: 1.048)."""

from __future__ import annotations

import pytest

import shardplan as sp
from shardplan.cost.collectives import all_reduce_s
from shardplan.search.drec import tied, tiedwhole


@pytest.fixture(scope="module")
def gpt2_on_2x2():
    graph = sp.zoo.build("gpt2-small", layers=2, batch=5, seq=160)
    exact = sp.plan(graph, "2x2", method="ilp", time_limit=120)  # optimal in about 1 s
    return graph, exact


def test_drec_reaches_the_optimum_moving_the_tied_readers_together(gpt2_on_2x2):
    graph, exact = gpt2_on_2x2
    found = sp.plan(graph, "2x2")
    assert found.cost.total <= exact.cost.total * (1 + 1e-9)
    # the lookup and the head cut the table along one axis in the same round
    lookup, head = found.strategies["tok_emb"], found.strategies["lm_head"]
    assert any(a == "e" and b == "k" for a, b in zip(lookup, head, strict=True))


def test_without_the_tied_moves_drec_misses_it(gpt2_on_2x2, monkeypatch):
    graph, exact = gpt2_on_2x2
    monkeypatch.setattr(tied, "GAIN", float("inf"))  # no round pays enough to try
    monkeypatch.setattr(tiedwhole, "WHOLE_GAIN", float("inf"))
    assert sp.plan(graph, "2x2").cost.total > exact.cost.total * 1.1


def test_readers_kept_whole_let_the_body_part_freely():
    graph = sp.zoo.build("gpt3", layers=2, batch=6, seq=512)
    exact = sp.plan(graph, "12", method="ilp", time_limit=120)  # optimal in about 2 s
    found = sp.plan(graph, "12")
    assert found.cost.total <= exact.cost.total * 1.02
    whole = (None, None, None)
    assert found.strategies["tok_emb"] == whole and found.strategies["lm_head"] == whole
    assert any(c is not None for c in found.strategies["h.0.mlp.fc.linear"])


def test_tied_parameters_are_the_shared_tables():
    graph = sp.zoo.build("gpt2-small", layers=1, batch=2, seq=32)
    found = tied.tied_parameters(graph)
    assert list(found) == ["wte"]
    assert [graph.ops[i].name for i in found["wte"]] == ["tok_emb", "lm_head"]
    untied = sp.zoo.build("llama", layers=1, hidden=64, heads=4, kv_heads=2, ffn=128, vocab=256)
    assert tied.tied_parameters(untied) == {}


def test_gradient_sum_over_rounds_of_one_link_is_one_ring_all_reduce():
    graph = sp.zoo.build("gpt2-small", layers=1, batch=8, seq=32)
    mesh = sp.parse_mesh("8")
    batch = ("d0", "d0", "d0")  # both readers cut the batch: the table summed in every round
    plan = {op.name: (None, None, None) for op in graph.ops}
    plan |= {"tok_emb": batch, "lm_head": ("b", "b", "b")}
    rounds = tied.gradient_rounds(graph, mesh, plan, "wte")
    assert sorted(rounds) == [0, 1, 2]
    bandwidth = mesh.rounds[0].bandwidth_bytes_per_s
    ring = all_reduce_s(graph.tensors["wte"].nbytes, 8, bandwidth)
    assert sum(rounds.values()) == pytest.approx(ring)
    assert tied.whole_sum_s(graph, mesh, "wte") == pytest.approx(ring)
    # the table split along its hidden axis by both readers in round 0: never summed there
    plan |= {"tok_emb": ("e", "d0", "d0"), "lm_head": ("k", "b", "b")}
    rounds = tied.gradient_rounds(graph, mesh, plan, "wte")
    assert sorted(rounds) == [1, 2]
    half = all_reduce_s(graph.tensors["wte"].nbytes / 2, 4, bandwidth)
    assert sum(rounds.values()) == pytest.approx(half)


def test_inference_plans_have_no_tied_moves(gpt2_on_2x2, monkeypatch):
    graph, _ = gpt2_on_2x2
    found = sp.plan(graph, "2x2", train=False)
    monkeypatch.setattr(tied, "GAIN", float("inf"))
    monkeypatch.setattr(tiedwhole, "WHOLE_GAIN", float("inf"))
    assert sp.plan(graph, "2x2", train=False).strategies == found.strategies
