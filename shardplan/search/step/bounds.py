"""Lower bounds of a layout's step that see memory: recomputation the budget forces.

The layout bound of `search` (every op's piece at the roofline, forward and backward, times the
(m + (S - 1) / v) slots) ignores memory. But a plan must fit: on a device holding chunks C with
in-flight count k (`cost.pipeline.interleaved_in_flight`), the step model keeps
  weights(C) + k x kept_r(C)            (r the recomputation lever, `cost.step.stage_cost`)
and no layout of the tensors beats an even split over the n devices of the stage, so
  weights(C) >= sum of C's parameters' bytes / n,
  kept_none(C) >= sum of the tensors C's ops keep for their backward (`ir.traits`: saved inputs
    produced inside C, saved results, one-byte masks) / n,
  kept_selective(C) >= the same without the tensors selective recomputation drops (per segment,
    results larger than its widest parameter op's result, `cost.step._activations`) / n.
When the floors of "none" and "selective" both exceed the budget every plan of the device
recomputes fully: its slot pays at least the forward floor of every op of C once more (a bound
that leaves selective recomputation's own, smaller, floor out). Floors are the layout bound's
per-op pieces (`ideal / (m n)`, at least the launch floor), so the refined bound stays a lower
bound of every assignment the search scores.
O(ops) per (micro-batch size, chunking), from the graph at the micro-batch size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardplan.cost import CostOptions
from shardplan.cost.pipeline import interleaved_in_flight
from shardplan.cost.step import selective_drops
from shardplan.ir.graph import Graph
from shardplan.ir.op import Role
from shardplan.ir.segments import Segment
from shardplan.ir.traits import Saved, saved_for_backward


@dataclass(frozen=True, slots=True)
class ChunkFloors:
    """Global bytes of one chunk (before dividing by the stage's devices)."""

    weights: float
    kept_none: float
    kept_selective: float


def chunk_floors(
    graph: Graph, segs: Sequence[Segment], starts: Sequence[int], opts: CostOptions
) -> list[ChunkFloors]:
    """Per chunk (segments starts[c] .. starts[c + 1] - 1): its `ChunkFloors`."""
    chunk_of_op = np.zeros(len(graph.ops), dtype=int)
    ends = [*starts[1:], len(segs)]
    for c, (a, e) in enumerate(zip(starts, ends, strict=True)):
        chunk_of_op[segs[a].start : segs[e - 1].stop] = c
    saved: list[dict[str, float]] = [{} for _ in starts]  # as `cost.step.saved_bytes` keys them
    weights = [0.0] * len(starts)
    seen_params: set[str] = set()
    dropped = _dropped(graph, segs)
    for index, op in enumerate(graph.ops):
        c = int(chunk_of_op[index])
        rule = saved_for_backward(op.kind)
        for name in op.inputs:
            t = graph.tensors[name]
            if t.role is Role.PARAMETER:
                if name not in seen_params:  # a shared parameter's bytes once
                    seen_params.add(name)
                    weights[c] += t.numel * opts.element_bytes(t)
            elif rule is Saved.INPUTS and name in graph.producer:
                home = int(chunk_of_op[graph.producer[name]])
                if home == c:  # made outside the chunk: a stage input, not counted (a floor)
                    saved[c].setdefault(name, t.numel * opts.element_bytes(t))
        for name in op.outputs if rule is not Saved.INPUTS else ():
            t = graph.tensors[name]
            if rule is Saved.OUTPUTS:
                saved[c].setdefault(name, t.numel * opts.element_bytes(t))
            elif rule is Saved.MASK:
                saved[c].setdefault(f"{name}:mask", float(t.numel))
    out = []
    for c, kept in enumerate(saved):
        gone = sum(kept.get(n, 0.0) + kept.get(f"{n}:mask", 0.0) for n in dropped)
        total = sum(kept.values())
        out.append(ChunkFloors(weights[c], total, total - gone))
    return out


def _dropped(graph: Graph, segs: Sequence[Segment]) -> set[str]:
    """Results selective recomputation drops, segment by segment (`cost.step.selective_drops`)."""
    return {n for seg in segs for _, n in selective_drops(graph, graph.ops[seg.start : seg.stop])}


def forced_floor(
    floors: Sequence[ChunkFloors],
    forward: np.ndarray,
    op_chunks: Sequence[tuple[int, int]],
    stages: int,
    virtual: int,
    micro_batches: int,
    devices: int,
    budget: float | None,
) -> list[float]:
    """Per device d (chunks d, d + S, ...): the seconds of recomputation the budget forces on
    each micro-batch at least (module docstring). `forward`: each op's forward floor per piece;
    `op_chunks`: each chunk's op range."""
    out = []
    for d in range(stages):
        mine = range(d, len(floors), stages)
        if budget is None:
            out.append(0.0)
            continue
        k = interleaved_in_flight(d, stages, micro_batches, virtual)
        weights = sum(floors[c].weights for c in mine) / devices
        none = weights + k * sum(floors[c].kept_none for c in mine) / devices
        selective = weights + k * sum(floors[c].kept_selective for c in mine) / devices
        if none <= budget or selective <= budget:  # selective's own floor is left out: small
            out.append(0.0)
        else:
            out.append(sum(float(forward[a:e].sum()) for a, e in (op_chunks[c] for c in mine)))
    return out


__all__ = ["ChunkFloors", "chunk_floors", "forced_floor"]
