"""D-Rec's first round decided again, last (`search/drec/redecide.py`): which meshes try it, the
free round's pins, and that the plan found is kept only where the mesh scores it lower."""

import pytest

import shardplan as sp
from shardplan.cost import CostOptions
from shardplan.cost.evaluate import evaluate_strategies
from shardplan.search.drec import redecide, search
from shardplan.search.drec.flex import build_flex_graph
from shardplan.search.drec.roundorder import reordered, restored
from shardplan.search.drec.search import drec
from shardplan.sharding import check_strategies


@pytest.mark.parametrize(
    ("mesh", "round_"),
    [("18", 0), ("4x8", 0), ("12", 0), ("2x4x2", 0), ("8", None), ("1024", None), ("3", None),
     ("16", None), ("1x1", None), ("1", None)],
)  # fmt: skip
def test_round_0_is_decided_again_only_when_unlike_the_last(mesh, round_):
    assert redecide.redecided_round(sp.parse_mesh(mesh)) == round_


def test_the_free_round_is_searched_and_the_others_keep_their_pins():
    graph, mesh, opts = sp.zoo.build("mlp", small=True), sp.parse_mesh("12"), CostOptions.make()
    plan = drec(graph, mesh, opts)
    order = [1, 2, 0]
    pinned = {graph.op_index[n]: tuple(cuts[i] for i in order) for n, cuts in plan.items()}
    found = search._PinnedSearch(
        graph, reordered(mesh, order), opts, 0.0, flex=build_flex_graph(graph),
        fixed=pinned, free_round=2,
    ).run()  # fmt: skip
    back = restored(found, order)
    check_strategies(graph.ops, back, mesh.rounds)
    for name, cuts in plan.items():  # rounds 1 and 2 as pinned; round 0 searched
        assert back[name][1:] == cuts[1:]


def moe():
    return sp.zoo.build("moe", batch=36, seq=160)


def test_moe_on_18_gains_from_deciding_the_round_of_2_last(monkeypatch):
    graph, mesh, opts = moe(), sp.parse_mesh("18"), CostOptions.make()
    plan = drec(graph, mesh, opts)
    monkeypatch.setattr(redecide, "redecided_round", lambda m: None)
    alone = drec(graph, mesh, opts)
    cost = evaluate_strategies(graph, mesh, plan, opts).total
    assert cost < 0.95 * evaluate_strategies(graph, mesh, alone, opts).total
    # every round split the batch; decided last, the round of 2 splits the heads
    assert alone["attn.q.linear"] == ("b", "b", "b")
    assert plan["attn.q.linear"][0] != "b" and plan["attn.q.linear"][1:] == ("b", "b")


@pytest.mark.parametrize(
    ("model", "mesh"), [("gpt2-small", "4x8"), ("mlp", "12"), ("alexnet", "2x3")]
)
def test_never_worse_than_without_it(monkeypatch, model, mesh):
    graph, m, opts = sp.zoo.build(model, small=True), sp.parse_mesh(mesh), CostOptions.make()
    both = evaluate_strategies(graph, m, drec(graph, m, opts), opts).total
    monkeypatch.setattr(redecide, "redecided_round", lambda mesh: None)
    assert both <= evaluate_strategies(graph, m, drec(graph, m, opts), opts).total * (1 + 1e-12)
