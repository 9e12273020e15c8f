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
    ("mesh", "rounds"),
    [("18", [0]), ("4x8", [0]), ("12", [0]), ("2x4x2", [0, 1]), ("2x2x3", [0, 1]),
     ("3x8", [0]), ("8", []), ("1024", []), ("3", []), ("16", []), ("1x1", []), ("1", [])],
)  # fmt: skip
def test_the_first_round_of_each_class_but_the_last_rounds_is_decided_again(mesh, rounds):
    # rounds alike (one axis, one number of ways) are exchangeable: the last round was decided
    # on what every other round leaves, and one round of each other class is decided so again
    assert redecide.redecided_rounds(sp.parse_mesh(mesh)) == rounds


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
    monkeypatch.setattr(redecide, "redecided_rounds", lambda m: [])
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
    monkeypatch.setattr(redecide, "redecided_rounds", lambda mesh: [])
    assert both <= evaluate_strategies(graph, m, drec(graph, m, opts), opts).total * (1 + 1e-12)


def test_a_replicated_plan_tries_the_data_parallel_seeds(monkeypatch):
    """GPT-3 (3 layers, batch 10) on 2x5: data parallelism over the 5 alone all-reduces every
    weight's gradient, tensor parallelism over the 2 alone all-reduces whole activations, and
    each loses to replication; seeded with the data-parallel expert's cuts over the 5, the round
    of 2 searched again splits heads and hidden units (the tied embedding and head kept whole),
    the ILP optimum (`benchmarks/quality_random.py --seed 57`)."""
    graph = sp.zoo.build("gpt3", layers=3, batch=10, seq=512)
    mesh, opts = sp.parse_mesh("2x5"), CostOptions.make()
    seeded = drec(graph, mesh, opts)
    monkeypatch.setattr(redecide, "_seeded", lambda *args: None)
    alone = drec(graph, mesh, opts)
    assert all(c is None for s in alone.values() for c in s)  # replication won
    cost = evaluate_strategies(graph, mesh, seeded, opts).total
    assert cost < 0.95 * evaluate_strategies(graph, mesh, alone, opts).total
    assert seeded["h.0.attn.q.linear"] == ("n", "b") and seeded["h.0.mlp.proj.linear"] == ("k", "b")
