"""The flex-edge graph: heavy operators see each other through chains of layout-transparent ones.

An op is layout-transparent when every loop dim is PARALLEL or FROZEN (no REDUCE, no WINDOW):
elementwise ops, casts, bias-add, activations, dropout, transpose, reshape, softmax, norms over
a frozen axis, concat. A flex edge joins a heavy producer u to a heavy consumer v when v reads,
through such a chain, what u wrote; it carries the tensor-dim mapping composed along the chain
(v's tensor dim -> u's tensor dim; a dim that does not survive the chain maps to nothing).
A sibling edge joins two heavy ops whose outputs reach one transparent op through such chains
(an add of two embeddings, a residual add): their splits must meet on its output's dims.

Each walk visits at most `budget` transparent ops (breadth first, nearest first), so building the
flex graph is O((|V| + |E|) * budget) = linear in the graph.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from shardplan.ir.dims import DimKind
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role
from shardplan.ir.signature import major_positions
from shardplan.sharding import REPLICATED


def is_transparent(op: Op) -> bool:
    return all(d.kind in (DimKind.PARALLEL, DimKind.FROZEN) for d in op.signature.loop_dims)


def dim_map(op: Op, input_pos: int, output_pos: int = 0) -> dict[int, int]:
    """Input tensor dim -> output tensor dim of a transparent op, through a shared major loop dim
    that may be cut (a split on a FROZEN dim, e.g. a norm's hidden axis, does not pass)."""
    out_major = major_positions(op.signature.outputs[output_pos])
    return {
        pos: out_major[group[0]]
        for pos, group in enumerate(op.signature.inputs[input_pos])
        if group and group[0] in out_major and op.signature.loop_dim(group[0]).splittable
    }


@dataclass(frozen=True, slots=True)
class FlexEdge:
    """Heavy `producer` output `out_pos` reaches heavy `consumer` input `in_pos`.

    `to_consumer` maps the producer's output tensor dims to the consumer's input tensor dims;
    `via` is the transparent op that reads the producer's output on the way (-1: the consumer
    reads it directly). Edges leaving through one such op share its layout changes.
    """

    producer: int
    out_pos: int
    consumer: int
    in_pos: int
    to_consumer: tuple[tuple[int, int], ...]
    via: int = -1
    forward: dict[int, int] = field(default_factory=dict, compare=False, hash=False, repr=False)
    """`to_consumer` as a dict (producer dim -> consumer dim), for look-ups in the search."""
    backward: dict[int, int] = field(default_factory=dict, compare=False, hash=False, repr=False)
    """Its inverse (consumer dim -> producer dim)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "forward", dict(self.to_consumer))
        object.__setattr__(self, "backward", {c: p for p, c in self.to_consumer})


ELSEWHERE = 1 << 20
"""Layout value of a split on a tensor dim that does not survive a flex chain."""


def through_chain(edge: FlexEdge, src: int, dst: int, into_consumer: bool) -> tuple[int, int]:
    """The (src, dst) layouts an edge's redistribution is priced on once the chain of transparent
    ops between producer and consumer is taken into account: `into_consumer` when src is the
    producer's output layout, seen by the consumer; otherwise dst (the consumer's input layout)
    is seen by the producer. A split the chain cannot carry gathers on the way."""
    if into_consumer:
        if src >= 0:
            src = edge.forward.get(src, ELSEWHERE)
            if src == ELSEWHERE:
                dst = REPLICATED
        return src, dst
    if dst >= 0:
        dst = edge.backward.get(dst, REPLICATED)
    if src >= 0 and src not in edge.forward:
        dst = REPLICATED
    return src, dst


def heavy_sources(
    graph: Graph, heavy: frozenset[int], tensor: str, mapping: dict[int, int], budget: int = 16
) -> list[tuple[int, int, dict[int, int], int]]:
    """The heavy ops whose output reaches `tensor` through transparent ops: (op, output
    position, its output dim -> the dim `mapping` sends `tensor`'s dim to, the transparent op
    that reads that output on the way or -1). Breadth first, at most `budget` transparent ops
    visited."""
    found: list[tuple[int, int, dict[int, int], int]] = []
    queue = deque([(tensor, mapping, -1)])
    seen = {tensor}
    visited = 0
    while queue:
        name, current, reader = queue.popleft()
        u = graph.producer.get(name)
        if u is None:
            continue
        producer = graph.ops[u]
        out_pos = producer.outputs.index(name)
        if u in heavy:
            found.append((u, out_pos, current, reader))
            continue
        visited += 1
        if visited > budget:
            break
        for j, source in enumerate(producer.inputs):
            if source in seen or graph.tensors[source].role is not Role.ACTIVATION:
                continue
            seen.add(source)
            through = dim_map(producer, j, out_pos)
            composed = {src: current[mid] for src, mid in through.items() if mid in current}
            queue.append((source, composed, u))
    return found


def build_flex_edges(graph: Graph, heavy: frozenset[int], budget: int = 16) -> list[FlexEdge]:
    """Every flex edge of the graph, found by walking backwards from each heavy op's inputs."""
    edges: list[FlexEdge] = []
    for v in sorted(heavy):
        op = graph.ops[v]
        for in_pos, tensor in enumerate(op.inputs):
            identity = {d: d for d in range(len(graph.tensors[tensor].shape))}
            for u, out_pos, mapping, via in heavy_sources(graph, heavy, tensor, identity, budget):
                edges.append(FlexEdge(u, out_pos, v, in_pos, tuple(sorted(mapping.items())), via))
    return edges


@dataclass(frozen=True, slots=True)
class SiblingEdge:
    """Heavy ops `a` and `b` whose outputs meet at one transparent op (two embeddings summed,
    the two sides of a residual add): they agree when `a_to_b` maps a's split onto b's.
    `a_via`, `b_via`: the transparent op that reads each one's output on the way (`FlexEdge`)."""

    a: int
    a_pos: int
    b: int
    b_pos: int
    a_to_b: tuple[tuple[int, int], ...]
    a_via: int = -1
    b_via: int = -1


def build_sibling_edges(graph: Graph, heavy: frozenset[int], budget: int = 16) -> list[SiblingEdge]:
    """Sibling edges of every transparent op with two or more activation inputs: O(|V| * budget)."""
    return [
        SiblingEdge(*found)
        for t in range(len(graph.ops))
        if t not in heavy
        for found in sibling_sources(graph, heavy, t, budget)
    ]


def sibling_sources(
    graph: Graph, heavy: frozenset[int], t: int, budget: int = 16
) -> list[tuple[int, int, int, int, tuple[tuple[int, int], ...], int, int]]:
    """(a, a_pos, b, b_pos, a_to_b, a_via, b_via) of each pair of heavy ops whose outputs meet at
    transparent op t through different activation inputs of it (none when it has fewer than
    two); the vias as `heavy_sources` gives them (t itself when it reads the output)."""
    op = graph.ops[t]
    inputs = [
        (k, name) for k, name in enumerate(op.inputs) if graph.tensors[name].role is Role.ACTIVATION
    ]
    if len(inputs) < 2:
        return []
    sources = []
    for k, name in inputs:
        to_out = dim_map(op, k, 0)
        for u, pos, mapping, via in heavy_sources(graph, heavy, name, to_out, budget):
            sources.append((k, u, pos, mapping, via if via >= 0 else t))
    found = []
    for x, (ka, a, a_pos, a_map, a_via) in enumerate(sources):
        for kb, b, b_pos, b_map, b_via in sources[x + 1 :]:
            if ka == kb or a == b:
                continue
            at_out = {out: dim for dim, out in b_map.items()}
            pairs = tuple(sorted((d, at_out[o]) for d, o in a_map.items() if o in at_out))
            found.append((a, a_pos, b, b_pos, pairs, a_via, b_via))
    return found


@dataclass(frozen=True, slots=True)
class FlexGraph:
    """A graph's heavy ops with their flex and sibling edges (built once per search call)."""

    heavy: frozenset[int]
    edges: tuple[FlexEdge, ...]
    siblings: tuple[SiblingEdge, ...]


def build_flex_graph(graph: Graph) -> FlexGraph:
    heavy = heavy_ops(graph)
    edges = tuple(build_flex_edges(graph, heavy))
    return FlexGraph(heavy, edges, tuple(build_sibling_edges(graph, heavy)))


def heavy_ops(graph: Graph) -> frozenset[int]:
    """Ops that decide first in each round; all ops when the graph has no heavy one."""
    heavy = frozenset(i for i, op in enumerate(graph.ops) if not is_transparent(op))
    return heavy or frozenset(range(len(graph.ops)))
