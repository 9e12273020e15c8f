"""Axis swaps: the search's final plan with the cuts of two rounds on different mesh axes
exchanged, where both rounds split their axis the same number of ways.

D-Rec decides the rounds in the mesh's order, outermost axis first, and the first round that
cuts the batch pays for its gradient sums on that axis's links. Two rounds of equal ways on two
axes lay every op out in the same shapes whichever of them takes which cut, but over other
links: ViT-B/16 (1 layer, batch 40) on 2x5x2, whose last axis is 12x faster, was cut
(batch, batch, hidden) — tensor parallel on the fast axis, its large weights' gradients summed
over the slow ones — 1.125 of the ILP optimum, where the optimum takes the hidden units on the
slow axis of 2 and the batch on the fast one: with few samples per device, a layer's weights
move more than its activations. No polish move reaches it (every op would move at once).

So each exchange of two such rounds' cuts (each distinct pair of columns once) is scored by the
evaluator; the ones scoring below the plan, lowest first (at most `TRIED`), are polished with
pair and run moves (`polish.polished_if_lower`) and kept when they then score lower: 1.125 ->
1.003 there. Never worse than the plan; O(rounds^2) scorings and at most `TRIED` polishes, none
on a mesh whose rounds of equal ways lie on one axis (8, 1024).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from shardplan.cost.evaluate import ScoreCache
from shardplan.cost.presets import CostOptions
from shardplan.errors import ShardplanError
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.search.drec.polish import plan_score, polished_if_lower
from shardplan.sharding import Strategy, check_strategies

TRIED = 2
"""At most this many exchanged plans are polished (each a polish; the scorings are cheap)."""

Plan = dict[str, Strategy]


def exchanged(mesh: Mesh, plan: Mapping[str, Strategy]) -> Iterator[Plan]:
    """`plan` with the cuts of rounds r and s exchanged, for each r < s on different mesh axes
    splitting them the same number of ways, each distinct pair of the plan's columns once."""
    rounds = mesh.rounds
    strategies = list(plan.values())
    seen: set[tuple[object, ...]] = set()
    for r in range(len(rounds)):
        for s in range(r + 1, len(rounds)):
            if rounds[r].q != rounds[s].q or rounds[r].mesh_axis == rounds[s].mesh_axis:
                continue
            cols = (tuple(c[r] for c in strategies), tuple(c[s] for c in strategies))
            key = (rounds[r].mesh_axis, rounds[s].mesh_axis, *cols)
            if cols[0] == cols[1] or key in seen:
                continue  # the same plan, or an exchange tried on rounds alike
            seen.add(key)
            yield {name: _exchange(c, r, s) for name, c in plan.items()}


def _exchange(cuts: Strategy, r: int, s: int) -> Strategy:
    out = list(cuts)
    out[r], out[s] = cuts[s], cuts[r]
    return tuple(out)


def with_axis_swaps(
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    memory_lambda: float,
    fold: Any,
    cache: ScoreCache,
    plan: Plan,
) -> Plan:
    """`plan`, or an exchange of two rounds' cuts (`exchanged`) polished, when it scores lower
    (module docstring). `fold`: the `Fold` whose reduced graph `graph` is (None: the graph)."""
    if opts.preset.symbolic:  # MindSpore's one pass, reproduced
        return plan
    candidates = list(exchanged(mesh, plan))
    if not candidates:
        return plan
    score = plan_score(graph, mesh, opts, memory_lambda, fold, cache, plan)
    below: list[tuple[float, int, Plan]] = []
    for k, candidate in enumerate(candidates):
        try:  # equal ways keep each dim's split, yet a halo may not allow it
            check_strategies(graph.ops, candidate, mesh.rounds, cache.classes, cache.valid)
        except ShardplanError:
            continue
        raw = plan_score(graph, mesh, opts, memory_lambda, fold, cache, candidate)
        if raw < score:
            below.append((raw, k, candidate))
    best, best_score = plan, score
    for _, _, candidate in sorted(below, key=lambda item: item[:2])[:TRIED]:
        args = (graph, mesh, opts, memory_lambda, fold, cache, best, best_score, candidate)
        found = polished_if_lower(*args, pairs=True)
        if found is not best:
            best, best_score = found, plan_score(*args[:6], found)
    return best


__all__ = ["TRIED", "exchanged", "with_axis_swaps"]
