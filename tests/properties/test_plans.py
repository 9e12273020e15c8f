"""Invariants of every plan on generated graphs and meshes (issue 16's property suite).

* a plan validates, its cost is finite and equals the evaluator's score of its strategies,
  it round-trips through JSON, and planning twice gives the same plan;
* every cut divides every tensor dim it splits (inputs, outputs, parameter storage);
* D-Rec <= min(all replicated, every expert plan);
* the ILP optimum <= every method;
* a memory budget is met, or InfeasibleError.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardplan.cost import CostOptions
from shardplan.errors import InfeasibleError, SolverError
from shardplan.exporters.plan_json import from_json, to_json
from shardplan.mesh import parse_mesh
from shardplan.plans import Plan, evaluate
from shardplan.search.api import plan
from shardplan.search.drec.baselines import baseline_plans
from shardplan.sharding import operand_layout, split_counts

from .strategies import MESHES, PRESETS, graphs

METHODS = ["drec", "data-parallel", "megatron", "fsdp"]
REL = 1e-9


def _cuts_divide(p: Plan) -> None:
    rounds = p.mesh.rounds
    for op in p.graph.ops:
        s = p.strategies[op.name]
        for side, names in ((False, op.inputs), (True, op.outputs)):
            for i, name in enumerate(names):
                shape = p.graph.tensors[name].shape
                layout = tuple(max(x, -1) for x in operand_layout(op, s, i, side))
                counts = split_counts(layout, len(shape), rounds)
                assert all(n % c == 0 for n, c in zip(shape, counts, strict=True)), (
                    op.name,
                    name,
                    shape,
                    counts,
                )
    for name, layout in p.param_layouts.items():
        shape = p.graph.tensors[name].shape
        counts = split_counts(layout, len(shape), rounds)
        assert all(n % c == 0 for n, c in zip(shape, counts, strict=True)), (name, layout)


@given(graphs(), MESHES, PRESETS, st.sampled_from(METHODS), st.booleans())
def test_every_plan_is_valid_finite_exact_and_round_trips(graph, mesh, preset, method, train):
    p = plan(graph, mesh, method, train=train, preset=preset)
    assert math.isfinite(p.cost.total) and p.cost.total >= 0
    assert math.isfinite(p.cost.memory_per_device) and p.cost.memory_per_device >= 0
    assert evaluate(p).total == pytest.approx(p.cost.total, rel=REL, abs=1e-15)
    _cuts_divide(p)
    back = from_json(to_json(p))
    assert dict(back.strategies) == dict(p.strategies)
    assert dict(back.param_layouts) == dict(p.param_layouts)
    assert back.cost.total == pytest.approx(p.cost.total, rel=REL, abs=1e-15)
    again = plan(graph, mesh, method, train=train, preset=preset)
    assert dict(again.strategies) == dict(p.strategies)  # deterministic


@given(graphs(), MESHES, PRESETS, st.booleans())
def test_drec_never_above_all_replicated_or_an_expert_plan(graph, mesh, preset, train):
    m = parse_mesh(mesh)
    opts = CostOptions.make(preset, train, "adam")
    got = plan(graph, m, train=train, preset=preset).cost.total
    for b in baseline_plans(graph, m, opts):
        assert got <= b.cost.total * (1 + REL) + 1e-15, (b.method, got, b.cost.total)


@given(graphs(max_ops=4), st.sampled_from(["2", "3", "4", "6", "2x3", "2x2x2"]), PRESETS)
def test_ilp_optimum_is_at_most_every_method(graph, mesh, preset):
    try:
        best = plan(graph, mesh, "ilp", preset=preset, time_limit=30)
    except SolverError:  # the time limit: no claim to check
        return
    if best.status != "optimal":
        return
    for method in [*METHODS, "dp"]:
        try:
            other = plan(graph, mesh, method, preset=preset)
        except SolverError:
            continue
        assert best.cost.total <= other.cost.total * (1 + 1e-6) + 1e-12, method


@given(
    graphs(),
    MESHES,
    st.sampled_from(["drec", "data-parallel", "fsdp", "megatron"]),
    st.floats(0.05, 1.2),
)
def test_a_budget_is_met_or_infeasible(graph, mesh, method, fraction):
    free = plan(graph, mesh, method).cost.memory_per_device
    budget = max(free * fraction, 1.0)
    try:
        p = plan(graph, mesh, method, memory=budget)
    except InfeasibleError:
        return
    assert p.cost.memory_per_device <= budget
