"""Plan files are parsed against a schema: every corruption is a typed error (issue 16 case 8)."""

from __future__ import annotations

import copy
import json

import pytest

from shardplan import zoo
from shardplan.errors import IRError, MeshError, PlanError, ShardplanError
from shardplan.exporters.plan_json import from_json, to_json
from shardplan.plans import Plan, validate
from shardplan.search.api import plan


@pytest.fixture(scope="module")
def data():
    return json.loads(to_json(plan(zoo.build("mlp", batch=8, sizes=(16, 8, 4)), 4)))


def _set(data, path, value):
    out = copy.deepcopy(data)
    target = out
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return out


CORRUPTIONS = [
    (("param_layouts",), [1, 2], "param_layouts: expected an object"),
    (("param_layouts",), "abc", "param_layouts: expected an object"),
    (("param_layouts",), {"x": [-7, 0]}, "a tensor dim or -1"),
    (("ops", 0, "strategy"), [3, None], "a loop-dim name or null"),
    (("graph", "tensors", 0, 1), [8, float("inf")], "shape\\[1\\]: expected a whole number"),
    (("graph", "tensors", 0, 1), [8, 2.5], "shape\\[1\\]: expected a whole number"),
    (("graph", "ops", 0, "flops"), float("nan"), "flops: expected a finite number"),
    (("graph", "ops", 0, "flops"), float("inf"), "flops: expected a finite number"),
    (("graph", "ops", 0, "flops"), -1.0, "flops: expected a finite number >= 0"),
    (("mesh", "bandwidth_bytes_per_s"), [float("nan")], "expected a finite number > 0"),
    (("mesh", "bandwidth_bytes_per_s"), [-1e9], "expected a finite number > 0"),
    (("mesh", "bandwidth_bytes_per_s"), [0], "expected a finite number > 0"),
    (("mesh", "flops_per_s"), float("inf"), "mesh.flops_per_s"),
    (("mesh", "shape"), [2**61 - 1], "mesh.shape\\[0\\]"),
    (("mesh", "shape"), "4", "mesh.shape: expected a list"),
    (("options", "train"), "yes", "options.train"),
    (("search_seconds",), -3, "search_seconds"),
    (("graph",), [], "graph: expected an object"),
    (("graph", "ops", 0, "loop_dims", 0), ["b", 8], "loop_dims\\[0\\]"),
    (("notes",), [1], "notes\\[0\\]"),
]


@pytest.mark.parametrize(("path", "value", "match"), CORRUPTIONS)
def test_corrupt_field_is_a_plan_error_naming_it(data, path, value, match):
    bad = _set(data, path, value)
    text = json.dumps(bad)  # NaN / Infinity are written as JSON's non-standard literals
    with pytest.raises(PlanError, match=match):
        from_json(text)


def test_deep_nesting_is_a_plan_error():
    for depth in (100, 100_000):
        text = '{"schema": "shardplan.plan/1", "graph": ' + "[" * depth + "]" * depth + "}"
        with pytest.raises(PlanError, match="nested"):
            from_json(text)


@pytest.mark.parametrize("text", ["", "{", "[]", "null", '{"schema": 1}', "\x00", "1e999"])
def test_not_a_plan(text):
    with pytest.raises(PlanError):
        from_json(text)


def test_round_trip_still_exact(data):
    p = from_json(json.dumps(data))
    assert p.cost.total == pytest.approx(data["cost"]["total"])


def test_validate_rejects_a_layout_below_replicated(data):
    p = from_json(json.dumps(data))
    name = next(iter(t.name for t in p.graph.parameters))
    bad = Plan(
        p.graph, p.mesh, p.strategies, "x", p.options, cost=p.cost, param_layouts={name: (-7, -1)}
    )
    with pytest.raises(PlanError, match="must be a tensor dim or -1"):
        validate(bad)


def test_semantic_corruptions_are_typed(data):
    # values of the right type but meaning nothing: still typed errors, never a traceback
    for path, value in [
        (("graph", "tensors", 0, 3), "weird-role"),
        (("graph", "ops", 0, "kind"), 7),
        (("mesh", "machine"), "tpu"),
        (("options", "optimizer"), "lion"),
        (("ops", 0, "strategy"), ["nope", None]),
    ]:
        with pytest.raises((PlanError, IRError, MeshError, ShardplanError)):
            from_json(json.dumps(_set(data, path, value)))
