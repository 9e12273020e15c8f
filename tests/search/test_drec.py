"""D-Rec: the MindSpore test vector, rediscovery of expert patterns, determinism, validity."""

import json
import math

import pytest

import shardplan as sp
from shardplan.errors import InfeasibleError, SolverError
from shardplan.exporters.mindspore import in_strategy
from shardplan.exporters.plan_json import to_dict
from shardplan.search import plan


def test_sapp_tutorial_vector():
    """reference-drec.md §9.2 A: MindSpore prints ((4,2),(1,2)) for the first MatMul."""
    p = plan(sp.zoo.build("sapp-mlp"), "8", preset="mindspore")
    assert in_strategy(p, "dense1.linear") == ((4, 2), (1, 2))
    assert in_strategy(p, "dense1.bias_add") == ((4, 1), (1,))
    assert in_strategy(p, "relu1") == ((4, 1),)


def _linear_cuts(p, suffix):
    return {c for name, s in p.strategies.items() if name.endswith(suffix) for c in s} - {None}


def test_large_model_small_batch_rediscovers_megatron():
    g = sp.zoo.build("gpt3", layers=2, hidden=4096, heads=32, batch=1, seq=1024)
    p = plan(g, "8")
    # column-parallel q/k/v and fc, row-parallel out and proj, heads split in attention
    for suffix in ("q.linear", "k.linear", "v.linear", "fc.linear"):
        assert _linear_cuts(p, suffix) == {"n"}, suffix
    assert _linear_cuts(p, "proj.linear") == {"k"}
    # the attention output projection is row-parallel in some round and column-parallel in the
    # others (the ILP optimum cuts it (n, k, k), D-Rec (n, n, k))
    for name, strategy in p.strategies.items():
        if name.endswith("out.linear"):
            assert "k" in strategy and set(strategy) <= {"k", "n"}, (name, strategy)
    for suffix in ("attn.scores", "attn.context"):
        assert _linear_cuts(p, suffix) == {"b1"}, suffix  # b1 is the heads loop dim
    assert p.cost.total < plan(g, "8", "data-parallel").cost.total


def test_large_batch_chooses_data_parallelism():
    g = sp.zoo.build("gpt2-small", batch=256, seq=1024)
    p = plan(g, "8")
    for op in g.ops:
        if op.kind in ("linear", "bmm") and op.name != "lm_head":
            assert p.strategies[op.name] in (("b",) * 3, ("b0",) * 3), op.name
    assert p.cost.total == pytest.approx(plan(g, "8", "data-parallel").cost.total)


def test_no_tensor_parallel_cuts_on_the_slow_outer_axis():
    g = sp.zoo.build("gpt2-xl", batch=8, seq=1024)
    mesh = sp.parse_mesh("4x8")
    p = plan(g, mesh)
    outer = [r.index for r in mesh.rounds if r.mesh_axis == 0]
    for op in g.ops:
        if op.kind == "linear" and op.name != "lm_head":
            assert all(p.strategies[op.name][r] in ("b", "m", None) for r in outer), op.name
    experts = [plan(g, mesh, m).cost.total for m in ("data-parallel", "megatron", "fsdp")]
    assert p.cost.total <= min(experts)


def test_plans_are_deterministic():
    g = sp.zoo.build("bert-base", small=True)
    a = to_dict(plan(g, "2x4"))
    b = to_dict(plan(g, "2x4"))
    a.pop("search_seconds"), b.pop("search_seconds")
    assert json.dumps(a) == json.dumps(b)


@pytest.mark.parametrize("mesh", ["2", "6", "12", "24", "96", "3x4", "2x8"])
def test_any_device_count(mesh):
    g = sp.zoo.build("gpt2-small", small=True, batch=24, seq=12, heads=6, hidden=48)
    p = plan(g, mesh)
    assert len(next(iter(p.strategies.values()))) == len(sp.parse_mesh(mesh).rounds)


@pytest.mark.parametrize("name", sorted(sp.zoo.MODELS))
def test_every_small_zoo_model_plans_validly(name):
    g = sp.zoo.build(name, small=True)
    p = plan(g, "2x4")  # Plan() runs the validator
    assert p.cost.total > 0


def test_memory_budget_is_met_or_infeasible():
    g = sp.zoo.build("gpt2-small", batch=8, seq=256)
    free = plan(g, "8")
    budget = free.cost.memory_per_device * 0.8
    tight = plan(g, "8", memory=budget)
    assert tight.cost.memory_per_device <= budget
    assert tight.notes
    with pytest.raises(InfeasibleError, match="over by"):
        plan(g, "8", memory=1e6)


def test_expert_over_budget_is_infeasible():
    g = sp.zoo.build("gpt2-small", batch=8, seq=1024)
    with pytest.raises(InfeasibleError, match="data-parallel plan .* over the .* budget"):
        plan(g, "8", "data-parallel", memory="1GB")


def test_unknown_method():
    with pytest.raises(SolverError, match="unknown method 'greedy'"):
        plan(sp.zoo.build("mlp"), "8", "greedy")


def test_unused_mesh_axis_is_explained():
    """A 1-layer GPT-2 xl at batch 2 does not pay for the slow inter-node links: the plan leaves
    (ways of) the node axis unused and says how many (every op replicated in those rounds)."""
    g = sp.zoo.build("gpt2-xl", layers=1, batch=2, seq=1024)
    p = plan(g, "4x8")
    node_rounds = [r for r in p.mesh.rounds if r.mesh_axis == 0]
    idle = [r for r in node_rounds if all(s[r.index] is None for s in p.strategies.values())]
    ways = math.prod(r.q for r in idle)
    notes = [n for n in p.notes if "left unused" in n]
    assert ways > 1 and len(notes) == 1 and "'node'" in notes[0]
    assert (f"{ways} of the 4 ways" in notes[0]) == (ways < 4)
    assert not [n for n in plan(sp.zoo.build("gpt2-small", batch=256), "8").notes if "unused" in n]


@pytest.mark.parametrize(
    ("model", "mesh"), [("gpt3", "2x4"), ("bert-base", "12"), ("alexnet", "8")]
)
def test_variants_sharing_rounds_decide_as_alone(model, mesh):
    """A variant that reuses the rounds another variant (pricing alike) ended from the same
    greedy decisions plans exactly as it does alone, binding flag included."""
    from shardplan.cost import CostOptions
    from shardplan.search.drec.search import _Search

    graph, m, opts = sp.zoo.build(model, small=True), sp.parse_mesh(mesh), CostOptions.make()
    shared: dict = {}
    first = _Search(graph, m, opts, 0.0, rounds_seen=shared)
    first.run()
    recorded = len(shared)
    assert recorded  # the first search recorded its rounds
    for by_min in (False, True):
        alone = _Search(graph, m, opts, 0.0, lightest_cut_order=by_min)
        sharing = _Search(graph, m, opts, 0.0, lightest_cut_order=by_min, rounds_seen=shared)
        assert sharing.run() == alone.run()
        assert sharing.binding == alone.binding
        if not by_min:  # the same search again: every round was reused, none recorded
            assert len(shared) == recorded


@pytest.mark.parametrize(("model", "mesh"), [("gpt3", "2x4"), ("bert-base", "12")])
def test_variants_sharing_prices_decide_as_alone(model, mesh):
    """Searches sharing own prices, intra prices and one EdgeBook (contexts and edge prices kept
    across rounds) plan exactly as each does alone, whatever ran before them."""
    from shardplan.cost import CostOptions
    from shardplan.search.drec.search import _Search
    from shardplan.search.drec.state import EdgeBook

    graph, m, opts = sp.zoo.build(model, small=True), sp.parse_mesh(mesh), CostOptions.make()
    prices: dict = {}
    book = EdgeBook()
    for final, by_min in ((False, False), (True, False), (False, True)):
        alone = _Search(graph, m, opts, 0.0, 0, final, lightest_cut_order=by_min)
        sharing = _Search(
            graph, m, opts, 0.0, 0, final, lightest_cut_order=by_min,
            shared_prices=prices, shared_edges=book,
        )  # fmt: skip
        assert sharing.run() == alone.run()
    assert book.edge_cache and any(key[0] == "intra" for key in prices)


@pytest.mark.parametrize(("model", "mesh"), [("gpt3", "2x4"), ("alexnet", "4x2"), ("mlp", "8")])
def test_unused_floor_bounds_plans_leaving_rounds_unused(model, mesh):
    """The floor that bounds the unused-axis variants out is below the evaluator's score of
    any plan leaving those rounds unused: the variant's own plan, and all-replicated."""
    from shardplan.cost import CostOptions, evaluate_strategies
    from shardplan.search.drec.gates import unused_floor
    from shardplan.search.drec.search import _Search

    graph, m, opts = sp.zoo.build(model, small=True), sp.parse_mesh(mesh), CostOptions.make()
    rounds = len(m.rounds)
    for unused in range(1, rounds + 1):
        floor = unused_floor(graph, m, opts, unused, None)
        assert floor > 0
        if unused < rounds:
            strategies = _Search(graph, m, opts, 0.0, unused).run()
        else:
            strategies = {op.name: (None,) * rounds for op in graph.ops}
        assert all(s[:unused] == (None,) * unused for s in strategies.values())
        assert floor <= evaluate_strategies(graph, m, strategies, opts).total


def test_search_restores_the_garbage_collector():
    """D-Rec pauses the cyclic collector while it runs and leaves it as it found it."""
    import gc

    from shardplan.cost import CostOptions
    from shardplan.search.drec.search import drec

    graph, m, opts = sp.zoo.build("mlp", small=True), sp.parse_mesh("4"), CostOptions.make()
    assert gc.isenabled()
    drec(graph, m, opts)
    assert gc.isenabled()
    gc.disable()
    try:
        drec(graph, m, opts)
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_an_op_reading_one_tensor_twice_under_a_budget():
    # found by the soak (tests/properties/test_plans.py): attention(q, q, q) reads op0 at three
    # positions; the first has no previous reader, so no gradient credit, yet D-Rec's ledger
    # recorded one there by the tensor's name and crashed pricing its credits back
    b = sp.GraphBuilder("twice")
    x = b.input("x", (1, 1))
    q = b.apply("linear", x, b.param("w0", (2, 1)), name="op0")
    b.apply("add", x, x, name="op1")
    b.apply("attention", q, q, q, name="op2")
    b.apply("linear", x, b.param("w3", (1, 1)), name="op3")
    b.apply("linear", x, b.param("w4", (1, 1)), name="op4")
    graph = b.build()
    free = plan(graph, "4", "drec").cost.memory_per_device
    try:
        p = plan(graph, "4", "drec", memory=free * 0.5)
    except InfeasibleError:
        return
    assert p.cost.memory_per_device <= free * 0.5


def test_one_heavy_op_runs_no_lightest_cut_first_variant():
    """With one heavy op both orders (dearest or cheapest cut first) are that op: the variant
    ordering by the cheapest cut would repeat the search, so it is not run; with several heavy
    ops it is."""
    from shardplan.cost import CostOptions
    from shardplan.ir.segments import subgraph
    from shardplan.search.drec.flex import build_flex_graph
    from shardplan.search.drec.search import _PinnedSearch, _Search
    from shardplan.search.drec.variants import best_variant

    orders: list[bool] = []

    class Recorded(_Search):
        def __init__(self, *args, **kwargs):
            orders.append(kwargs["lightest_cut_order"])
            super().__init__(*args, **kwargs)

    g = sp.zoo.build("gpt3", small=True, batch=8)
    head = g.op_index["lm_head"]
    mesh, opts = sp.parse_mesh("2x4"), CostOptions.make()
    for graph, several in ((subgraph(g, head, head + 1), False), (g, True)):
        orders.clear()
        flex = build_flex_graph(graph)
        assert (len(flex.heavy) > 1) is several
        found = best_variant(graph, mesh, opts, 0.0, None, flex, searches=(Recorded, _PinnedSearch))
        assert found is not None and set(found) == {op.name for op in graph.ops}
        assert any(orders) is several


@pytest.mark.parametrize(
    ("model", "sizes", "mesh"),
    [
        ("gpt3", {"layers": 2, "batch": 6, "seq": 512}, "12"),
        ("mixtral-8x7b", {"small": True, "layers": 2}, "2x12"),
        ("bert-base", {"layers": 1, "batch": 24}, "3x8"),
    ],
)
def test_variants_sharing_their_rounds_decide_as_each_alone(model, sizes, mesh):
    """A round priced alike (the lookahead adds nothing where the next round cuts as many
    ways; the last round's final compute is its local one), with the same rounds done and the
    same greedy order, is decided alike: variants take such rounds from each other whole, with
    fewer greedy passes and the plan each finds alone."""
    from shardplan.cost import CostOptions
    from shardplan.search.drec.flex import build_flex_graph
    from shardplan.search.drec.search import _PinnedSearch, _Search
    from shardplan.search.drec.variants import best_variant

    passes = {"shared": 0, "alone": 0}

    def counted(which, own_rounds):
        class Counted(_Search):
            def __init__(self, *args, **kwargs):
                if own_rounds:
                    kwargs["rounds_seen"] = {}  # nothing taken from another variant
                super().__init__(*args, **kwargs)

            def _greedy(self, *args):
                passes[which] += 1
                return super()._greedy(*args)

        return Counted

    g = sp.zoo.build(model, **sizes)
    m, opts = sp.parse_mesh(mesh), CostOptions.make()
    plans = {}
    for which, own_rounds in (("shared", False), ("alone", True)):
        searches = (counted(which, own_rounds), _PinnedSearch)
        plans[which] = best_variant(g, m, opts, 0.0, None, build_flex_graph(g), searches=searches)
    assert plans["shared"] == plans["alone"] and plans["shared"] is not None
    assert passes["shared"] < passes["alone"]
