"""A heavy op's followers: the transparent ops that take its layout, and what its cuts leave them.

D-Rec's greedy pass decides the heavy ops; the transparent (layout-transparent) ops then take
their cuts from their neighbours, a forward pass first, so mostly from their nearest heavy
producer. A cut whose split reaches them splits their compute too; one that does not (no cut,
a contraction cut whose output is all-reduced whole, a split a norm cannot carry) leaves them
whole. `follower_table` finds, once per call, each heavy op's followers: a multi-source
breadth-first walk forward from every heavy op's outputs through transparent ops, each op given
to the heavy producers nearest it (fewest transparent ops between; ties share it equally) with
the cut that carries each producer cut's split into it. O(|V| + |E|) times the ties.
`follower_excess` prices a heavy op's cuts by what they leave its followers paying above their
cheapest cuts: O(followers * cuts).
"""

from __future__ import annotations

from collections.abc import Callable

from shardplan.ir.graph import Graph
from shardplan.search.drec.flex import dim_map
from shardplan.sharding import REPLICATED

Cut = str | None
"""A loop dim cut in one round, or None (no cut)."""

Follower = tuple[int, float, dict[Cut, Cut]]
"""(transparent op, its share, the heavy op's cut -> the cut that carries its split into it)."""


def follower_excess(
    followers: list[Follower], cuts: list[Cut], own: Callable[[int], dict[Cut, float]]
) -> dict[Cut, float]:
    """Per cut of a heavy op: what it leaves its followers paying (`own(t)`: follower t's own
    cost per valid cut this round) above their cheapest cuts, each at its share; a carried cut
    not valid for the follower leaves it whole."""
    extra = dict.fromkeys(cuts, 0.0)
    for t, share, carry in followers:
        costs = own(t)
        floor = min(costs.values())
        for cut in cuts:
            c = costs.get(carry.get(cut))
            extra[cut] += share * ((costs[None] if c is None else c) - floor)
    return extra


def follower_table(
    graph: Graph,
    heavy: frozenset[int],
    candidates: list[list[Cut]],
    layouts: list[dict[Cut, tuple[tuple[int, ...], tuple[int, ...]]]],
) -> list[list[Follower]]:
    """Per op, its followers (none for a transparent op; see the module doc)."""
    ops = graph.ops
    frontier: list[tuple[int, int, int, dict[Cut, int]]] = []
    for u in sorted(heavy):
        for p, name in enumerate(ops[u].outputs):
            dims = {c: layouts[u][c][1][p] for c in candidates[u]}
            readers = graph.consumers.get(name, ())
            frontier += [(u, t, pos, dims) for t, pos in readers if t not in heavy]
    owner: dict[int, list[tuple[int, dict[Cut, Cut]]]] = {}
    while frontier:
        level: dict[int, dict[int, tuple[int, dict[Cut, int]]]] = {}
        for u, t, pos, dims in frontier:
            if t not in owner:
                level.setdefault(t, {}).setdefault(u, (pos, dims))
        frontier = []
        for t, by_source in level.items():
            owner[t] = []
            op = ops[t]
            for u, (pos, dims) in by_source.items():
                by_dim: dict[int, Cut] = {}
                for ct in candidates[t]:
                    if ct is not None:
                        by_dim.setdefault(layouts[t][ct][0][pos], ct)
                carry = {c: by_dim.get(d) if d >= 0 else None for c, d in dims.items()}
                owner[t].append((u, carry))
                for q, name in enumerate(op.outputs):
                    through = dim_map(op, pos, q)
                    after = {
                        c: through.get(d, REPLICATED) if d >= 0 else d for c, d in dims.items()
                    }
                    frontier += [
                        (u, w, w_pos, after)
                        for w, w_pos in graph.consumers.get(name, ())
                        if w not in heavy and w not in owner
                    ]
    out: list[list[Follower]] = [[] for _ in ops]
    for t in sorted(owner):
        for u, carry in owner[t]:
            out[u].append((t, 1.0 / len(owner[t]), carry))
    return out
