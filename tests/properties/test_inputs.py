"""Corrupt input -> a typed ShardplanError, never another exception (issue 16's property suite).

Plan files with a random field replaced by junk (NaN, infinities, negatives, wrong types, deep
nesting), random arguments to `plan()`, `Mesh`, `parse_mesh`, `parse_bytes` and the zoo, and
random catalogue ops with random shapes and attributes through the public builder.
"""

from __future__ import annotations

import copy
import inspect
import json
import math

from hypothesis import given
from hypothesis import strategies as st

from shardplan import zoo
from shardplan.errors import ShardplanError
from shardplan.exporters.plan_json import from_json, to_json
from shardplan.ir.catalogue import CATALOGUE
from shardplan.ir.graph import GraphBuilder
from shardplan.mesh import Mesh, parse_bytes, parse_mesh
from shardplan.search.api import plan

from .strategies import JSON_JUNK, graphs

NAMED = {
    name
    for name, p in inspect.signature(plan).parameters.items()
    if p.kind is not inspect.Parameter.VAR_KEYWORD
}
"""plan()'s named parameters: an option of that name is a Python call error, not shardplan's."""
ANY = st.one_of(JSON_JUNK, st.floats(allow_nan=True), st.text(max_size=12), st.tuples(JSON_JUNK))


def _paths(data, prefix=()):
    yield prefix
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _paths(v, (*prefix, i))


@given(graphs(max_ops=3), st.data())
def test_a_corrupt_plan_file_is_a_typed_error_or_a_valid_plan(graph, data):
    good = json.loads(to_json(plan(graph, "6")))
    paths = [p for p in _paths(good) if p and p[0] not in ("cost",)]
    bad = copy.deepcopy(good)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        target = bad
        try:
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = data.draw(JSON_JUNK)
        except (KeyError, IndexError, TypeError):  # an earlier change removed this path
            pass
    try:
        p = from_json(json.dumps(bad))
    except ShardplanError:
        return
    assert math.isfinite(p.cost.total) and p.cost.total >= 0


@given(
    st.one_of(st.sampled_from(["8", "2x3", 6]), ANY),
    st.one_of(st.none(), st.sampled_from(["80GB", 1e9]), ANY),
    st.one_of(st.sampled_from(["drec", "ilp", "fsdp"]), ANY),
    st.one_of(st.booleans(), ANY),
    st.one_of(st.sampled_from(["shardplan", "mindspore"]), ANY),
    st.one_of(
        st.sampled_from([{}, {"time_limit": 5}]),
        st.dictionaries(st.text(max_size=10).filter(lambda k: k not in NAMED), ANY, max_size=2),
    ),
)
def test_random_plan_arguments_are_typed_errors(mesh, memory, method, train, preset, options):
    graph = zoo.build("mlp", batch=4, sizes=(6, 4))
    try:
        p = plan(graph, mesh, method, train=train, memory=memory, preset=preset, **options)
    except ShardplanError:
        return
    assert math.isfinite(p.cost.total)


@given(ANY, ANY, ANY)
def test_random_mesh_and_size_arguments_are_typed_errors(a, b, c):
    for call in (
        lambda: Mesh(a),
        lambda: Mesh((2,), bandwidth_bytes_per_s=b),
        lambda: Mesh((2,), memory_bytes=c, flops_per_s=b),
        lambda: parse_mesh(a, machine="a100" if b is None else b),
        lambda: parse_bytes(a),
        lambda: zoo.build("gpt2-small", small=True, heads=a, batch=2),
        lambda: zoo.build("wide-deep", small=True, deep=b),
    ):
        try:
            call()
        except ShardplanError:
            pass


SHAPES = st.lists(st.lists(st.integers(1, 9), min_size=0, max_size=4).map(tuple), max_size=3)
ATTRS = st.dictionaries(
    st.sampled_from(
        [
            "axis",
            "axes",
            "perm",
            "shape",
            "spec",
            "stride",
            "kernel",
            "padding",
            "keepdims",
            "transpose_b",
            "groups",
            "frozen",
            "mode",
        ]
    ),
    st.one_of(ANY, st.sampled_from(["i j -> j", "a b, b c -> a c", "->", (1, 0), (0,), 2, -1])),
    max_size=3,
)


@given(st.sampled_from(sorted(CATALOGUE)), SHAPES, ATTRS)
def test_random_catalogue_ops_are_typed_errors(kind, shapes, attrs):
    b = GraphBuilder("g")
    names = [b.input(f"x{i}", s) if s else b.input(f"x{i}", (1,)) for i, s in enumerate(shapes)]
    try:
        b.apply(kind, *names, name="op", **attrs)
        b.build()
    except ShardplanError:
        pass
