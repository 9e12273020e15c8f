"""The DP baseline: same optimum as the ILP where it finishes, honest failure when it does not."""

import random
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import shardplan as sp
from shardplan.cost import CostOptions, evaluate_strategies
from shardplan.errors import SolverError
from shardplan.mesh import parse_mesh
from shardplan.search import plan
from shardplan.search.exact import dp, ilp
from shardplan.search.exact.model import build_model

from .test_ilp import CHAINS, brute_force, chain_model, mlp2, tiny_attention

OPTS = CostOptions.make()


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@CHAINS
def test_dp_equals_ilp_and_brute_force_on_chains(layers, batch, width, mesh):
    model, best = chain_model(layers, batch, width, mesh)
    choice, value, _ = dp.solve_model(model)
    assert value == pytest.approx(best, rel=1e-9)
    assert model.objective(choice) == pytest.approx(value, rel=1e-12)
    assert ilp.solve_model(model, OPTS).objective == pytest.approx(value, rel=1e-6)


@pytest.mark.parametrize(
    ("graph", "mesh"),
    [
        (mlp2(), "8"),
        (tiny_attention(), "8"),
        (tiny_attention(batch=2, seq=4, hidden=2), "2x2"),
        (sp.zoo.build("gpt2-small", small=True), "12"),
        (sp.zoo.build("moe", small=True), "12"),
        (sp.zoo.build("resnet50", small=True), "6"),
        (sp.zoo.build("bert-base", small=True), "6"),
    ],
    ids=lambda x: getattr(x, "name", x),
)
def test_dp_equals_ilp_on_small_graphs(graph, mesh):
    mesh = parse_mesh(mesh)
    model = build_model(graph, mesh, OPTS)
    choice, value, stats = dp.solve_model(model, time_limit=60)
    exact = ilp.solve_model(model, OPTS)
    assert exact.status == "optimal"
    assert value == pytest.approx(exact.objective, rel=1e-6)
    total = evaluate_strategies(graph, mesh, model.strategies(choice), OPTS).total
    assert total == pytest.approx(value, rel=1e-9)
    assert stats.leaves + stats.nodes + stats.remaining >= 1


def test_dp_eliminates_a_transformer_down_to_a_small_core():
    graph = sp.zoo.build("gpt2-small", small=True, layers=1)
    model = build_model(graph, parse_mesh("6"), OPTS)
    _, _, stats = dp.solve_model(model)
    assert stats.nodes > 10 and stats.remaining < len(graph.ops) // 2
    assert "node eliminations" in stats.text()


def test_solve_dp_returns_an_optimal_plan():
    graph = sp.zoo.build("mlp", small=True)
    p = plan(graph, "8", "dp")
    assert p.method == "dp" and p.status == "optimal"
    assert p.cost.total == pytest.approx(plan(graph, "8", "ilp").cost.total, rel=1e-6)
    assert p.cost.total <= plan(graph, "8").cost.total * (1 + 1e-9)


def test_time_limit_is_did_not_finish():
    graph = sp.zoo.build("gpt2-small", small=True)
    with pytest.raises(SolverError, match=r"dp did not finish within 0.001 s"):
        dp.solve_dp(graph, parse_mesh("8"), OPTS, time_limit=0.001)


def test_time_limit_inside_the_enumeration(monkeypatch):
    """The deadline is checked while enumerating: with eliminations switched off, a realistic
    1-layer GPT is far too large to enumerate, and the DP says so on time."""
    graph = sp.zoo.build("gpt2-small", batch=8, seq=512, hidden=512, heads=8, layers=1, vocab=2048)
    model = build_model(graph, parse_mesh("8"), OPTS)
    monkeypatch.setattr(dp._Dp, "eliminate", lambda self: list(range(len(self.unary))))
    start = time.perf_counter()
    with pytest.raises(SolverError, match="dp did not finish within 1 s .*enumerating 36 ops"):
        dp.solve_model(model, time_limit=1)
    assert time.perf_counter() - start < 3


def test_table_size_guard_is_did_not_finish():
    graph = sp.zoo.build("gpt2-small", small=True, layers=1)
    model = build_model(graph, parse_mesh("8"), OPTS)
    with pytest.raises(SolverError, match="dp did not finish .* dense cost tables"):
        dp.solve_model(model, max_entries=1000)


def test_back_substitution_is_consistent_on_random_unary_noise():
    """Perturbed models (random unary costs) still give DP == brute force."""
    graph = mlp2(batch=8, d_in=2, hidden=4, d_out=4)
    model = build_model(graph, parse_mesh("8"), OPTS)
    rng = random.Random(11)
    for _ in range(3):
        noisy = type(model)(
            model.space,
            tuple(u + np.array([rng.random() * 1e-6 for _ in u]) for u in model.unary),
            model.pairs,
            model.constant,
            0.0,
        )
        best, _ = brute_force(noisy)
        _, value, _ = dp.solve_model(noisy)
        assert value == pytest.approx(best, rel=1e-9)
