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
O(operands) once per micro-batch size (`floor_items`), then O(ops) numpy per chunking.
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


@dataclass(frozen=True, slots=True)
class FloorItems:
    """A graph's byte items, read once and summed per chunking (`chunk_floors`): each
    parameter at its first reader; each kept tensor (as `cost.kept.saved_bytes` keys it) at its
    producer, counted when the producer keeps it or a reader keeping its inputs sits in the same
    chunk (one made in another chunk is a stage input, left out: a floor)."""

    param_op: np.ndarray
    param_bytes: np.ndarray
    kept_op: np.ndarray
    kept_bytes: np.ndarray
    kept_always: np.ndarray
    kept_dropped: np.ndarray
    """Whether selective recomputation drops the item (`cost.step.selective_drops`)."""
    reader_item: np.ndarray
    reader_op: np.ndarray
    """(item, op) pairs: an op keeping its inputs reads the item."""


def floor_items(graph: Graph, segs: Sequence[Segment], opts: CostOptions) -> FloorItems:
    """`graph`'s `FloorItems`, O(operands)."""
    param_first: dict[str, tuple[int, float]] = {}
    items: dict[str, list] = {}  # key -> [producer, bytes, always, dropped]
    readers: list[tuple[str, int]] = []
    dropped = _dropped(graph, segs)
    for index, op in enumerate(graph.ops):
        rule = saved_for_backward(op.kind)
        for name in op.inputs:
            t = graph.tensors[name]
            if t.role is Role.PARAMETER:
                param_first.setdefault(name, (index, t.numel * opts.element_bytes(t)))
            elif rule is Saved.INPUTS and name in graph.producer:
                producer = graph.producer[name]
                items.setdefault(
                    name, [producer, t.numel * opts.element_bytes(t), False, name in dropped]
                )
                readers.append((name, index))
        for name in op.outputs if rule is not Saved.INPUTS else ():
            t = graph.tensors[name]
            if rule is Saved.OUTPUTS:
                item = items.setdefault(
                    name, [index, t.numel * opts.element_bytes(t), False, name in dropped]
                )
                item[2] = True
            elif rule is Saved.MASK:
                items[f"{name}:mask"] = [index, float(t.numel), True, name in dropped]
    keys = {k: i for i, k in enumerate(items)}
    rows = list(items.values())
    pairs = [(keys[name], index) for name, index in readers]
    return FloorItems(
        np.array([i for i, _ in param_first.values()], dtype=int),
        np.array([b for _, b in param_first.values()], dtype=float),
        np.array([r[0] for r in rows], dtype=int),
        np.array([r[1] for r in rows], dtype=float),
        np.array([r[2] for r in rows], dtype=bool),
        np.array([r[3] for r in rows], dtype=bool),
        np.array([i for i, _ in pairs], dtype=int),
        np.array([o for _, o in pairs], dtype=int),
    )


def chunk_floors(
    graph: Graph,
    segs: Sequence[Segment],
    starts: Sequence[int],
    opts: CostOptions,
    items: FloorItems | None = None,
) -> list[ChunkFloors]:
    """Per chunk (segments starts[c] .. starts[c + 1] - 1): its `ChunkFloors`. `items`: the
    graph's `floor_items` when already read (one per graph, any number of chunkings)."""
    items = items or floor_items(graph, segs, opts)
    chunks = len(starts)
    chunk_of_op = np.zeros(len(graph.ops), dtype=int)
    ends = [*starts[1:], len(segs)]
    for c, (a, e) in enumerate(zip(starts, ends, strict=True)):
        chunk_of_op[segs[a].start : segs[e - 1].stop] = c
    weights = np.bincount(chunk_of_op[items.param_op], items.param_bytes, chunks)
    home = chunk_of_op[items.kept_op]
    counted = items.kept_always.copy()
    near = chunk_of_op[items.reader_op] == home[items.reader_item]
    counted[items.reader_item[near]] = True
    total = np.bincount(home[counted], items.kept_bytes[counted], chunks)
    gone_mask = counted & items.kept_dropped
    gone = np.bincount(home[gone_mask], items.kept_bytes[gone_mask], chunks)
    return [
        ChunkFloors(float(weights[c]), float(total[c]), float(total[c] - gone[c]))
        for c in range(chunks)
    ]


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


__all__ = ["ChunkFloors", "FloorItems", "chunk_floors", "floor_items", "forced_floor"]
