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
A walk starts where `split_runs` starts one, at an op whole in every round (its own row's
cheapest cut in round r) that reads a parameter its cut leaves whole (the gradient it then
all-reduces is what another round's cut could shrink), unless an earlier walk of the round took
that op and cut (it went on from there alike). Its prefix with the least increase, when that
saves compute and another round could pay for it (the increase stays below what the rows it
reached pay beyond their compute plus that round's share of the moved ops' compute), is kept
tentatively, and each other round's walk from each of its ops that reads a parameter is
priced on top; the first pair whose total is lower is kept, else both are undone. A walk stops
when another round could no longer pay for it. O(rounds^2 x region x walk) per start; run in
the final plan's pair polish only (`polish.pair_polished`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING

from shardplan.ir.graph import Role
from shardplan.search.drec.runs import Trial, next_follower, own_best, round_cuts
from shardplan.sharding import Strategy

if TYPE_CHECKING:
    from shardplan.search.drec.polish import _Rows

Stop = Callable[[int, Trial], bool]
"""(the next op of a walk, the walk so far) -> whether to stop before moving it."""


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
    ahead: dict[float, list[float]] = {}  # `_ahead` per share, until a pair is kept
    for r in range(rounds):
        walked: set[tuple[int, Strategy]] = set()  # (op, cut) a walk of this round took
        for k in starts:
            if any(rows.plan[graph.ops[k].name]) or k in frozen or k in twins:
                continue  # a start whole in every round: no round's cut of it paid alone
            seed = own_best(rows, k, [s for s in round_cuts(rows, k, r) if s[r] is not None])
            if seed is None or (k, seed) in walked or not _keeps_weight_whole(rows, k, r, seed):
                continue  # an earlier walk went on from here alike (`runs.split_runs`)
            if _compound(rows, k, r, seed, twins, frozen, ahead, walked):
                moved = True
                ahead.clear()
                walked.clear()
    return moved


def _weights(rows: _Rows, i: int) -> list[int]:
    """The input positions of op i that read a parameter."""
    tensors, op = rows.graph.tensors, rows.graph.ops[i]
    return [p for p, t in enumerate(op.inputs) if tensors[t].role is Role.PARAMETER]


def _keeps_weight_whole(rows: _Rows, i: int, r: int, strategy: Strategy) -> bool:
    """Whether op i, cut by `strategy` in round r, reads a parameter that cut leaves whole."""
    op = rows.graph.ops[i]
    cut = strategy[r]
    return any(
        all(cut not in dims for dims in op.signature.inputs[p]) for p in _weights(rows, i)
    )


def _ahead(rows: _Rows, share: float, known: dict[float, list[float]]) -> list[float]:
    """Per op index e, what the rows of ops e, e+1, ... pay beyond their compute plus `share`
    of their compute: the most cuts in one more round can save there (kept in `known` while
    the plan stands: a walk's own moves shift it only on the rows it reached, which its trial
    counts apart)."""
    if share in known:
        return known[share]
    graph, n = rows.graph, len(rows.graph.ops)
    suffix = [0.0] * (n + 1)
    for j in range(n - 1, -1, -1):
        compute = rows.compute(j, rows.plan[graph.ops[j].name])
        suffix[j] = suffix[j + 1] + max(rows.current(j) - compute, 0.0) + share * compute
    known[share] = suffix
    return suffix


def _walk(
    rows: _Rows,
    k: int,
    r: int,
    seed: Strategy,
    twins: Mapping[int, int],
    frozen: Collection[int],
    stop: Stop,
) -> tuple[Trial, list[float], list[float]]:
    """`split_runs`'s walk from op k cutting `seed` in round r, until `stop`: the trial (every
    step applied), the total's change after each step and the compute each step's op saves."""
    trial = Trial(rows)
    moved: set[str] = set()
    totals: list[float] = []
    saved: list[float] = []
    e, strategy = k, seed
    while strategy is not None:
        saved.append(rows.compute(e, rows.plan[rows.graph.ops[e].name]) - rows.compute(e, strategy))
        trial.move(e, strategy)
        totals.append(trial.delta)
        moved.update(rows.graph.ops[e].outputs)
        e, strategy = next_follower(rows, e, r, moved, twins, frozen)
        if strategy is not None and stop(e, trial):
            break
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
    known: dict[float, list[float]],
    walked: set[tuple[int, Strategy]],
) -> bool:
    """The walk from op k in round r, when it lowers nothing alone, with another round's walk
    from one of its ops on top (module docstring); whether the pair was kept."""
    rounds = rows.mesh.rounds
    share = max(1.0 - 1.0 / rnd.q for i, rnd in enumerate(rounds) if i != r)
    region: list[float] = []  # the compute of the walk's ops once moved

    def hopeless(e: int, t: Trial) -> bool:
        """Another round could no longer pay for the walk: its rise reaches what the rows it
        reached pay beyond their compute plus that round's share of the moved ops' compute."""
        region.append(rows.compute(t.changed[-1][0], rows.plan[_name(rows, t.changed[-1][0])]))
        return t.delta - t.left - share * sum(region) >= 0

    first, totals, saved = _walk(rows, k, r, seed, twins, frozen, hopeless)
    walked.update((i, rows.plan[_name(rows, i)]) for i, _ in first.changed[1:])
    count = min(range(len(totals)), key=lambda m: (totals[m], m)) + 1
    cost = totals[count - 1]
    first.keep(count)
    kept = [i for i, _ in first.changed[:count]]
    # another round saves at most what the rows reached pay beyond their compute and its share
    # of the moved ops' compute
    room = first.left + share * sum(rows.compute(i, rows.plan[_name(rows, i)]) for i in kept)
    if cost <= 0 or sum(saved[:count]) <= 0 or cost >= room:  # split_runs' own, or hopeless
        _undo(first, count)
        return False
    below = -1e-12 * max(abs(sum(first.old.values())), 1e-300)
    for r2, rnd in enumerate(rounds):
        if r2 == r:
            continue
        suffix = _ahead(rows, 1.0 - 1.0 / rnd.q, known)
        for s in kept:
            if rows.plan[rows.graph.ops[s].name][r2] is not None or not _weights(rows, s):
                continue
            cuts = [c for c in round_cuts(rows, s, r2) if c[r2] is not None]
            seed2 = own_best(rows, s, cuts)
            if seed2 is None:
                continue
            second, after, _ = _walk(
                rows,
                s,
                r2,
                seed2,
                twins,
                frozen,
                lambda e, t, suffix=suffix: cost + t.delta - suffix[e] - t.left >= below,
            )
            best = min(range(len(after)), key=lambda m: (after[m], m)) + 1
            if cost + after[best - 1] < below:
                second.keep(best)
                return True
            second.keep(0)
    _undo(first, count)
    return False


__all__ = ["compound_runs"]
