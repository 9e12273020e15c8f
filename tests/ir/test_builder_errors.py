"""Builder misuse raises typed IR errors naming the op and attribute (issue 16 case 9)."""

from __future__ import annotations

import math

import pytest

from shardplan.errors import IRError
from shardplan.ir.graph import GraphBuilder


def _x(b, shape=(2, 3)):
    return b.input("x", shape)


CASES = [
    ("einsum without ->", lambda b: b.apply("einsum", _x(b), spec="i j"), "exactly one '->'"),
    ("two arrows", lambda b: b.apply("einsum", _x(b), spec="i j -> i -> j"), "exactly one '->'"),
    ("group", lambda b: b.apply("einsum", _x(b), spec="(i j) -> i"), "no groups"),
    ("spec not text", lambda b: b.apply("einsum", _x(b), spec=3), "must be text"),
    (
        "unknown result letter",
        lambda b: b.apply("einsum", _x(b), spec="i j -> c"),
        "result loop dims \\['c'\\] appear in no input",
    ),
    ("perm text", lambda b: b.apply("transpose", _x(b), perm="ab"), "perm must be a tuple"),
    ("concat of nothing", lambda b: b.apply("concat"), "concat needs at least one input"),
    ("nan shape", lambda b: b.input("x", (2, math.nan)), "a shape is a tuple of whole numbers"),
    ("float shape", lambda b: b.input("x", (2, 2.5)), "a shape is a tuple of whole numbers"),
    ("text shape", lambda b: b.input("x", "23"), "a shape is a tuple of whole numbers"),
    ("axis text", lambda b: b.apply("softmax", _x(b), axis="x"), "softmax"),
    (
        "stride 0",
        lambda b: b.apply("conv2d", _x(b, (1, 3, 8, 8)), b.param("w", (4, 3, 3, 3)), stride=0),
        "stride must be an int or a pair of ints >= 1",
    ),
    ("kernel 0", lambda b: b.apply("pool2d", _x(b, (1, 3, 8, 8)), kernel=0), "kernel must be"),
    ("reshape text", lambda b: b.apply("reshape", _x(b), shape="6"), "shape must be a tuple"),
    ("reshape zero", lambda b: b.apply("reshape", _x(b), shape=(0, 6)), "sizes below 1"),
]


@pytest.mark.parametrize(("what", "build", "match"), CASES, ids=[c[0] for c in CASES])
def test_builder_misuse_is_typed(what, build, match):
    b = GraphBuilder("g")
    with pytest.raises(IRError, match=match):
        build(b)
        b.build()


def test_axes_as_one_int_means_that_axis():
    b = GraphBuilder("g")
    y = b.apply("reduce_sum", _x(b), axes=1)
    assert b.shape(y) == (2,)
