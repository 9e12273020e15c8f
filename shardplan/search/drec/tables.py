"""What D-Rec's round pricer reads from the graph alone: built once per `drec` call, shared.

`SearchTables.of(graph, flex)` gathers, per op: its candidate cuts in tie order and each cut's
operand layouts in one round; its producers and readers (positions and tensors); its parameter
inputs; per input the previous reader of the same tensor (the evaluator's gradient-share credit)
and the later readers whose credits follow it; the ops its flex costs read; and the heavy
readers of one activation that decide together; per heavy op the transparent ops that follow
its layout (`followers.py`). None of it changes with the rounds, the prices or the variant of
the search, so the variants of one call share one copy.
Cost: O(|V| + |E| + flex edges), once per `drec` call (the followers' walk visits each op once,
times the producers tied for it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from shardplan.cost.classes import previous_consumers
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role
from shardplan.search.drec.flex import FlexGraph
from shardplan.search.drec.followers import follower_table
from shardplan.sharding import PARTIAL, REPLICATED, cut_problem, layout_of_cut

Cut = str | None
"""A loop dim cut in one round, or None (no cut)."""


def layout(op: Op, cut: Cut, pos: int, is_output: bool) -> int:
    """The tensor dim `cut` splits operand `pos` of `op` along (REPLICATED: none; partial sums
    count as replicated once resolved)."""
    dims = (op.signature.outputs if is_output else op.signature.inputs)[pos]
    value = layout_of_cut(dims, cut, is_output, op)
    return REPLICATED if value == PARTIAL else value


def candidate_order(op: Op) -> list[Cut]:
    """Tie order: dims of the result in its order (batch, rows, columns), then the other
    splittable dims (reductions), then "no cut"."""
    names: list[Cut] = []
    for dims in op.signature.outputs:
        for group in dims:
            for name in group:
                if name not in names and op.signature.loop_dim(name).splittable:
                    names.append(name)
    names += [d.name for d in op.signature.loop_dims if d.splittable and d.name not in names]
    return names + [None]


@dataclass(frozen=True, slots=True)
class SearchTables:
    """Per-op tables of one graph and its flex graph (module docstring), indexed by op."""

    candidates: list[list[Cut]]
    layouts: list[dict[Cut, tuple[tuple[int, ...], tuple[int, ...]]]]
    """Per op, per cut: (input layouts, output layouts) in one round."""
    out_pos: dict[str, int]
    """Tensor -> its position among its producer's outputs."""
    in_adj: list[list[tuple[int, str, int, int]]]
    """Per op: (input position, tensor, producer, producer's output position)."""
    out_adj: list[list[tuple[int, str, tuple[tuple[int, int], ...]]]]
    """Per op: (output position, tensor, its readers (op, position))."""
    param_positions: list[list[int]]
    prev_reader: list[list[tuple[int, int] | None]]
    """Per op input: the reader of the same tensor just before it (graph order), if any."""
    no_prev_reader: list[bool]
    next_readers: list[list[int]]
    """Per op: the ops whose previous reader of some input it is (their credits follow it)."""
    flex_nbrs: list[set[int]]
    """Per op: the ops its flex costs read (flex, sibling and shared-parameter edges)."""
    group_of: dict[int, list[int]]
    """Heavy readers of one activation with the same candidates: they decide together."""
    followers: list[list[tuple[int, float, dict[Cut, Cut]]]]
    """Per heavy op: (transparent op, share, heavy op's cut -> the cut that carries its split
    into it) of each transparent op whose nearest heavy producer it is (`followers.py`)."""
    in_edges: list[tuple[int, int, int, int, int]]
    """Every op's inputs in order, as (op, input position, the op whose layout it comes from,
    1 for that op's output or 0 for its input, that operand's position): from the producer,
    a parameter's first reader, or (a graph input) the op itself."""
    reads: list[frozenset[int]]
    """Per op i, the ops whose place in `decided` `RoundLedger._local_costs(i, ...)` reads: its
    producers and readers, the other readers of its parameters, the readers whose previous
    reader it is (and their previous readers: the credits they earn), its previous readers."""
    valid: dict[tuple[int, str, int, int], bool] = field(default_factory=dict)
    """(op, cut, local extent, q) -> whether the cut is valid (`sharding.cut_problem`): filled
    as the searches ask (`cut_ok`), the same for every round and variant."""

    def cut_ok(self, op: Op, i: int, cut: str, extent: int, q: int) -> bool:
        """Whether op i (`op`) can cut `cut` q ways from local extent `extent`
        (`sharding.cut_problem`), kept in `valid`."""
        ok = self.valid.get((i, cut, extent, q))
        if ok is None:
            ok = self.valid[i, cut, extent, q] = cut_problem(op, cut, extent, q) is None
        return ok

    @staticmethod
    def of(graph: Graph, flex: FlexGraph) -> SearchTables:
        ops = graph.ops
        candidates = [candidate_order(op) for op in ops]
        layouts = [
            {
                cut: (
                    tuple(layout(op, cut, p, False) for p in range(len(op.inputs))),
                    tuple(layout(op, cut, p, True) for p in range(len(op.outputs))),
                )
                for cut in cuts
            }
            for op, cuts in zip(ops, candidates, strict=True)
        ]
        out_pos = {t: op.outputs.index(t) for op in ops for t in op.outputs}
        in_adj = [
            [(p, t, graph.producer[t], out_pos[t]) for p, t in enumerate(op.inputs) if t in out_pos]
            for op in ops
        ]
        out_adj = [
            [(p, t, graph.consumers.get(t, ())) for p, t in enumerate(op.outputs)] for op in ops
        ]
        params = [
            [p for p, t in enumerate(op.inputs) if graph.tensors[t].role is Role.PARAMETER]
            for op in ops
        ]
        prev = previous_consumers(graph)
        following: list[list[int]] = [[] for _ in ops]
        for j, prevs in enumerate(prev):
            for p in prevs:
                if p is not None and j not in following[p[0]]:
                    following[p[0]].append(j)
        return SearchTables(
            candidates,
            layouts,
            out_pos,
            in_adj,
            out_adj,  # type: ignore[arg-type]
            params,
            prev,
            [all(p is None for p in prevs) for prevs in prev],
            following,
            _flex_neighbours(graph, flex, params),
            _groups(graph, flex, candidates),
            follower_table(graph, flex.heavy, candidates, layouts),
            _input_edges(graph, out_pos),
            _local_reads(graph, in_adj, out_adj, params, prev, following),
        )


def _local_reads(
    graph: Graph,
    in_adj: list[list[tuple[int, str, int, int]]],
    out_adj: list[list[tuple[int, str, tuple[tuple[int, int], ...]]]],
    params: list[list[int]],
    prev: list[list[tuple[int, int] | None]],
    following: list[list[int]],
) -> list[frozenset[int]]:
    """`SearchTables.reads`."""
    out = []
    for i, op in enumerate(graph.ops):
        found = {p for _, _, p, _ in in_adj[i]}
        found.update(w for _, _, users in out_adj[i] for w, _ in users)
        found.update(w for pos in params[i] for w, _ in graph.consumers[op.inputs[pos]])
        for j in (i, *following[i]):
            found.add(j)
            found.update(p[0] for p in prev[j] if p is not None)
        found.discard(i)
        out.append(frozenset(found))
    return out


def _input_edges(graph: Graph, out_pos: dict[str, int]) -> list[tuple[int, int, int, int, int]]:
    """`SearchTables.in_edges`."""
    out = []
    for i, op in enumerate(graph.ops):
        for pos, name in enumerate(op.inputs):
            p = graph.producer.get(name)
            if p is not None:
                out.append((i, pos, p, 1, out_pos[name]))
            elif graph.tensors[name].role is Role.PARAMETER:
                first, first_pos = graph.consumers[name][0]
                out.append((i, pos, first, 0, first_pos))
            else:
                out.append((i, pos, i, 0, pos))
    return out


def _flex_neighbours(graph: Graph, flex: FlexGraph, params: list[list[int]]) -> list[set[int]]:
    nbrs: list[set[int]] = [set() for _ in graph.ops]
    for e in flex.edges:
        nbrs[e.consumer].add(e.producer)
        nbrs[e.producer].add(e.consumer)
    for sib in flex.siblings:
        nbrs[sib.a].add(sib.b)
        nbrs[sib.b].add(sib.a)
    for i, op in enumerate(graph.ops):
        for pos in params[i]:
            nbrs[i] |= {w for w, _ in graph.consumers[op.inputs[pos]]}
        nbrs[i].discard(i)
    return nbrs


def _groups(graph: Graph, flex: FlexGraph, candidates: list[list[Cut]]) -> dict[int, list[int]]:
    readers: dict[str, list[int]] = {}
    for i in sorted(flex.heavy):
        for name in dict.fromkeys(graph.ops[i].inputs):
            if graph.tensors[name].role is Role.ACTIVATION:
                readers.setdefault(name, []).append(i)
    group_of: dict[int, list[int]] = {}
    for group in (g for g in readers.values() if len(g) > 1):
        if all(candidates[j] == candidates[group[0]] for j in group):
            for j in group:
                group_of.setdefault(j, group)
    return group_of
