"""A model's repeated structure, read off its graph (never its names).

`fingerprint` is a graph's structure up to names (op kinds, signatures, FLOPs, attributes and
how operands connect); equal fingerprints get equal plans. `layer_split` finds the longest run of
repeating segment fingerprints with the shortest period, O(K^2) over K segments (`ir.segments`).
`reduced_chunk` cuts the repeated run of a contiguous chunk of segments down to j periods, keeping
what comes before and after it, and reconnects the part after to the last period kept (its
inputs come from the same positions one period earlier): a chunk of k > 4 periods costs what
its j = 2 reduction costs plus (k - 2) times the difference of its j = 3 and j = 2 reductions,
exactly, for every term that is a sum over ops (`search.step.increments.extrapolate`).
O(ops of the chunk).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from shardplan.ir.graph import Graph
from shardplan.ir.op import Role
from shardplan.ir.segments import Segment, graph_of_ops, segments, subgraph


def fingerprint(graph: Graph) -> tuple[object, ...]:
    """Structure of a graph up to names: equal fingerprints get equal D-Rec strategies."""
    return range_fingerprint(graph, 0, len(graph.ops))


def range_fingerprint(graph: Graph, start: int, stop: int) -> tuple[object, ...]:
    """`fingerprint(subgraph(graph, start, stop))` without building the sub-graph: an
    activation made before `start` is read as the sub-graph's received input."""
    seen: dict[str, int] = {}
    out: list[object] = []
    for i in range(start, stop):
        op = graph.ops[i]
        refs: list[object] = []
        for name in op.inputs:
            t = graph.tensors[name]
            p = graph.producer.get(name)
            if p is not None and start <= p < i:
                refs.append(("op", i - p, graph.ops[p].outputs.index(name)))
            else:
                first = seen.setdefault(name, i - start)
                if t.role is Role.ACTIVATION:  # made outside the range (`segments.subgraph`)
                    refs.append(("t", t.shape, Role.INPUT.value, t.dtype_bytes, True, first))
                else:
                    refs.append(("t", t.shape, t.role.value, t.dtype_bytes, t.received, first))
        out.append((op.kind, op.signature.text(), op.flops, op.attrs, tuple(refs)))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class LayerSplit:
    """Segments [0, first) are the prologue (embeddings), then `layers` layers of `period`
    segments each, then the epilogue (final norm, head, loss)."""

    first: int
    period: int
    layers: int
    segments: int

    def layer_start(self, i: int) -> int:
        """Segment index where layer i starts (layer `layers` is the epilogue's start)."""
        return self.first + i * self.period

    @property
    def stop(self) -> int:
        """The first segment after the repeated run."""
        return self.first + self.period * self.layers


def layer_split(fingerprints: Sequence[object]) -> LayerSplit:
    """The longest run of repeats with the shortest period (O(K^2) over K segments); a model
    without repeats is one layer spanning every segment."""
    k = len(fingerprints)
    best, covered = LayerSplit(0, k, 1, k), 0
    for p in range(1, k // 2 + 1):
        i = 0
        while i + p < k:
            j = i
            while j + p < k and fingerprints[j] == fingerprints[j + p]:
                j += 1
            count = (j - i) // p + 1
            if count >= 2 and count * p > covered:
                best, covered = LayerSplit(i, p, count, k), count * p
            i = max(j, i + 1)
    return best


def segment_prints(
    graph: Graph, segs: Sequence[Segment], ids: dict[tuple[object, ...], int] | None = None
) -> list[int]:
    """Each segment's fingerprint as a small int (equal structure, equal int; `ids` shares the
    numbering between graphs), O(ops)."""
    ids = {} if ids is None else ids
    return [ids.setdefault(range_fingerprint(graph, s.start, s.stop), len(ids)) for s in segs]


def graph_layers(graph: Graph) -> LayerSplit:
    return layer_split(segment_prints(graph, segments(graph)))


@dataclass(frozen=True, slots=True)
class ChunkShape:
    """A chunk [a, e) of segments seen through the repeated run: `head` segments before it,
    `periods` whole periods and `rest` more segments of it, then the segments after it."""

    a: int
    e: int
    run_start: int
    periods: int
    rest: int
    period: int

    @property
    def run_stop(self) -> int:
        return self.run_start + self.periods * self.period + self.rest


def chunk_shape(split: LayerSplit, a: int, e: int) -> ChunkShape:
    """How chunk [a, e) overlaps the repeated run of `split`."""
    x, y = max(a, split.first), min(e, split.stop)
    if y <= x:
        return ChunkShape(a, e, a, 0, 0, split.period)
    length = y - x
    return ChunkShape(a, e, x, length // split.period, length % split.period, split.period)


def reduced_chunk(
    graph: Graph, segs: Sequence[Segment], shape: ChunkShape, periods: int, name: str
) -> Graph | None:
    """The chunk with `periods` (< shape.periods) whole periods of its repeated run (module
    docstring); None when the part after the run reads something the cut cannot reconnect."""
    keep_stop = shape.run_start + periods * shape.period + shape.rest
    after = shape.run_stop
    start, cut = segs[shape.a].start, segs[keep_stop - 1].stop if keep_stop > shape.a else None
    if cut is None:
        return None
    if after >= shape.e:  # nothing after the run: a contiguous prefix
        return subgraph(graph, start, cut, name)
    resume, stop = segs[after].start, segs[shape.e - 1].stop
    dropped = resume - cut  # ops of the removed periods
    remap: dict[str, str] = {}
    for op in graph.ops[resume:stop]:
        for t in op.inputs:
            p = graph.producer.get(t)
            if p is None or p < cut or p >= resume or t in remap:
                continue
            q = p - dropped
            if q < start:
                return None
            twin = graph.ops[q].outputs[graph.ops[p].outputs.index(t)]
            if graph.tensors[twin].shape != graph.tensors[t].shape:
                return None
            remap[t] = twin
    ops = list(graph.ops[start:cut])
    for op in graph.ops[resume:stop]:
        inputs = tuple(remap.get(t, t) for t in op.inputs)
        ops.append(op if inputs == op.inputs else replace(op, inputs=inputs))
    return graph_of_ops(graph, ops, name)
