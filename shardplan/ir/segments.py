"""Segments: the graph's op order cut where a single activation crosses (a layer boundary).

A position i of the topological order (between ops i-1 and i) is a cut point when exactly one
activation produced before i is still read at or after i — the residual stream between two
transformer half-layers, the feature map between two CNN blocks. Graph inputs, constants and
parameters do not count: every stage can read them; a stage's incoming activations do (live
from its first op), so a stage's segments are the model's. Segments are the units that pipeline
stages are made of (contiguous runs of segments) and the checkpoints of full activation
recomputation (only a segment's input is kept; the segment is re-run in backward). One sweep
with a difference array: O(|V| + |E|).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role


@dataclass(frozen=True, slots=True)
class Segment:
    """Ops `start` .. `stop - 1` of the graph; `entry` is the one activation that crosses into
    the segment at `start` (None for the first segment, which reads graph inputs only)."""

    start: int
    stop: int
    entry: str | None


def segments(graph: Graph) -> tuple[Segment, ...]:
    """The graph's segments in order (a single segment when no cut point exists)."""
    n = len(graph.ops)
    delta = [0] * (n + 2)
    crossing: dict[int, str] = {}
    for name, t in graph.tensors.items():
        # a stage's incoming activation (an input that needs a gradient, `subgraph`) is live
        # from the start like the activation it was, so a stage cuts where the model does
        if t.role is Role.INPUT and name in graph.requires_grad and name not in graph.producer:
            users = graph.consumers.get(name, ())
            if users:
                delta[1] += 1
                delta[max(i for i, _ in users) + 1] -= 1
    for name, p in graph.producer.items():
        if graph.tensors[name].role is not Role.ACTIVATION:
            continue
        users = graph.consumers.get(name, ())
        if not users:
            continue
        last = max(i for i, _ in users)
        if last > p:
            delta[p + 1] += 1  # live at positions p+1 .. last
            delta[last + 1] -= 1
            crossing[p + 1] = name
    out: list[Segment] = []
    live, start, entry = 0, 0, None
    for i in range(1, n):
        live += delta[i]
        if live == 1 and i in crossing and _only_live(graph, crossing[i], i):
            out.append(Segment(start, i, entry))
            start, entry = i, crossing[i]
    out.append(Segment(start, n, entry))
    return tuple(out)


def _only_live(graph: Graph, name: str, i: int) -> bool:
    """`name` (produced by op i-1) is read at or after i: it is the one live activation."""
    return any(j >= i for j, _ in graph.consumers.get(name, ()))


def subgraph(graph: Graph, start: int, stop: int, name: str | None = None) -> Graph:
    """Ops `start` .. `stop - 1` as a graph of their own (a pipeline stage).

    Activations produced before `start` become inputs of the stage; they keep `requires_grad`
    (the stage sends their gradient back). Parameters read by several stages (a tied
    embedding) appear in each. O(ops + operands of the range).
    """
    return graph_of_ops(graph, graph.ops[start:stop], name or f"{graph.name}[{start}:{stop}]")


def graph_of_ops(graph: Graph, ops: Sequence[Op], name: str) -> Graph:
    """`ops` (in order, taken from `graph`) as a graph of their own: activations they read but
    do not produce become inputs that keep `requires_grad` (`subgraph`). O(operands)."""
    from dataclasses import replace

    from shardplan.ir.graph import make_graph

    produced = {t for op in ops for t in op.outputs}
    tensors = {}
    for op in ops:
        for t in (*op.inputs, *op.outputs):
            tensor = graph.tensors[t]
            if t not in produced and tensor.role is Role.ACTIVATION:
                tensor = replace(tensor, role=Role.INPUT, received=True)
            tensors[t] = tensor
    sub = make_graph(name, tensors, tuple(ops))
    return replace(sub, requires_grad=frozenset(t for t in tensors if t in graph.requires_grad))
