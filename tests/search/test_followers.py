"""A heavy op's followers (search/drec/followers.py): who takes its layout, and what its cuts
leave them paying."""

from __future__ import annotations

import shardplan as sp
from shardplan.search.drec.flex import build_flex_graph
from shardplan.search.drec.followers import follower_excess
from shardplan.search.drec.tables import SearchTables


def _tables(graph):
    return SearchTables.of(graph, build_flex_graph(graph))


def test_attention_scores_lead_scale_mask_and_softmax():
    """The transparent ops between the two batched matmuls follow the scores (their nearest
    heavy producer), each whole, and a heads cut reaches them all."""
    g = sp.zoo.build("gpt2-small", layers=1, small=True)
    tables = _tables(g)
    scores = g.op_index["h.0.attn.scores"]
    names = {g.ops[t].name: (share, carry) for t, share, carry in tables.followers[scores]}
    assert set(names) == {"h.0.attn.scale", "h.0.attn.mask", "h.0.attn.softmax"}
    assert all(share == 1.0 for share, _ in names.values())
    assert all(carry["b1"] is not None and carry[None] is None for _, carry in names.values())
    assert names["h.0.attn.softmax"][1]["n"] is None  # its reduced axis cannot carry a split


def test_every_transparent_op_with_a_heavy_producer_is_shared_out_once():
    """Shares of each followed op add up to 1 (ties split it); heavy ops follow nobody."""
    g = sp.zoo.build("bert-base", layers=2, small=True)
    tables, flex = _tables(g), build_flex_graph(g)
    total: dict[int, float] = {}
    for u, followers in enumerate(tables.followers):
        assert not followers or u in flex.heavy
        for t, share, _ in followers:
            assert t not in flex.heavy
            total[t] = total.get(t, 0.0) + share
    assert total and all(abs(s - 1.0) < 1e-12 for s in total.values())


def test_excess_is_what_the_carried_cut_costs_above_the_cheapest():
    followers = [(7, 1.0, {"a": "x", None: None}), (8, 0.5, {"a": None, None: None})]
    own = {7: {"x": 1.0, None: 4.0}, 8: {"y": 2.0, None: 6.0}}
    extra = follower_excess(followers, ["a", None], own.__getitem__)
    assert extra == {"a": 0.0 + 0.5 * 4.0, None: 3.0 + 0.5 * 4.0}
