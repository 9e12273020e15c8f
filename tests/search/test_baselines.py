"""D-Rec never returns a plan costlier than all-replicated or an expert plan (issue 16, 2-4)."""

from __future__ import annotations

import pytest

from shardplan import zoo
from shardplan.cost import CostOptions, ScoreCache
from shardplan.cost.evaluate import evaluate_strategies
from shardplan.errors import InfeasibleError
from shardplan.ir.graph import GraphBuilder
from shardplan.mesh import parse_mesh
from shardplan.search.api import plan
from shardplan.search.drec.baselines import baseline_plans
from shardplan.search.drec.search import drec


def _reshape_chain():
    b = GraphBuilder("chain")
    x = b.input("x", (60,))
    n = b.apply("neg", b.apply("reshape", x, shape=(6, 10)))
    b.apply("layer_norm", b.apply("reshape", n, shape=(60,)), b.param("g", (60,)))
    b.apply("linear", b.input("xi", (1, 1)), b.param("w", (9, 1)))
    return b.build()


def _linear_norm():
    b = GraphBuilder("linear_norm")
    y = b.apply("linear", b.input("x", (64, 8, 4, 1)), b.param("w", (6, 1)))
    b.apply("layer_norm", y, b.param("g", (6,)))
    return b.build()


@pytest.mark.parametrize("mesh", ["3", "4", "2x3"])
def test_case2_round_left_unused_is_compared_over_every_op(mesh):
    # the chain's light ops used to keep cuts costing 960 where replicating costs ~0
    graph, m = _reshape_chain(), parse_mesh(mesh)
    opts = CostOptions.make("mindspore", True, "adam")
    replicated = {op.name: (None,) * len(m.rounds) for op in graph.ops}
    floor = evaluate_strategies(graph, m, replicated, opts).total
    assert floor < 0.01
    assert evaluate_strategies(graph, m, drec(graph, m, opts), opts).total <= floor  # drec alone
    assert plan(graph, m, preset="mindspore").cost.total <= floor


def test_case3_drec_is_not_above_data_parallel():
    graph = _linear_norm()
    dp = plan(graph, "6", "data-parallel", preset="mindspore").cost.total
    ilp = plan(graph, "6", "ilp", preset="mindspore").cost.total
    p = plan(graph, "6", preset="mindspore")
    assert p.cost.total <= dp * (1 + 1e-12)
    assert p.cost.total == pytest.approx(ilp)  # the ILP proves data parallel optimal here
    assert p.method == "drec"
    # D-Rec's own plan reaches it (the polish's split runs, `runs.py`), or the fallback says it won
    m, opts = parse_mesh("6"), CostOptions.make("mindspore", True, "adam")
    own = evaluate_strategies(graph, m, drec(graph, m, opts), opts).total
    assert own <= dp * (1 + 1e-12) or any("data-parallel plan" in n for n in p.notes)


def test_case3_wide_deep_on_96_uniform_inference():
    graph = zoo.build("wide-deep", small=True)
    mesh = parse_mesh("96", "uniform")
    dp = plan(graph, mesh, "data-parallel", train=False).cost.total
    assert plan(graph, mesh, train=False).cost.total <= dp * (1 + 1e-12)


def test_drec_never_above_any_baseline_on_small_zoo_models():
    opts = CostOptions.make("shardplan", True, "adam")
    for name in ("gpt2-small", "alexnet", "wide-deep"):
        graph = zoo.build(name, small=True)
        for mesh in ("6", "2x4"):
            m = parse_mesh(mesh)
            got = plan(graph, m).cost.total
            floor = min(b.cost.total for b in baseline_plans(graph, m, opts))
            assert got <= floor * (1 + 1e-12), (name, mesh)


def test_case4_unused_parameter_with_a_memory_budget():
    b = GraphBuilder("unused_param")
    b.param("orphan", (1000,))  # no op reads it
    h = b.apply("linear", b.input("x", (8, 16)), b.param("w", (32, 16)))
    b.apply("layer_norm", h, b.param("g", (32,)))
    graph = b.build()
    p = plan(graph, "4", memory=3300)  # used to raise KeyError in _shard_replicated_params
    assert p.cost.memory_per_device <= 3300
    assert any("ZeRO" in n for n in p.notes)
    with pytest.raises(InfeasibleError, match="fits 1.2 KB per device"):
        plan(graph, "4", memory=1200)


@pytest.mark.parametrize(("model", "mesh"), [("gpt3", "2x4"), ("bert-base", "12")])
def test_expert_plans_through_the_fold_are_the_full_graphs(model, mesh):
    """The experts are forward passes: propagated on the reduced graph and expanded, they are
    the full graph's plans; the folded baselines are the full ones, scored alike."""
    from shardplan.search import experts
    from shardplan.search.drec.baselines import _folded_experts
    from shardplan.search.drec.fold import find_fold

    graph, m = zoo.build(model, small=True, layers=8), parse_mesh(mesh)
    fold = find_fold(graph)
    assert fold is not None
    opts = CostOptions.make()
    refined = ScoreCache(fold.reduced, m, opts)  # classes finer than the experts' own
    for folded in (_folded_experts(fold, m), _folded_experts(fold, m, refined)):
        assert fold.expand(folded["data-parallel"]) == experts.data_parallel(graph, m)
        assert fold.expand(folded["megatron"]) == experts.megatron(graph, m)
    full = {b.method: b.cost.total for b in baseline_plans(graph, m, opts)}
    through = {b.method: b.cost.total for b in baseline_plans(graph, m, opts, fold=fold)}
    assert through == full
    # with a cost to beat, every one that beats it is kept and fewer are scored
    for beat in sorted(full.values()):
        kept = {b.method for b in baseline_plans(graph, m, opts, below=beat, fold=fold)}
        assert {k for k, v in full.items() if v < beat} <= kept
        assert all(full[k] >= beat for k in full.keys() - kept)
    below = sorted(full.values())[1]  # the fold's exact totals leave out more than compute
    assert len(baseline_plans(graph, m, opts, below=below, fold=fold)) < len(
        baseline_plans(graph, m, opts, below=below)
    )


def test_drec_own_plan_among_baselines_is_not_scored_again():
    """A baseline with exactly D-Rec's strategies (no storage layouts) costs what D-Rec's plan
    does, so it cannot beat it and is left out; FSDP (its own layouts) is still compared."""
    from shardplan.search import experts

    graph, m = zoo.build("gpt3", small=True), parse_mesh("8")
    opts = CostOptions.make()
    dp = experts.data_parallel(graph, m)
    cost = plan(graph, "8", method="data-parallel").cost.total
    scored = {b.method for b in baseline_plans(graph, m, opts, below=cost * 1.5)}
    assert "data-parallel" in scored
    kept = {b.method for b in baseline_plans(graph, m, opts, below=cost * 1.5, found=dp)}
    assert kept == scored - {"data-parallel"}
