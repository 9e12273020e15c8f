"""D-Rec's largest-prime-first variant (`search/drec/roundorder.py`): the orders, the round trip
of a plan, and that the variant is kept only where the mesh scores it lower."""

import pytest

import shardplan as sp
from shardplan.cost import CostOptions
from shardplan.cost.evaluate import evaluate_strategies
from shardplan.search.drec import columns, polish, redecide, roundorder
from shardplan.search.drec.search import drec
from shardplan.sharding import check_strategies


@pytest.mark.parametrize(
    ("mesh", "order"),
    [("24", [3, 0, 1, 2]), ("6x4", [1, 0, 2, 3]), ("2x12", [0, 3, 1, 2]), ("8", None),
     ("4x8", None), ("3x8", None)],
)  # fmt: skip
def test_each_axis_takes_its_largest_primes_first(mesh, order):
    assert roundorder.largest_first(sp.parse_mesh(mesh)) == order


def test_a_plan_on_the_reordered_mesh_comes_back_in_the_mesh_order():
    mesh = sp.parse_mesh("12")  # rounds 2, 2, 3
    order = roundorder.largest_first(mesh)
    view = roundorder.reordered(mesh, order)
    assert [r.q for r in view.rounds] == [3, 2, 2] and [r.index for r in view.rounds] == [0, 1, 2]
    assert [r.q for r in mesh.rounds] == [2, 2, 3]  # the mesh itself is untouched
    back = roundorder.restored({"op": ("a", None, "b")}, order)
    assert back == {"op": (None, "b", "a")}


def bert():
    return sp.zoo.build("bert-base", layers=1)  # batch 8: the rounds of 2 can take it all


def test_bert_on_24_gains_from_the_largest_prime_first(monkeypatch):
    graph, mesh, opts = bert(), sp.parse_mesh("24"), CostOptions.make()
    # without the polish's run moves (`runs.py`), which reach a lower plan from either order
    monkeypatch.setattr(polish, "split_runs", lambda *args: False)
    monkeypatch.setattr(polish, "run_moves", lambda *args: False)
    monkeypatch.setattr(columns, "TRIED", 0)  # nor the column moves, which reach it too
    both = drec(graph, mesh, opts)
    check_strategies(graph.ops, both, mesh.rounds)  # valid in the mesh's own order
    monkeypatch.setattr(roundorder, "largest_first", lambda m: None)  # ascending order alone
    ascending = drec(graph, mesh, opts)
    cost = evaluate_strategies(graph, mesh, both, opts).total
    assert cost < 0.95 * evaluate_strategies(graph, mesh, ascending, opts).total
    # the round of 3 cuts what divides by 3 (heads or hidden units), the rounds of 2 the batch
    assert both["layer.0.attn.q.linear"] == ("b", "b", "b", "n")


@pytest.mark.parametrize(("model", "mesh"), [("gpt2-small", "12"), ("mlp", "6"), ("alexnet", "20")])
def test_never_worse_than_the_ascending_order(monkeypatch, model, mesh):
    graph, m, opts = sp.zoo.build(model, small=True), sp.parse_mesh(mesh), CostOptions.make()
    both = evaluate_strategies(graph, m, drec(graph, m, opts), opts).total
    monkeypatch.setattr(roundorder, "largest_first", lambda mesh: None)
    assert both <= evaluate_strategies(graph, m, drec(graph, m, opts), opts).total * (1 + 1e-12)


@pytest.mark.parametrize(
    ("mesh", "order"),
    [("2x2x7", [2, 0, 1]), ("3x8", None), ("2x3", [1, 0]), ("8", None), ("5x2", None),
     ("12", [2, 0, 1])],
)  # fmt: skip
def test_across_axes_the_largest_primes_come_first(mesh, order):
    assert roundorder.largest_overall(sp.parse_mesh(mesh)) == order


def test_a_replicated_plan_tries_the_largest_prime_across_axes_first(monkeypatch):
    """BERT-base, one layer, batch 28, sequence 128, on 2x2x7 (benchmarks/quality_random.py
    --seed 32 --axes 3): every variant's cut plan scored above keeping everything whole (1.279
    of the ILP optimum); deciding the round of 7 first, it takes the batch and the rounds of 2
    the heads and features: the optimum."""
    graph = sp.zoo.build("bert-base", layers=1, batch=28, seq=128)
    mesh = sp.parse_mesh("2x2x7")
    optimum = sp.plan(graph, mesh, "ilp", time_limit=60)
    found = sp.plan(graph, mesh)
    assert found.cost.total <= optimum.cost.total * (1 + 1e-6)
    assert any(c is not None for s in found.strategies.values() for c in s)
    monkeypatch.setattr(redecide, "_seeded", lambda *args: None)  # which reach it too
    monkeypatch.setattr(roundorder, "innermost_first", lambda mesh: None)
    assert sp.plan(graph, mesh).cost.total == found.cost.total  # the largest prime first alone
    monkeypatch.setattr(roundorder, "largest_overall", lambda mesh: None)
    without = sp.plan(graph, mesh)
    assert without.cost.total > found.cost.total * 1.2
    assert all(c is None for s in without.strategies.values() for c in s)


@pytest.mark.parametrize(
    ("mesh", "order"),
    [("7x3", [1, 0]), ("2x2x7", [2, 1, 0]), ("4x8", [2, 3, 4, 0, 1]), ("8", None),
     ("12", None)],
)  # fmt: skip
def test_innermost_axis_first(mesh, order):
    assert roundorder.innermost_first(sp.parse_mesh(mesh)) == order


def test_a_replicated_plan_tries_the_innermost_axis_first(monkeypatch):
    """BERT-base, one layer, batch 21, sequence 192, on 7x3 (benchmarks/quality_random.py
    --seed 50): the batch over the 7 nodes alone and tensor parallelism over the 3 GPUs alone
    each scored above keeping everything whole (1.307 of the ILP optimum); deciding the round
    of 3 first, it cuts heads and features, the round of 7 then the batch: the optimum."""
    graph = sp.zoo.build("bert-base", layers=1, batch=21, seq=192)
    mesh = sp.parse_mesh("7x3")
    optimum = sp.plan(graph, mesh, "ilp", time_limit=60)
    found = sp.plan(graph, mesh)
    assert found.cost.total <= optimum.cost.total * (1 + 1e-6)
    monkeypatch.setattr(redecide, "_seeded", lambda *args: None)  # which reach it too
    monkeypatch.setattr(roundorder, "innermost_first", lambda mesh: None)
    without = sp.plan(graph, mesh)
    assert without.cost.total > found.cost.total * 1.2
    assert all(c is None for s in without.strategies.values() for c in s)
