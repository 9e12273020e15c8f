"""The solver registry: typed options per method; unknown methods and options are typed errors."""

import pytest

from shardplan import zoo
from shardplan.errors import SolverError
from shardplan.problem import Problem
from shardplan.search import METHODS, plan, solve
from shardplan.search.solvers import (
    SOLVERS,
    DrecOptions,
    IlpOptions,
    NoOptions,
    given,
    solver_options,
)


def test_every_method_is_registered_once():
    assert METHODS == tuple(SOLVERS) == (
        *("drec", "ilp", "dp", "data-parallel", "megatron", "fsdp"),
        *("step", "megatron-recipe"),
    )


def test_options_are_typed_and_unknown_ones_rejected():
    opts = solver_options("ilp", {"time_limit": 5})
    assert isinstance(opts, IlpOptions) and given(opts) == {"time_limit": 5}
    assert isinstance(solver_options("drec", {}), DrecOptions)
    assert isinstance(solver_options("megatron", {}), NoOptions)
    with pytest.raises(SolverError, match=r"'drec' has no option\(s\) \['time_limit'\]"):
        solver_options("drec", {"time_limit": 5})
    with pytest.raises(SolverError, match=r"no option\(s\) \['time_limimt'\]; it takes \["):
        plan(zoo.build("mlp", small=True), "8", "ilp", time_limimt=5)
    with pytest.raises(SolverError, match="unknown method 'greedy'"):
        solve(Problem.make(zoo.build("mlp", small=True), "8"), "greedy")


def test_solve_on_a_problem_equals_plan():
    g = zoo.build("mlp", small=True)
    a = plan(g, "2x4", memory="1GB")
    b = solve(Problem.make(g, "2x4", memory="1GB"))
    assert a.strategies == b.strategies and a.cost.total == b.cost.total
