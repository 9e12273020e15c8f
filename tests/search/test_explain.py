"""Fixed strategies in D-Rec and the ILP, the ILP's incumbent, and per-op explanations."""

from __future__ import annotations

import math

import pytest

from shardplan import zoo
from shardplan.cost.evaluate import evaluate_strategies
from shardplan.errors import PlanError, SolverError
from shardplan.search import plan
from shardplan.search.exact.ilp import solve_ilp
from shardplan.search.explain import candidates, strategy_diff

FC = "h.0.mlp.fc.linear"


@pytest.fixture(scope="module")
def gpt():
    return zoo.build("gpt2-small", small=True, batch=16, seq=128, hidden=256, heads=4)


def test_drec_keeps_fixed_strategies_and_plans_the_rest(gpt):
    free = plan(gpt, "2x2")
    forced = plan(gpt, "2x2", fixed={FC: ("k", "n"), "h.1.mlp.fc.linear": (None, "n")})
    assert forced.strategies[FC] == ("k", "n")
    assert forced.strategies["h.1.mlp.fc.linear"] == (None, "n")
    # never worse than the free plan with the fixed strategies swapped in
    swapped = {**free.strategies, FC: ("k", "n"), "h.1.mlp.fc.linear": (None, "n")}
    swap_cost = evaluate_strategies(gpt, forced.mesh, swapped, forced.options).total
    assert forced.cost.total <= swap_cost * (1 + 1e-9)


def test_fixed_strategies_are_checked(gpt):
    with pytest.raises(PlanError, match="did you mean"):
        plan(gpt, "2x2", fixed={"h.0.mlp.fc.linea": ("k", "k")})
    with pytest.raises(PlanError, match="one cut per round"):
        plan(gpt, "2x2", fixed={FC: ("k",)})
    with pytest.raises(PlanError, match="h.0.mlp.fc.linear"):
        plan(gpt, "2x2", fixed={FC: ("zz", "k")})
    with pytest.raises(SolverError, match="no option"):
        plan(gpt, "2x2", method="fsdp", fixed={FC: ("k", "k")})


def test_ilp_fixed_is_the_constrained_optimum():
    g = zoo.build("mlp", small=True)
    free = plan(g, "4", method="ilp")
    fixed = {"fc1.linear": ("k", "k")}
    forced = plan(g, "4", method="ilp", fixed=fixed)
    assert forced.strategies["fc1.linear"] == ("k", "k") and forced.status == "optimal"
    assert forced.cost.total >= free.cost.total * (1 - 1e-9)
    drec_forced = plan(g, "4", fixed=fixed)  # D-Rec under the same constraint is no better
    assert drec_forced.cost.total >= forced.cost.total * (1 - 1e-9)


def test_ilp_incumbent_when_highs_has_no_plan(gpt):
    seed = plan(gpt, "2x2")
    p = solve_ilp(gpt, seed.mesh, seed.options, time_limit=0.001, incumbent=seed.strategies)
    assert p.strategies == seed.strategies and p.method == "ilp"
    assert p.status == "did not finish: no ILP plan, D-Rec's plan kept (not proven optimal)"
    with pytest.raises(SolverError, match="did not finish"):
        solve_ilp(gpt, seed.mesh, seed.options, time_limit=0.001)


def test_candidate_terms_add_up_to_the_evaluator_total(gpt):
    p = plan(gpt, "2x2")
    cands = candidates(p, FC)
    valid = [c for c in cands if c.problem is None]
    assert len(valid) >= 6 and sum(c.chosen for c in valid) == len(p.mesh.rounds)
    for c in valid:
        total = evaluate_strategies(gpt, p.mesh, {**p.strategies, FC: c.strategy}, p.options)
        assert c.total == pytest.approx(total.total, rel=1e-12)
        assert c.parts_sum == pytest.approx(c.total, rel=1e-9)
        assert c.redistribution == math.fsum(e.cost for e in c.edges)
        assert {e.direction for e in c.edges} <= {"in", "out", "home"}


def test_strategy_diff(gpt):
    a, b = plan(gpt, "2x2"), plan(gpt, "2x2", method="megatron")
    rows = strategy_diff(a, b)
    assert [r[0] for r in rows] == [
        op.name for op in gpt.ops if a.strategies[op.name] != b.strategies[op.name]
    ]
    with pytest.raises(PlanError, match="different"):
        strategy_diff(a, plan(zoo.build("mlp", small=True), "2x2"))


@pytest.mark.parametrize("zero", [1, 3])
def test_candidate_terms_of_a_zero_plan_add_up_and_keep_the_stage(gpt, zero):
    from shardplan.plans import Plan, with_zero

    p = plan(gpt, "2x2", zero=zero)
    valid = [c for c in candidates(p, FC) if c.problem is None]
    assert len(valid) >= 6
    for c in valid:
        swapped = Plan(gpt, p.mesh, {**p.strategies, FC: c.strategy}, "x")
        assert c.total == pytest.approx(with_zero(swapped, zero).cost.total, rel=1e-12)
        assert c.parts_sum == pytest.approx(c.total, rel=1e-9)
