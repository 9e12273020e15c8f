"""Column moves: the search's final plan with one round's cuts (its column) exchanged with, or
copied from, another round's.

D-Rec decides the rounds in the mesh's order, outermost axis first, each pricing its cuts under
assumptions about the rounds not yet decided; the choice it cannot revisit is how the rounds
share the cuts between them — which axis takes the batch and which the hidden units, and how
many rounds each takes. No polish move reaches another sharing: every op would move at once.
  * Exchanges (`exchanged`): two rounds of equal ways on different mesh axes lay every op out in
    the same shapes whichever takes which cut, but over other links. ViT-B/16 (1 layer, batch
    40) on 2x5x2, whose last axis is 12x faster, was cut (batch, batch, hidden) — tensor
    parallel on the fast axis, its weights' gradients summed over the slow ones — 1.125 of the
    ILP optimum, where the optimum takes the hidden units on the slow axis of 2 and the batch
    on the fast one (few samples per device: a layer's weights move more than its
    activations): 1.004 with the exchange.
  * Copies (`copied`): round r takes round s's cuts, where an op may (the others keep theirs):
    one more round of tensor parallelism and one less of data parallelism, or the reverse.
    ViT-B/16 (2 layers, batch 28) on 2x2x7 was cut (batch, hidden, batch), 1.115 of the
    optimum, which is (hidden, hidden, batch): round 0 copying round 1, 1.000.
Each candidate (each distinct pair of columns once) is scored by the evaluator; the ones
scoring below the plan, lowest first (at most `TRIED`), or when none does the lowest (`ABOVE`),
are polished with pair and run moves (`polish.polished_if_lower`) and kept when they then score
lower. Never worse than the plan;
O(rounds^2) scorings (fewer: pairs of alike columns are one) and at most `TRIED` polishes. Not
run in the memory-aware driver's penalised re-runs (`driver.py`: up to 8 of them, each seeking a
plan that fits), where their polishes would be paid once per re-run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from shardplan.cost.evaluate import ScoreCache
from shardplan.cost.presets import CostOptions
from shardplan.errors import ShardplanError
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.search.drec.polish import plan_score, polished_if_lower
from shardplan.sharding import Strategy, check_strategies

TRIED = 2
"""At most this many candidates are polished (each a polish; the scorings are cheap)."""
ABOVE = 1
"""When no candidate scores below the plan, this many of the lowest are polished all the same:
a copy moves every op, and a region that should keep its cut can cost more, as copied, than
the rest saves, until the polish gives it its cut back (BERT-base, one layer, batch 56, on 28 =
2 x 2 x 7: round 0 taking round 2's batch cut scores 1.137 of the ILP optimum as copied, above
the plan's 1.053; polished, its embeddings split along their width again (`runs.split_runs`):
1.000)."""

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


def copied(
    graph: Graph,
    mesh: Mesh,
    plan: Mapping[str, Strategy],
    valid: Callable[[int, Strategy], bool],
) -> Iterator[Plan]:
    """`plan` with round r taking round s's cuts, for each r != s, where an op may (`valid(op
    index, strategy)`; the others keep theirs), each distinct (axis, ways, column) pair of the
    two rounds once."""
    rounds = mesh.rounds
    strategies = [plan[op.name] for op in graph.ops]
    seen: set[tuple[object, ...]] = set()
    for r in range(len(rounds)):
        for s in range(len(rounds)):
            cols = (tuple(c[r] for c in strategies), tuple(c[s] for c in strategies))
            key = (rounds[r].mesh_axis, rounds[r].q, rounds[s].mesh_axis, rounds[s].q, *cols)
            if r == s or cols[0] == cols[1] or key in seen:
                continue
            seen.add(key)
            out = {}
            for i, (op, cuts) in enumerate(zip(graph.ops, strategies, strict=True)):
                new = (*cuts[:r], cuts[s], *cuts[r + 1 :])
                out[op.name] = new if new == cuts or valid(i, new) else cuts
            if out != plan:
                yield out


def _exchange(cuts: Strategy, r: int, s: int) -> Strategy:
    out = list(cuts)
    out[r], out[s] = cuts[s], cuts[r]
    return tuple(out)


def with_column_moves(
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    memory_lambda: float,
    fold: Any,
    cache: ScoreCache,
    plan: Plan,
) -> Plan:
    """`plan`, or an exchange or a copy of two rounds' cuts (`exchanged`, `copied`) polished,
    when it scores lower (module docstring). `fold`: the `Fold` whose reduced graph `graph` is
    (None: the graph)."""
    if opts.preset.symbolic or memory_lambda:  # MindSpore's one pass; a memory-penalised
        return plan  # re-run of the driver (`driver.py`, up to 8 of them) seeks a plan that fits

    def valid(i: int, strategy: Strategy) -> bool:  # in the cache's per-class valid set
        op = graph.ops[i]
        try:
            check_strategies(
                [op], {op.name: strategy}, mesh.rounds, [cache.classes[i]], cache.valid
            )
        except ShardplanError:
            return False
        return True

    candidates = [*exchanged(mesh, plan), *copied(graph, mesh, plan, valid)]
    args = (graph, mesh, opts, memory_lambda, fold, cache, plan, candidates)
    return best_polished(*args, TRIED, ABOVE)


def best_polished(
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    memory_lambda: float,
    fold: Any,
    cache: ScoreCache,
    plan: Plan,
    candidates: Sequence[Plan],
    tried: int,
    above: int = 0,
) -> Plan:
    """`plan`, or the best of the valid `candidates` scoring below it, at most `tried` of them
    lowest first — or, when none scores below it, the `above` lowest — polished with pair and
    run moves (`polish.polished_if_lower`), when one then scores lower. Shared by the column
    moves and the block copies (`blocks.py`)."""
    if not candidates:
        return plan
    score = plan_score(graph, mesh, opts, memory_lambda, fold, cache, plan)
    scored: list[tuple[float, int, Plan]] = []
    for k, candidate in enumerate(candidates):
        try:  # an exchange keeps each dim's split, yet a halo may not allow it
            check_strategies(graph.ops, candidate, mesh.rounds, cache.classes, cache.valid)
        except ShardplanError:
            continue
        raw = plan_score(graph, mesh, opts, memory_lambda, fold, cache, candidate)
        scored.append((raw, k, candidate))
    ranked = sorted(scored, key=lambda item: item[:2])
    below = [item for item in ranked if item[0] < score]
    chosen = below[:tried] if below else ranked[:above]
    best, best_score = plan, score
    for _, _, candidate in chosen:
        args = (graph, mesh, opts, memory_lambda, fold, cache, best, best_score, candidate)
        found = polished_if_lower(*args, pairs=True)
        if found is not best:
            best, best_score = found, plan_score(*args[:6], found)
    return best


__all__ = ["ABOVE", "TRIED", "best_polished", "copied", "exchanged", "with_column_moves"]
