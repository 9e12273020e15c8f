"""D-Rec's block copies (`search/drec/blocks.py`): every repeated block of an unfolded graph
given one block's strategies. Found by benchmarks/quality_random.py --axes 3 (seed 11: an MoE
model, 3 layers, batch 24, on 2x2x3 was 1.181 of the ILP optimum)."""

from __future__ import annotations

import shardplan as sp
from shardplan.cost import CostOptions
from shardplan.cost.evaluate import ScoreCache
from shardplan.search.drec import blocks

MOE = dict(layers=3, batch=24, seq=64)


def test_copies_give_every_block_one_blocks_strategies():
    graph = sp.zoo.build("gpt2-small", layers=3, batch=4, seq=32)
    cache = ScoreCache(graph, sp.parse_mesh("2"), CostOptions.make())
    plan = {op.name: ("b",) for op in graph.ops}
    assert list(blocks.copies(graph, plan, cache.classes)) == []  # every block alike
    first = [op.name for op in graph.ops if op.name.startswith("h.0.")]
    plan = {**plan, first[0]: (None,)}  # block 0 decides its first op otherwise
    out = list(blocks.copies(graph, plan, cache.classes))
    assert len(out) == 2  # block 0's strategies everywhere, and block 1's (= block 2's)
    for copy in out:
        starts = [copy[name] for name in (first[0], first[0].replace("h.0.", "h.2."))]
        assert starts[0] == starts[1]


def test_an_moe_model_on_2x2x3_keeps_every_layers_attention_alike(monkeypatch):
    """Without stream moves (`streams.py`, which since reach a lower plan on this case by
    keeping the residual stream whole) nor the rounds tried across axes (`roundorder.py`) nor
    decided again (`redecide.py`), which since reach it too, the copies give every layer layer
    0's attention."""
    from shardplan.search.drec import polish, redecide, roundorder

    monkeypatch.setattr(polish, "stream_moves", lambda *args, **kwargs: False)
    monkeypatch.setattr(redecide, "redecided_rounds", lambda mesh: [])
    monkeypatch.setattr(roundorder, "largest_overall", lambda mesh: None)
    monkeypatch.setattr(roundorder, "innermost_first", lambda mesh: None)
    graph, mesh = sp.zoo.build("deepseek-moe", **MOE), sp.parse_mesh("2x2x3")
    found = sp.plan(graph, mesh)
    q = [found.strategies[f"layer.{k}.attn.q.linear"] for k in range(3)]
    assert q[0] == q[1] == q[2]
    monkeypatch.setattr(blocks, "TRIED", 0)
    without = sp.plan(graph, mesh)
    assert found.cost.total < without.cost.total * 0.96
