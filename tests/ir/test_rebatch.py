"""ir.rebatch: the model at another batch size derived from two builds equals the builder's."""

from __future__ import annotations

import pytest

from shardplan import zoo
from shardplan.ir import Graph, GraphBuilder
from shardplan.ir.rebatch import batch_scaling


def _zoo(name: str, **kw):
    return lambda n: zoo.build(name, batch=n, **kw)


@pytest.mark.parametrize(
    ("build", "learned", "others"),
    [
        (_zoo("gpt3", layers=2, hidden=256, heads=4, vocab=512, seq=64), (48, 16), (8, 24, 96)),
        (_zoo("alexnet"), (64, 16), (8, 32, 2)),
        (_zoo("resnet50"), (32, 8), (4, 2)),
        (_zoo("mixtral-8x7b", layers=1), (32, 8), (4, 16)),
    ],
)
def test_derived_graphs_equal_the_builders(build, learned, others):
    a, b = learned
    scaling = batch_scaling(build(a), a, build(b), b)
    assert scaling is not None
    for n in others:
        assert scaling.at(n) == build(n), n  # the builder is the oracle
    assert scaling.at(a) is scaling.source


def _model(batch: int, hidden=lambda b: 8, rows=lambda b: b) -> Graph:
    g = GraphBuilder("toy")
    x = g.input("x", (rows(batch), hidden(batch)))
    y = g.apply("linear", x, g.param("w", (16, hidden(batch))), name="fc")
    g.apply("relu", y, name="act")
    return g.build()


def test_a_size_that_is_not_proportional_refuses():
    # a dim growing with the batch but not in proportion (batch + 1): build every size
    assert (
        batch_scaling(_model(8, rows=lambda b: b + 1), 8, _model(4, rows=lambda b: b + 1), 4)
        is None
    )
    # a parameter that changes with the batch is not a batch dim either
    assert batch_scaling(_model(8, hidden=lambda b: b), 8, _model(4, hidden=lambda b: b), 4) is None


def test_other_structure_refuses():
    other = GraphBuilder("toy")
    x = other.input("x", (4, 8))
    other.apply("linear", x, other.param("w", (16, 8)), name="fc")
    assert batch_scaling(_model(8), 8, other.build(), 4) is None
    assert batch_scaling(_model(8), 8, _model(8), 8) is None  # one size says nothing


def test_sizes_that_are_not_whole_or_become_one_refuse():
    half = lambda b: b // 2  # noqa: E731
    scaling = batch_scaling(_model(8, rows=half), 8, _model(4, rows=half), 4)
    assert scaling is not None
    assert scaling.at(6) == _model(6, rows=half)
    assert scaling.at(3) is None  # 1.5 rows
    assert scaling.at(2) is None  # one row: the catalogue may write it as a broadcast
    gpt = _zoo("gpt3", layers=1, hidden=64, heads=2, vocab=128, seq=16)
    scaling = batch_scaling(gpt(8), 8, gpt(4), 4)
    assert scaling is not None and scaling.at(1) is None
    # the builder's own graph at 1 has other signatures (size-1 dims dropped) than at 2
    at1, at2 = gpt(1), gpt(2)
    assert any(
        len(p.signature.loop_dims) != len(q.signature.loop_dims)
        for p, q in zip(at1.ops, at2.ops, strict=True)
    )


def test_through_the_catalogue_size_one_gets_the_catalogues_signatures():
    gpt = _zoo("gpt3", layers=1, hidden=64, heads=2, vocab=128, seq=16)
    scaling = batch_scaling(gpt(8), 8, gpt(4), 4)
    assert scaling is not None
    for n in (1, 2, 3, 12):
        assert scaling.through_catalogue(n) == gpt(n), n


@pytest.mark.parametrize("name", sorted(zoo.MODELS))
def test_every_zoo_model_derives_what_its_builder_builds(name):
    build = _zoo(name, small=True)
    scaling = batch_scaling(build(64), 64, build(16), 16)
    assert scaling is not None  # every name the same at each batch (MLA's zeros too)
    for n in (2, 8, 24, 96):
        derived = scaling.at(n)
        assert derived is None or derived == build(n), n


def test_a_field_that_does_not_hash_is_derived_without_the_memo():
    """`at` derives equal fields once by (rule, value); a value that does not hash (an attribute
    holding a list) is derived directly, with the same result."""
    from dataclasses import dataclass

    from shardplan.ir import rebatch

    @dataclass(frozen=True)
    class Holder:
        items: object
        size: int

    rule = rebatch._Fields(
        (("items", rebatch._Items(((0, rebatch._Scaled(4)),))), ("size", rebatch._Scaled(4)))
    )
    memo: dict = {}
    for items in ([4, 5], (4, 5), (4, 5)):
        assert rebatch._apply(rule, Holder(items, 4), 8, 4, memo=memo) == Holder((8, 5), 8)
    assert len(memo) == 1  # the two equal tuples derived once; the list not kept
