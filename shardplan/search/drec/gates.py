"""What lets one D-Rec call skip work without changing its plan.

`unused_floor`: a lower bound on the score of any plan that leaves the first rounds of the mesh
unused (the search's unused-axis variants, down to all-replicated): each op's forward compute
with its FLOPs over the devices left, no bytes moved — every other term of the evaluator's score
is >= 0. A variant whose floor reaches the best score found cannot win and is not searched. O(|V|).
`without_gc_pauses`: Python's cyclic collector paused while a search runs, restored after.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace

from shardplan.cost.presets import CostOptions
from shardplan.cost.terms import compute_cost
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh


def unused_floor(
    graph: Graph, mesh: Mesh, opts: CostOptions, unused: int, weights: Sequence[float] | None
) -> float:
    """A lower bound on the score of any plan leaving rounds 0..unused-1 unused: each op's
    forward compute with its FLOPs split over the remaining rounds' devices at most and no bytes
    moved (`compute_cost` is a roofline, non-decreasing in FLOPs and bytes; training adds the
    backward, collectives and memory add >= 0), weighted as the fold scores it; shaved by 1e-9
    so summation order cannot make it exceed the score. O(|V|)."""
    ways = math.prod(rnd.q for rnd in mesh.rounds[unused:])
    forward = replace(opts, train=False)
    floor = 0.0
    for i, op in enumerate(graph.ops):
        w = weights[i] if weights is not None else 1.0
        floor += w * compute_cost(op.flops / ways, 0.0, forward, mesh)
    return floor * (1 - 1e-9)


@contextmanager
def without_gc_pauses() -> Iterator[None]:
    """Python's cyclic garbage collector paused while a search runs, then restored as it was.
    The search makes ~10^6 short-lived objects, none in a reference cycle it needs freed
    early; each collection they trigger walks the long-lived ones too (the graph: a
    full pass costs ~0.03 s on GPT-3 175B's 2,886 ops), which is pure overhead here."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
