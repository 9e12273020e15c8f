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
saves compute, is kept tentatively, and each other round's walk from each of its ops that reads
a parameter is priced on top, stopped as `split_runs` stops its own (when even what the rows
ahead pay beyond their compute, and that round's share of the compute of those it leaves whole,
could not bring the total below the start); the first pair whose total is lower is kept, else
both are undone.
Rounds the whole plan leaves idle (no op cut in them), when there are two or more, are searched
wider: in an idle round r a walk may start at any op that reads a parameter, whatever its cuts in
other rounds and whether or not its cut splits the weight, and pairs with walks in the idle
rounds after r only (each pair of rounds once); the memo skips only starts an earlier walk's
kept region took (their pairs were priced from there). A language-model head can then be cut
along the vocabulary in two idle rounds at once, the loss re-splitting the logits along the
tokens: a DeepSeek-MoE-style model, 1 layer, batch 50, sequence 64, on 5x5, left replicated
(1.173 -> 1.000 of the ILP optimum), and, 2 layers, batch 30, sequence 96, on 2x5x2, whose head
was cut in the last round only (1.070 -> 1.005). Plans with fewer than two idle rounds, nearly
all on larger graphs, are searched as before.
O(rounds^2 x region x walk) per start; run in the final plan's pair polish only
(`polish.pair_polished`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING

from shardplan.ir.graph import Role
from shardplan.search.drec.runs import Trial, next_follower, own_best, paid_suffix, round_cuts
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
    for r in range(rounds):
        idle = _idle_rounds(rows)
        later = [q for q in idle if q > r] if r in idle else []  # each pair of idle rounds once
        walked: set[tuple[int, Strategy]] = set()  # (op, cut) a walk of this round took
        for k in starts:
            # a start whole in every round (no round's cut of it paid alone); in a round the
            # plan leaves idle, any op that reads a parameter
            wide = bool(later) and bool(_weights(rows, k))
            if k in frozen or k in twins or (any(rows.plan[graph.ops[k].name]) and not wide):
                continue
            seed = own_best(rows, k, [s for s in round_cuts(rows, k, r) if s[r] is not None])
            if seed is None or (k, seed) in walked:
                continue  # an earlier walk went on from here alike (`runs.split_runs`)
            if not wide and not _keeps_weight_whole(rows, k, r, seed):
                continue
            others = later if wide else None
            if _compound(rows, k, r, seed, twins, frozen, walked, others):
                moved = True
                walked.clear()
                idle = _idle_rounds(rows)  # the pair kept took two of them
                later = [q for q in idle if q > r] if r in idle else []
    return moved


def _idle_rounds(rows: _Rows) -> list[int]:
    """The rounds in which the plan cuts no op."""
    plan, rounds = rows.plan, range(len(rows.mesh.rounds))
    return [r for r in rounds if all(s[r] is None for s in plan.values())]


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


def _walk(
    rows: _Rows,
    k: int,
    r: int,
    seed: Strategy,
    twins: Mapping[int, int],
    frozen: Collection[int],
    stop: Stop | None = None,
) -> tuple[Trial, list[float], int, list[float]]:
    """`split_runs`'s walk from op k cutting `seed` in round r, until `stop` (None: the walk's
    end): the trial (every step applied), the total's change after each step, the step after
    which it is lowest (the earliest on a tie) and the compute each step's op saves."""
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
        if strategy is not None and stop is not None and stop(e, trial):
            break
    return trial, totals, min(range(len(totals)), key=lambda m: (totals[m], m)), saved


def _compound(
    rows: _Rows,
    k: int,
    r: int,
    seed: Strategy,
    twins: Mapping[int, int],
    frozen: Collection[int],
    walked: set[tuple[int, Strategy]],
    others: list[int] | None = None,
) -> bool:
    """The walk from op k in round r, when it lowers nothing alone, with another round's walk
    from one of its ops on top (module docstring); whether the pair was kept. `others`: the
    rounds paired with it (the idle rounds after r), None: every other round."""
    ops = rows.graph.ops
    first, totals, lowest, saved = _walk(rows, k, r, seed, twins, frozen)
    count, cost = lowest + 1, totals[lowest]
    # the ops after the start it took (in idle rounds, `others`: those its region kept, whose
    # pairs with the other rounds were priced from here)
    passed = first.changed[1 : count if others is not None else len(first.changed)]
    walked.update((i, rows.plan[ops[i].name]) for i, _ in passed)
    first.keep(count)
    kept = [i for i, _ in first.changed[:count]]
    if cost <= 0 or sum(saved[:count]) <= 0:  # split_runs' own move, or no compute saved
        first.keep(0)
        return False
    below = -1e-12 * max(abs(sum(first.old.values())), 1e-300)
    for r2, rnd in enumerate(rows.mesh.rounds):
        if r2 == r or (others is not None and r2 not in others):
            continue
        # what cuts in round r2 could still save on the rows from each op on (`split_runs`)
        suffix = paid_suffix(rows, r2, 1.0 - 1.0 / rnd.q)
        for s in kept:
            if rows.plan[ops[s].name][r2] is not None or not _weights(rows, s):
                continue
            seed2 = own_best(rows, s, [c for c in round_cuts(rows, s, r2) if c[r2] is not None])
            if seed2 is None:
                continue
            second, after, low, _ = _walk(
                rows,
                s,
                r2,
                seed2,
                twins,
                frozen,
                lambda e, t, suffix=suffix: cost + t.delta - suffix[e] - t.left >= below,
            )
            if cost + after[low] < below:
                second.keep(low + 1)
                return True
            second.keep(0)
    first.keep(0)
    return False


__all__ = ["compound_runs"]
