"""D-Rec also searches the mesh without the innermost axis's trailing rounds of its largest prime
(`search/drec/submesh.py`): on 18 = 2 x 3 x 3 a model sized in powers of two is best left
unsplit over the rounds of 3, which no round prices as a pair (qwen3-235b-a22b, 2 layers, mesh
18: 1.276 of the ILP optimum before, 1.005 after)."""

from __future__ import annotations

import pytest

import shardplan as sp
from shardplan.search.drec.submesh import trailing_submesh


@pytest.mark.parametrize(
    ("mesh", "smaller"),
    [("12", (4,)), ("18", (2,)), ("30", (6,)), ("2x12", (2, 4)), ("20", (4,)), ("6", (2,))],
)
def test_trailing_submesh_drops_the_largest_primes_rounds(mesh, smaller):
    full = sp.parse_mesh(mesh)
    sub = trailing_submesh(full)
    assert sub is not None and sub.shape == smaller
    assert sub.bandwidth_bytes_per_s == full.bandwidth_bytes_per_s
    assert [r.q for r in sub.rounds] == [r.q for r in full.rounds][: len(sub.rounds)]


@pytest.mark.parametrize("mesh", ["8", "2x8", "3", "2x3", "1024"])
def test_no_trailing_submesh_without_mixed_primes_on_the_inner_axis(mesh):
    assert trailing_submesh(sp.parse_mesh(mesh)) is None


def test_drec_leaves_the_rounds_of_3_unused_when_that_is_optimal():
    graph, mesh = sp.zoo.build("qwen3-235b-a22b", layers=2), sp.parse_mesh("18")
    exact = sp.plan(graph, mesh, method="ilp", time_limit=120)  # optimal in about 1 s
    assert sp.plan(graph, mesh).cost.total <= exact.cost.total * 1.01
