"""search.step.sizes: the step search's model per micro-batch size, built or derived."""

from __future__ import annotations

from shardplan import zoo
from shardplan.ir import GraphBuilder
from shardplan.ir.segments import segments
from shardplan.search.step.sizes import ModelSizes


def _counted(build):
    calls = []

    def counted(b):
        calls.append(b)
        return build(b)

    return counted, calls


def test_a_model_that_scales_is_built_three_times():
    oracle = lambda b: zoo.build("gpt3", batch=b, layers=2, hidden=128, heads=2, vocab=256, seq=32)  # noqa: E731
    build, calls = _counted(oracle)
    sizes = ModelSizes(build, oracle(64), 64)
    for b in (16, 32, 8, 4, 2):
        graph, segs, _, _ = sizes(b)
        assert graph == oracle(b)
        assert segs == segments(oracle(b))
    assert calls == [16, 32]  # learned from 64 and 16, checked at 32, then derived
    assert sizes.derived == 3
    assert sizes(16)[0] is sizes(16)[0]  # cached


def _toy(b: int):
    g = GraphBuilder("toy")
    rows = b if b != 2 else 3  # changes course at 2: two sizes cannot tell
    x = g.input("x", (rows, 8))
    y = g.apply("linear", x, g.param("w", (16, 8)), name="fc")
    g.apply("relu", y, name="act")
    return g.build()


def test_a_builder_that_changes_course_is_caught_by_the_check():
    build, calls = _counted(_toy)
    sizes = ModelSizes(build, _toy(8), 8)
    for b in (4, 2, 16, 32):
        assert sizes(b)[0] == _toy(b)
    assert calls == [4, 2, 16, 32]  # the check at 2 failed: every size built
    assert sizes.derived == 0


def test_no_builder_graph_is_none():
    sizes = ModelSizes(lambda b: None, _toy(8), 8)
    assert sizes(4) is None and sizes(8) is not None


def test_derived_prints_are_the_fingerprints_of_every_segment():
    """A derived graph's segment prints come from one fingerprint per class of segments equal at
    the probe's and the learned size: the same ids as fingerprinting every segment."""
    from shardplan.search.step import structure
    from shardplan.search.step.structure import segment_prints

    oracle = lambda b: zoo.build("gpt3", batch=b, layers=6, hidden=64, heads=2, vocab=128, seq=16)  # noqa: E731
    sizes = ModelSizes(oracle, oracle(48), 48)
    for b in (16, 24, 8, 4, 2):
        sizes(b)
    assert sizes.derived == 3 and sizes.learned is not None
    for b in (8, 4, 2):
        graph, segs, prints, split = sizes(b)
        assert prints == segment_prints(graph, segs, sizes.ids)
        assert split == structure.layer_split(prints)
        assert len(set(prints)) < len(prints)  # repeated layers: classes, not segments
        assert sizes._derived_prints(graph) == prints  # the derived path gave them
