"""Typed errors for bad arguments (issue 16 cases 5, 6, 7, 10 and plan()'s argument types)."""

from __future__ import annotations

import math
import signal

import pytest

from shardplan import checks, zoo
from shardplan.errors import ArgumentError, MeshError, SolverError
from shardplan.mesh import Mesh, parse_bytes, parse_mesh
from shardplan.search.api import plan


@pytest.fixture(scope="module")
def graph():
    return zoo.build("mlp", batch=8, sizes=(16, 8, 4))


@pytest.mark.parametrize(
    ("memory", "match"),
    [
        (0, "positive, finite"),
        ("0GB", "positive, finite"),
        (math.nan, "positive, finite"),
        (math.inf, "positive, finite"),
        (-5, "positive, finite"),
        ("40", "has no unit; write e.g. '40GB'"),
        ({"a": 1}, "must be bytes"),
        (True, "must be bytes"),
        ("lots", "cannot parse memory size 'lots'"),
        (10**400, "positive, finite"),  # an int beyond the float range: was an OverflowError
    ],
)
def test_case5_bad_memory_is_a_mesh_error(graph, memory, match):
    with pytest.raises(MeshError, match=match):
        plan(graph, 2, memory=memory)


def test_memory_with_units_still_parses():
    assert parse_bytes("40GB") == 40e9
    assert parse_bytes("40B") == 40
    assert parse_bytes(1024) == 1024.0


@pytest.mark.parametrize(
    ("sizes", "match"),
    [
        ({"heads": 0}, "size heads must be between 1"),
        ({"batch": True}, "size batch must be a whole number"),
        ({"batch": "8"}, "size batch must be a whole number"),
        ({"batch": 2.5}, "size batch must be a whole number"),
        ({"batch": "abc"}, "size batch must be a whole number"),
        ({"batch": math.nan}, "size batch must be a whole number"),
        ({"batch": 2**60}, "between 1 and 2\\*\\*48"),
    ],
)
def test_case6_bad_zoo_sizes(sizes, match):
    with pytest.raises(ArgumentError, match=match):
        zoo.build("gpt2-small", small=True, **sizes)


@pytest.mark.parametrize(
    ("model", "sizes"),
    [("vit-b16", {"patch": 0}), ("moe", {"experts": 0}), ("moe", {"capacity_factor": math.nan})],
)
def test_case6_zero_sizes_that_divided_by_zero(model, sizes):
    with pytest.raises(ArgumentError, match="model"):
        zoo.build(model, small=True, **sizes)


def _alarm(seconds: int):
    def fail(*_):
        raise TimeoutError("hung")

    signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)


@pytest.mark.parametrize("mesh", [2**61 - 1, "2305843009213693951", "3x" + "9" * 30, "9" * 5000])
def test_case7_huge_prime_axis_is_refused_fast(graph, mesh):
    _alarm(5)
    try:
        with pytest.raises(MeshError):
            plan(graph, mesh)
        with pytest.raises(MeshError):
            Mesh((2**61 - 1,))
    finally:
        signal.alarm(0)


def test_largest_mesh_factors_quickly():
    assert len(Mesh((checks.MAX_DEVICES,)).rounds) == 20
    assert [r.q for r in Mesh((1048573,)).rounds] == [1048573]  # a prime below the bound


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (2.5, "mesh must be a Mesh, a whole number"),
        (True, "mesh must be a Mesh, a whole number"),
        (None, "mesh must be a Mesh, a whole number"),
    ],
)
def test_case10_mesh_arguments_are_not_coerced(value, match):
    with pytest.raises(MeshError, match=match):
        parse_mesh(value)


@pytest.mark.parametrize("shape", ["16", (2.5,), (True, 2), 16, (2, "8")])
def test_case10_mesh_shape_is_not_coerced(shape):
    with pytest.raises(MeshError):
        Mesh(shape)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"time_limit": "5", "method": "ilp"}, ArgumentError, "time_limit must be a number"),
        ({"time_limit": -1, "method": "dp"}, ArgumentError, "time_limit must be > 0"),
        ({"time_limit": 5}, SolverError, r"method 'drec' has no option"),
        ({"method": "magic"}, SolverError, "unknown method 'magic'"),
        ({"train": "yes"}, ArgumentError, "train must be True or False"),
        ({"preset": {}}, ArgumentError, "preset must be one of"),
        ({"optimizer": "lion"}, ArgumentError, "optimizer must be one of"),
        ({"memory": {"GB": 4}}, MeshError, "must be bytes"),
    ],
)
def test_plan_argument_types(graph, kwargs, error, match):
    with pytest.raises(error, match=match):
        plan(graph, 2, **kwargs)


def test_plan_needs_a_graph():
    with pytest.raises(ArgumentError, match="graph must be a shardplan Graph"):
        plan("gpt2-small", 2)


def test_bad_bandwidths_and_rates_are_mesh_errors():
    for kwargs in (
        {"bandwidth_bytes_per_s": (math.nan,)},
        {"bandwidth_bytes_per_s": (-1.0,)},
        {"flops_per_s": math.inf},
        {"memory_bytes": math.nan},
    ):
        with pytest.raises(MeshError):
            Mesh((2,), **kwargs)


def test_numbers_beyond_the_float_range_are_argument_errors():
    with pytest.raises(ArgumentError, match="finite"):
        checks.finite_number(10**400, "time_limit")
