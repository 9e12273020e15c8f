"""The exact ILP: its space, its cost model against the evaluator, optimality against brute force,
the memory constraint, honest statuses, and ILP <= every other method."""

import itertools
import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import shardplan as sp
from shardplan.cost import CostOptions, evaluate_strategies
from shardplan.cost.evaluate import memory_per_device, param_homes
from shardplan.cost.linear import memory_from_pieces, memory_piece_arrays, memory_pieces
from shardplan.errors import InfeasibleError, PlanError, SolverError
from shardplan.ir import GraphBuilder
from shardplan.mesh import parse_mesh
from shardplan.search import plan
from shardplan.search.exact import ilp
from shardplan.search.exact.model import build_model
from shardplan.search.exact.space import build_space, count_strategies, op_strategies
from shardplan.sharding import check_strategy, operand_layout, resolved

MESH8 = parse_mesh("8")
OPTS = CostOptions.make()


# -- small graphs ------------------------------------------------------------------------------
def mlp2(batch=4, d_in=3, hidden=2, d_out=5):
    """A 2-layer MLP: matmul, relu, matmul, bias (a parameter add)."""
    b = GraphBuilder("mlp2")
    x = b.input("x", (batch, d_in))
    h = b.apply("matmul", x, b.param("w1", (d_in, hidden)), name="fc1")
    h = b.apply("relu", h, name="act1")
    h = b.apply("matmul", h, b.param("w2", (hidden, d_out)), name="fc2")
    b.apply("add", h, b.param("b2", (batch, d_out)), name="bias2")
    return b.build()


def tiny_attention(batch=1, seq=3, hidden=2):
    """One attention block with every kind of pair term: edges, gradient credits between q/k/v
    (they read the same activation) and a parameter home (k and v share a weight)."""
    b = GraphBuilder("attn")
    x = b.input("x", (batch, seq, hidden))
    x = b.apply("add", x, b.param("pos", (batch, seq, hidden)), name="embed")
    q = b.apply("linear", x, b.param("wq", (hidden, hidden)), name="q")
    wkv = b.param("wkv", (hidden, hidden))
    k = b.apply("linear", x, wkv, name="k")
    v = b.apply("linear", x, wkv, name="v")
    scores = b.apply("bmm", q, k, transpose_b=True, name="scores")
    probs = b.apply("softmax", scores, axis=-1, name="probs")
    ctx = b.apply("bmm", probs, v, name="context")
    b.apply("add", ctx, x, name="residual")
    return b.build()


def brute_force(model, opts=OPTS, memory=None):
    """Exhaustive: the cost of every combination of strategies, as one dense numpy array."""
    sizes = [len(u) for u in model.unary]
    n = len(sizes)
    assert math.prod(sizes) <= 5_000_000

    def axis_shape(*axes):
        return [sizes[i] if i in axes else 1 for i in range(n)]

    total = np.full(sizes, model.constant)
    for i, u in enumerate(model.unary):
        total += u.reshape(axis_shape(i))
    for p in model.pairs:
        d = p.dense() if p.u < p.v else p.dense().T
        total += d.reshape(axis_shape(p.u, p.v))
    if memory is not None:
        graph, mesh = model.space.graph, model.space.mesh
        pieces = memory_piece_arrays(graph, mesh.rounds, model.space.strategies, opts)
        used = np.zeros(sizes)
        for i, pc in enumerate(pieces):
            used += (pc.param + pc.activation).reshape(axis_shape(i))
        total = np.where(used <= memory, total, np.inf)
    best = np.unravel_index(int(np.argmin(total)), total.shape)
    return float(total[best]), [int(i) for i in best]


def chain_graph(layers, batch, width):
    """A chain of matmuls / elementwise ops drawn by hypothesis."""
    b = GraphBuilder("chain")
    h = b.input("x", (batch, width))
    for i, (kind, size) in enumerate(layers):
        if kind == "matmul":
            h = b.apply("matmul", h, b.param(f"w{i}", (b.shape(h)[1], size)), name=f"mm{i}")
        elif kind == "add":
            h = b.apply("add", h, b.param(f"p{i}", b.shape(h)), name=f"add{i}")
        else:
            h = b.apply("relu", h, name=f"relu{i}")
    return b.build()


CHAIN_LAYERS = st.lists(
    st.tuples(st.sampled_from(["matmul", "relu", "add"]), st.sampled_from([1, 2, 3, 4, 6])),
    min_size=1,
    max_size=5,
)
CHAINS = given(
    layers=CHAIN_LAYERS,
    batch=st.sampled_from([1, 2, 4, 8]),
    width=st.sampled_from([1, 2, 3, 4]),
    mesh=st.sampled_from(["8", "2x2", "6"]),
)
"""Hypothesis cases of `chain_model`: a drawn chain on a small mesh."""


def chain_model(layers, batch, width, mesh):
    """The cost model of `chain_graph(layers, batch, width)` on `mesh` and its brute-force
    optimum; the case is discarded when the space is too large to enumerate."""
    graph = chain_graph(layers, batch, width)
    mesh = parse_mesh(mesh)
    space = build_space(graph, mesh)
    assume(math.prod(space.sizes) <= 2_000_000)
    model = build_model(graph, mesh, OPTS, space=space)
    return model, brute_force(model)[0]


# -- the strategy space ------------------------------------------------------------------------
@pytest.mark.parametrize("mesh", ["8", "2x3", "12", "4x8"])
def test_space_is_every_valid_assignment(mesh):
    rounds = parse_mesh(mesh).rounds
    graph = sp.zoo.build("gpt2-small", small=True, layers=1)
    for op in graph.ops[:12]:
        got = op_strategies(op, rounds)
        assert len(got) == len(set(got)) == count_strategies(op, rounds)
        assert got == op_strategies(op, rounds)  # deterministic
        choices = [d.name for d in op.signature.loop_dims] + [None]
        valid = []
        for s in itertools.product(choices, repeat=len(rounds)):
            try:
                check_strategy(op, s, rounds)
            except PlanError:
                continue
            valid.append(s)
        assert set(got) == set(valid), op.name


def test_space_size_guard_names_the_problem():
    graph = sp.zoo.build("gpt2-small", small=True)
    with pytest.raises(SolverError, match="strategy space .* has more than 100 strategies"):
        build_space(graph, parse_mesh("4x8"), max_strategies=100, method="ilp")


# -- the cost model is the evaluator -----------------------------------------------------------
@pytest.mark.parametrize(
    ("model", "mesh", "preset", "train"),
    [
        ("gpt2-small", "2x4", "shardplan", True),
        ("gpt2-small", "12", "shardplan", False),
        ("resnet50", "6", "shardplan", True),
        ("moe", "8", "mindspore", True),
        ("wide-deep", "2x2", "shardplan", True),
    ],
)
def test_model_objective_equals_the_evaluator(model, mesh, preset, train):
    graph = sp.zoo.build(model, small=True)
    mesh = parse_mesh(mesh)
    opts = CostOptions.make(preset, train)
    cost_model = build_model(graph, mesh, opts)
    rng = random.Random(7)
    for _ in range(12):
        choice = [rng.randrange(len(u)) for u in cost_model.unary]
        want = evaluate_strategies(graph, mesh, cost_model.strategies(choice), opts).total
        assert cost_model.objective(choice) == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize(("mesh", "preset"), [("2x4", "shardplan"), ("2x2x3", "mindspore")])
def test_round_split_equals_the_tables(mesh, preset):
    """The round-by-round form of every edge/home term equals its table, everywhere."""
    graph = sp.zoo.build("gpt2-small", small=True, layers=1)
    opts = CostOptions.make(preset)
    model = build_model(graph, parse_mesh(mesh), opts)
    split_terms = [p for p in model.pairs if p.split is not None]
    assert len(split_terms) >= len([p for p in model.pairs if p.kind != "share"])
    for p in split_terms:
        np.testing.assert_allclose(p.split.dense(), p.dense(), rtol=1e-9, atol=0)
    lean = build_model(graph, parse_mesh(mesh), opts, table_limit=0)
    assert any(p.table is None for p in lean.pairs)
    rng = random.Random(5)
    for _ in range(5):
        choice = [rng.randrange(len(u)) for u in model.unary]
        assert lean.objective(choice) == pytest.approx(model.objective(choice), rel=1e-9)


@pytest.mark.parametrize("train", [True, False])
def test_memory_pieces_add_up_to_the_evaluator(train):
    graph = sp.zoo.build("gpt2-small", small=True)
    mesh = parse_mesh("2x4")
    opts = CostOptions.make(train=train)
    space = build_space(graph, mesh)
    rng = random.Random(3)
    for _ in range(10):
        strategies = {
            op.name: rng.choice(s) for op, s in zip(graph.ops, space.strategies, strict=True)
        }
        homes = param_homes(graph, strategies)
        outs = {
            name: resolved(operand_layout(op, strategies[op.name], i, True))
            for op in graph.ops
            for i, name in enumerate(op.outputs)
        }
        want = memory_per_device(graph, mesh.rounds, homes, outs, strategies, opts)
        pieces = [
            memory_pieces(graph, i, strategies[op.name], mesh.rounds, opts)
            for i, op in enumerate(graph.ops)
        ]
        got = memory_from_pieces(pieces, train)
        assert got == pytest.approx(want, rel=1e-12)


# -- optimality --------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "graph", [mlp2(), mlp2(batch=8, d_in=2, hidden=3, d_out=4), tiny_attention()], ids=str
)
def test_ilp_equals_brute_force(graph):
    model = build_model(graph, MESH8, OPTS)
    best, choice = brute_force(model)
    assert evaluate_strategies(graph, MESH8, model.strategies(choice), OPTS).total == pytest.approx(
        best, rel=1e-9
    )
    for split in ("never", "always"):
        result = ilp.solve_model(model, OPTS, split=split)
        assert result.status == "optimal"
        assert result.objective == pytest.approx(best, rel=1e-6)
        assert result.solver_objective == pytest.approx(best, rel=1e-6)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@CHAINS
def test_ilp_equals_brute_force_on_chains(layers, batch, width, mesh):
    model, best = chain_model(layers, batch, width, mesh)
    for split in ("never", "always"):
        result = ilp.solve_model(model, OPTS, split=split)
        assert result.status == "optimal"
        assert result.objective == pytest.approx(best, rel=1e-6)
        assert result.solver_objective == pytest.approx(best, rel=1e-6)


def test_round_split_formulation_matches_on_a_deeper_mesh():
    """Mesh 2x2x2 (three axes, two bandwidths): both formulations find the same optimum."""
    graph = tiny_attention(batch=2, seq=4, hidden=2)
    mesh = parse_mesh("2x2x2")
    model = build_model(graph, mesh, OPTS)
    a = ilp.solve_model(model, OPTS, split="never")
    b = ilp.solve_model(model, OPTS, split="always")
    assert a.status == b.status == "optimal"
    assert b.objective == pytest.approx(a.objective, rel=1e-6)
    assert b.solver_objective == pytest.approx(b.objective, rel=1e-6)
    assert b.size["split_terms"] > 0 and a.size["split_terms"] == 0


def test_ilp_objective_equals_the_evaluator_total():
    graph = sp.zoo.build("moe", small=True)
    mesh = parse_mesh("12")
    model = build_model(graph, mesh, OPTS)
    result = ilp.solve_model(model, OPTS)
    total = evaluate_strategies(graph, mesh, model.strategies(result.choice), OPTS).total
    assert result.solver_objective == pytest.approx(total, rel=1e-6)
    p = plan(graph, mesh, "ilp")
    assert p.status == "optimal" and p.method == "ilp"
    assert p.cost.total == pytest.approx(total, rel=1e-6)
    assert "binaries" in p.notes[0]


@pytest.mark.parametrize(
    ("model", "mesh"),
    [
        ("mlp", "8"),
        ("alexnet", "8"),
        ("wide-deep", "2x4"),
        ("gpt2-small", "12"),
        ("vit-b16", "12"),
        ("resnet50", "6"),
    ],
)
def test_ilp_is_no_worse_than_any_method(model, mesh):
    graph = sp.zoo.build(model, small=True)
    best = plan(graph, mesh, "ilp", time_limit=60)
    assert best.status == "optimal"
    for method in ("drec", "data-parallel", "megatron", "fsdp"):
        other = plan(graph, mesh, method)
        assert best.cost.total <= other.cost.total * (1 + 1e-6), method


# -- memory ------------------------------------------------------------------------------------
def test_memory_budget_matches_constrained_brute_force():
    graph = mlp2(batch=8, d_in=2, hidden=4, d_out=4)
    model = build_model(graph, MESH8, OPTS)
    free, choice = brute_force(model)
    free_memory = evaluate_strategies(
        graph, MESH8, model.strategies(choice), OPTS
    ).memory_per_device
    budget = 0.8 * free_memory
    constrained, _ = brute_force(model, memory=budget)
    assert constrained > free
    result = ilp.solve_model(model, OPTS, memory=budget)
    assert result.objective == pytest.approx(constrained, rel=1e-6)
    p = ilp.solve_ilp(graph, MESH8, OPTS, memory=budget)
    assert p.cost.memory_per_device <= budget * (1 + 1e-9)


def test_inference_memory_budget_is_respected():
    graph = sp.zoo.build("mlp", small=True)
    opts = CostOptions.make(train=False)
    free = ilp.solve_ilp(graph, MESH8, opts)
    budget = 0.5 * free.cost.memory_per_device
    p = ilp.solve_ilp(graph, MESH8, opts, memory=budget)
    assert p.cost.memory_per_device <= budget * (1 + 1e-9)
    assert p.cost.total >= free.cost.total


def test_infeasible_budget_raises():
    with pytest.raises(InfeasibleError, match="no plan of 'mlp2'"):
        ilp.solve_ilp(mlp2(), MESH8, OPTS, memory=1.0)
    with pytest.raises(InfeasibleError):
        plan(mlp2(), "8", "ilp", memory="10B")


# -- honest statuses ---------------------------------------------------------------------------
def test_time_limit_before_a_plan_is_did_not_finish():
    graph = sp.zoo.build("gpt2-small", small=True)
    with pytest.raises(SolverError, match="ilp did not finish within 0.001 s"):
        ilp.solve_ilp(graph, MESH8, OPTS, time_limit=0.001)


def test_size_guard_is_did_not_finish():
    graph = sp.zoo.build("gpt2-small", small=True)
    with pytest.raises(SolverError, match="ilp did not finish: the formulation"):
        ilp.solve_ilp(graph, parse_mesh("12"), OPTS, max_pair_columns=20_000)


class _FakeResult:
    def __init__(self, status, x, gap=0.0, fun=0.0, message="fake"):
        self.status, self.x, self.mip_gap, self.fun, self.message = status, x, gap, fun, message


@pytest.mark.parametrize(
    ("status", "has_x", "expect"),
    [
        (1, True, "time-limit (gap 5.00%)"),
        (1, False, SolverError),
        (2, False, InfeasibleError),
        (0, True, "optimal"),
    ],
)
def test_statuses_follow_highs(monkeypatch, status, has_x, expect):
    model = build_model(mlp2(), MESH8, OPTS)
    n = sum(len(u) for u in model.unary)

    def fake_milp(c, **kwargs):
        x = None
        if has_x:
            x = np.zeros(len(c))
            offsets = np.concatenate([[0], np.cumsum([len(u) for u in model.unary])])
            x[offsets[:-1]] = 1.0
        return _FakeResult(status, x, gap=0.05)

    monkeypatch.setattr(ilp, "milp", fake_milp)
    if isinstance(expect, str):
        result = ilp.solve_model(model, OPTS)
        assert result.status == expect
        assert result.choice == (0,) * len(model.unary)
        assert n > len(model.unary)
    else:
        with pytest.raises(expect, match="did not finish|infeasible"):
            ilp.solve_model(model, OPTS)
