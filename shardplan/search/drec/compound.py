"""Compound run moves of D-Rec's exact polish: one region cut in two rounds at once.

`runs.split_runs` cuts, in one round, a region that round leaves unused, and keeps it only when
that lowers the total. A region whose ops read a large weight can lose in every round alone and
win in two together: cut along the tokens in one round, it all-reduces its weight's gradient
whole; cut along the weight's features in another, it re-splits its activations; cut both
ways, the gradient all-reduced is the feature-split shard and the features' re-split is paid on
a share of the tokens. D-Rec's rounds decide one at a time and each, alone, keeps the region
whole (a DeepSeek-MoE-style model, 2 layers, on 3x5, replicated but for the language-model
head, which the optimum cuts along the sequence over 3 and the vocabulary over 5: 1.055 ->
1.000 of the ILP optimum).
Here each walk of `split_runs` that lowered nothing alone (its prefix with the least increase)
is kept tentatively, and each other round's walk from each of its ops left unused there (the
cut its own row prices lowest, then the readers that follow, as `split_runs`) is priced on top;
the first pair whose total is lower is kept, else both are undone. Gate: the first walk must
save compute (its prefix's rows cost more only through collectives, which the second round's
cut can shrink). O(rounds^2 x region x walk) per start; run once per search, on its final plan.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING

from shardplan.search.drec.runs import Trial, next_follower, own_best, round_cuts
from shardplan.sharding import Strategy

if TYPE_CHECKING:
    from shardplan.search.drec.polish import _Rows


def compound_runs(
    rows: _Rows,
    twins: Mapping[int, int],
    frozen: Collection[int],
    near: Collection[int] | None = None,
) -> bool:
    """Regions cut in two rounds at once (module docstring); whether one was kept. `near`: the
    ops a region may start from (None: all)."""
    graph, n = rows.graph, len(rows.graph.ops)
    rounds = len(rows.mesh.rounds)
    if rounds < 2:
        return False
    starts = range(n) if near is None else sorted(near)
    moved = False
    for r in range(rounds):
        for k in starts:
            if rows.plan[graph.ops[k].name][r] is not None or k in frozen or k in twins:
                continue
            seed = own_best(rows, k, [s for s in round_cuts(rows, k, r) if s[r] is not None])
            if seed is not None:
                moved |= _compound(rows, k, r, seed, twins, frozen)
    return moved


def _walk(
    rows: _Rows,
    k: int,
    r: int,
    seed: Strategy,
    twins: Mapping[int, int],
    frozen: Collection[int],
) -> tuple[Trial, list[float], list[float]]:
    """`split_runs`'s walk from op k cutting `seed` in round r, every step applied: the trial,
    the total's change after each step and the compute each step's op saves."""
    trial = Trial(rows)
    moved: set[str] = set()
    totals: list[float] = []
    saved: list[float] = []
    e, strategy = k, seed
    while strategy is not None:
        before = rows.plan[_name(rows, e)]
        saved.append(rows.compute(e, before) - rows.compute(e, strategy))
        trial.move(e, strategy)
        totals.append(trial.delta)
        moved.update(rows.graph.ops[e].outputs)
        e, strategy = next_follower(rows, e, r, moved, twins, frozen)
    return trial, totals, saved


def _name(rows: _Rows, i: int) -> str:
    """Op i's name."""
    return rows.graph.ops[i].name


def _undo(trial: Trial, count: int) -> None:
    """Undo the trial's first `count` moves (the rest undone already)."""
    for i, before in reversed(trial.changed[:count]):
        trial.rows.set(i, before)
        trial.rows.moved(i)


def _compound(
    rows: _Rows,
    k: int,
    r: int,
    seed: Strategy,
    twins: Mapping[int, int],
    frozen: Collection[int],
) -> bool:
    """The walk from op k in round r, when it lowers nothing alone, with another round's walk
    from one of its ops on top (module docstring); whether the pair was kept."""
    first, totals, saved = _walk(rows, k, r, seed, twins, frozen)
    count = min(range(len(totals)), key=lambda m: (totals[m], m)) + 1
    cost = totals[count - 1]
    first.keep(count)
    if cost <= 0 or sum(saved[:count]) <= 0:  # split_runs' own move, or no compute saved
        _undo(first, count)
        return False
    region = [i for i, _ in first.changed[:count]]
    for r2 in range(len(rows.mesh.rounds)):
        if r2 == r:
            continue
        for s in region:
            if rows.plan[_name(rows, s)][r2] is not None:
                continue
            cuts = [c for c in round_cuts(rows, s, r2) if c[r2] is not None]
            seed2 = own_best(rows, s, cuts)
            if seed2 is None:
                continue
            second, after, _ = _walk(rows, s, r2, seed2, twins, frozen)
            best = min(range(len(after)), key=lambda m: (after[m], m)) + 1
            if cost + after[best - 1] < -1e-12 * max(abs(sum(first.old.values())), 1e-300):
                second.keep(best)
                return True
            second.keep(0)
    _undo(first, count)
    return False


__all__ = ["compound_runs"]
