"""Run moves of D-Rec's exact polish (`polish.py`): one round changed on a run of ops at once.

Single moves change one op, pair moves an op and one reader, the tail move replicates the
graph's last ops in every round. Two kinds of runs no such move reaches, since each of their
ops alone adds a redistribution on both of its sides:
  * `run_moves`: a run of consecutive ops (graph order) left unused in one round, starting just
    after an op that round leaves unused. After a convolution that cuts its input channels over
    an axis (its output whole there once its partial sums are all-reduced), D-Rec cut the batch
    again for the next ops and all-reduced their weights' gradients: AlexNet, batch 60, on 3x5
    keeps its last convolutions whole over the axis of 3 (1.042 -> 1.006 of the ILP optimum);
  * `split_runs`: a region a round leaves unused, cut in that round: from an op the round
    leaves unused, cut along the loop dim its own row prices lowest, each later op the round
    leaves unused that reads a moved op takes the cut its own row prices lowest. An MoE layer
    (batch 6, sequence 128) on 12 = 2 x 2 x 3 left the round of 3 unused, where the optimum
    splits the tokens after attention (residual, norm, router, dispatch, loss) and keeps
    attention and the 8 experts whole: 1.116 -> 1.001.
Each run is priced exactly and cumulatively by the evaluator's rows (`polish._Rows`), and its
prefix that lowers the total most is kept. Run once per search, on its final plan, with the pair
moves (`polish.pair_polished`). A split walk that kept nothing is remembered with the strategies
its rows read (`TriedWalk`), and a follower's cut with those its own row reads (`round_pick`),
for every polish of one search: the passes after a move re-walk only what the move reached, and
walks through the same region price its followers once (a ResNet's hundreds of walks).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardplan.errors import ShardplanError
from shardplan.sharding import Strategy, check_strategy

if TYPE_CHECKING:
    from shardplan.search.drec.polish import _Rows


def valid(rows: _Rows, i: int, strategy: Strategy) -> bool:
    """Whether op i can take `strategy` (`sharding.check_strategy`), remembered per class."""
    key = (rows.cache.classes[i], strategy)
    if key in rows.cache.valid:
        return True
    if key in rows.invalid:
        return False
    try:
        check_strategy(rows.graph.ops[i], strategy, rows.mesh.rounds)
    except ShardplanError:
        rows.invalid.add(key)
        return False
    rows.cache.valid.add(key)
    return True


class Trial:
    """A run of moves priced cumulatively: each move re-prices the rows the op reaches;
    `delta` is the change of the total so far, `left` what the rows reached pay beyond their
    compute now (the most a longer run could still save there)."""

    def __init__(self, rows: _Rows) -> None:
        self.rows = rows
        self.old: dict[int, float] = {}
        self.new: dict[int, float] = {}
        self.comm: dict[int, float] = {}
        self.delta = 0.0
        self.left = 0.0
        self.changed: list[tuple[int, Strategy]] = []  # (op, its strategy before), in order

    def move(self, i: int, strategy: Strategy) -> None:
        """Op i takes `strategy`; the rows it reaches re-priced."""
        rows = self.rows
        plan, ops = rows.plan, rows.graph.ops
        for j in rows.touched[i]:
            if j not in self.old:
                self.old[j] = self.new[j] = rows.current(j)  # reads no op changed so far
        self.changed.append((i, plan[ops[i].name]))
        rows.set(i, strategy)
        for j in rows.touched[i]:
            value = rows.row(j)
            self.delta += value - self.new[j]
            self.new[j] = value
            extra = max(value - rows.compute(j, plan[ops[j].name]), 0.0)
            self.left += extra - self.comm.get(j, 0.0)
            self.comm[j] = extra

    def beats(self, best: float) -> bool:
        """Whether the run so far lowers the total by more than `best` (to rounding)."""
        return self.delta < best - 1e-12 * max(abs(sum(self.old.values())), 1e-300)

    def keep(self, count: int) -> bool:
        """Keep the first `count` moves, undo the rest; whether any was kept."""
        for m, (i, before) in enumerate(self.changed):
            if m >= count:
                self.rows.set(i, before)
            self.rows.moved(i)
        return count > 0


def split_runs(
    rows: _Rows,
    twins: Mapping[int, int],
    frozen: Collection[int],
    near: Collection[int] | None = None,
) -> bool:
    """Cut, in one round r, a region that leaves it unused: from each op left unused in round
    r, cut along the valid loop dim its own row prices lowest (an embedding along its table's
    width, where the first, the batch, only re-splits what its readers gather: BERT-base on
    28 after a column copy, `columns.ABOVE`), then each op left unused in round r reading a
    moved op (graph order) takes the cut of round r its own row prices lowest, cumulatively; the
    region up to the op where the total is lowest is kept when it lowers the total. Whether one
    was. `near`: the ops a region may start from (None: all). A start that an earlier walk of
    the round, since the plan last changed, reached taking the same cut, with no lower total
    anywhere after it, is not walked again (the same followers would follow; on a replicated
    plan every op starts a walk: GPT-2 small, 3 layers, on 24 walked 8,000 and kept 4)."""
    graph, n, moved = rows.graph, len(rows.graph.ops), False
    starts = range(n) if near is None else sorted(near)
    memo = rows.splits_tried.setdefault(stops(twins, frozen), {})
    for r, rnd in enumerate(rows.mesh.rounds):
        suffix = paid_suffix(rows, r, 1.0 - 1.0 / rnd.q)  # a cut saves that much compute
        walked: set[tuple[int, Strategy]] = set()  # (op, strategy) an earlier walk reached
        for k in starts:
            current = rows.plan[graph.ops[k].name]
            if current[r] is not None or k in frozen or k in twins:
                continue
            tried = memo.get((r, k))
            if tried is not None and tried.holds(rows, suffix):
                if (k, tried.seed) not in walked:  # the same walk: the same steps join `walked`
                    walked.update(tried.walked)
                continue
            seed = own_best(rows, k, [s for s in round_cuts(rows, k, r) if s[r] is not None])
            if seed is None or (k, seed) in walked:
                continue
            kept = _best_region(rows, k, r, seed, twins, frozen, suffix, walked, memo)
            if kept:
                walked.clear()  # the plan changed: walks priced before no longer hold
            moved |= kept
    return moved


def stops(twins: Mapping[int, int], frozen: Collection[int]) -> tuple[object, ...]:
    """Where moves stop (pinned ops, folded twins): the key of what a polish remembers."""
    return frozenset(frozen), tuple(sorted(twins.items()))


@dataclass(frozen=True)
class TriedWalk:
    """A `split_runs` walk that kept nothing: the ops whose strategies the rows it priced read
    (`row_reads`), those strategies then, where it stopped on the `paid_suffix` bound (None: at
    its end) and that bound there, its seed and the steps it added to `walked`. While those
    strategies hold and the bound there has not grown, walking again takes the same steps and
    keeps nothing: `split_runs` skips it (the pair passes after a move re-walk only what the
    move reached: ResNet-152 on 4x8)."""

    ops: tuple[int, ...]
    strategies: tuple[Strategy, ...]
    stop: int | None
    bound: float
    seed: Strategy
    walked: tuple[tuple[int, Strategy], ...]

    def holds(self, rows: _Rows, suffix: Sequence[float]) -> bool:
        plan, ops = rows.plan, rows.graph.ops
        if self.stop is not None and suffix[self.stop] > self.bound:
            return False
        return all(plan[ops[i].name] == s for i, s in zip(self.ops, self.strategies, strict=True))


def row_reads(rows: _Rows, row_ops: Iterable[int]) -> list[int]:
    """The ops whose strategies the rows `row_ops` read, sorted: each row's op, its operands'
    producers, its parameters' first readers and the earlier readers of its operands (share
    credits)."""
    graph, previous = rows.graph, rows.cache.previous
    ops: set[int] = set()
    for j in row_ops:
        ops.add(j)
        for name, prev in zip(graph.ops[j].inputs, previous[j], strict=True):
            if (p := graph.producer.get(name)) is not None:
                ops.add(p)
            if (f := rows.first_reader.get(name)) is not None:
                ops.add(f)
            if prev is not None:
                ops.add(prev[0])
    return sorted(ops)


def own_best(rows: _Rows, k: int, options: list[Strategy]) -> Strategy | None:
    """The strategy of `options` op k's own row prices lowest (the first on a tie), or None
    when there is none."""
    if not options:
        return None
    current = rows.plan[rows.graph.ops[k].name]
    costs = []
    for strategy in options:
        rows.set(k, strategy)
        costs.append(rows.row(k))
    rows.set(k, current)
    return options[costs.index(min(costs))]


def paid_suffix(rows: _Rows, r: int = 0, share: float = 0.0) -> list[float]:
    """Per op index e, what the rows of ops e, e+1, ... pay beyond their compute, plus `share`
    of the compute of those left unused in round r: the most a move of those ops can save
    there (cutting an op in round r of q ways saves at most 1 - 1/q of its compute; dropping a
    cut, none)."""
    graph, n = rows.graph, len(rows.graph.ops)
    suffix = [0.0] * (n + 1)
    for j in range(n - 1, -1, -1):
        strategy = rows.plan[graph.ops[j].name]
        compute = rows.compute(j, strategy)
        paid = rows.current(j) - compute
        saved = share * compute if share and strategy[r] is None else 0.0
        suffix[j] = suffix[j + 1] + max(paid, 0.0) + saved
    return suffix


def round_cuts(rows: _Rows, i: int, r: int) -> list[Strategy]:
    """Op i's valid strategies that differ from its current one in round r alone."""
    op, current = rows.graph.ops[i], rows.plan[rows.graph.ops[i].name]
    dims = [None, *(d.name for d in op.signature.loop_dims)]
    out = [(*current[:r], c, *current[r + 1 :]) for c in dims if c != current[r]]
    return [s for s in out if valid(rows, i, s)]


def _best_region(
    rows: _Rows,
    k: int,
    r: int,
    seed: Strategy,
    twins: Mapping[int, int],
    frozen: Collection[int],
    suffix: Sequence[float],
    walked: set[tuple[int, Strategy]],
    memo: dict[tuple[int, int], TriedWalk],
) -> bool:
    """`split_runs` from op k cutting `seed`; whether the region was kept (else it joins
    `memo`, `TriedWalk`). The walk stops when
    even dropping every later row's collectives (`suffix`) and those of the rows reached could
    not beat the best region. Each (op, strategy) it takes from which the rest of the walk
    never lowered the total (the region from there, priced as this walk's difference) joins
    `walked`."""
    trial = Trial(rows)
    moved: set[str] = set()  # tensors written by moved ops
    best, best_len = 0.0, 0
    e, strategy = k, seed
    steps: list[tuple[int, Strategy, float]] = []  # (op, strategy, the total's change before)
    totals: list[float] = []  # the total's change after each step
    priced = [k]  # the rows priced beyond those the moves reach: candidates' own
    stop = None
    while strategy is not None:
        steps.append((e, strategy, trial.delta))
        trial.move(e, strategy)
        totals.append(trial.delta)
        moved.update(rows.graph.ops[e].outputs)
        if trial.beats(best):
            best, best_len = trial.delta, len(trial.changed)
        e, strategy = next_follower(rows, e, r, moved, twins, frozen, priced)
        if strategy is not None and trial.delta - suffix[e] - trial.left >= best:
            stop = e
            break
    lowest = math.inf
    added = []
    for (op, cut, before), after in zip(reversed(steps), reversed(totals), strict=True):
        lowest = min(lowest, after)
        if lowest >= before:  # no region of this walk from this step on lowered the total
            added.append((op, cut))
    walked.update(added)
    if best_len:
        return trial.keep(best_len)
    reached = {j for i, _ in trial.changed for j in rows.touched[i]}
    trial.keep(0)  # undone before the strategies its rows read are noted
    ops = row_reads(rows, reached.union(priced))
    strategies = tuple(rows.plan[rows.graph.ops[i].name] for i in ops)
    bound = suffix[stop] if stop is not None else math.inf
    memo[r, k] = TriedWalk(tuple(ops), strategies, stop, bound, seed, tuple(added))
    return False


def next_follower(
    rows: _Rows,
    after: int,
    r: int,
    moved: set[str],
    twins: Mapping[int, int],
    frozen: Collection[int],
    priced: list[int] | None = None,
) -> tuple[int, Strategy | None]:
    """The next op after `after` (graph order) reading a tensor in `moved`, left unused in round
    r, whose own row prices another cut of round r lowest, with that strategy (None: no such
    op before a pinned op or a folded twin, or the graph's end). `priced`: each op that reads
    a tensor in `moved` is appended (the rows looked at)."""
    graph, plan = rows.graph, rows.plan
    for e in range(after + 1, len(graph.ops)):
        op = graph.ops[e]
        if not moved.intersection(op.inputs):
            continue
        if priced is not None:
            priced.append(e)
        if e in frozen or e in twins:
            return e, None
        current = plan[op.name]
        if current[r] is not None:
            continue  # cut in round r already: the region grows over ops the round leaves unused
        pick = round_pick(rows, e, r)
        if pick != current:
            return e, pick
    return len(graph.ops), None


def round_pick(rows: _Rows, e: int, r: int) -> Strategy:
    """`own_best` of op e among its strategy and its other cuts of round r, remembered per the
    strategies its row reads (`row_reads`): the same strategies price its row alike."""
    reads = rows.cache.memo.setdefault("row reads", {})  # the graph's alone
    mine = reads.get(e)
    if mine is None:
        mine = reads[e] = tuple(row_reads(rows, [e]))
    ops, plan = rows.graph.ops, rows.plan
    key = (e, r, tuple(plan[ops[d].name] for d in mine))
    pick = rows.picks.get(key)
    if pick is None:
        pick = rows.picks[key] = own_best(rows, e, [plan[ops[e].name], *round_cuts(rows, e, r)])
    return pick


def run_moves(
    rows: _Rows,
    twins: Mapping[int, int],
    frozen: Collection[int],
    near: Collection[int] | None = None,
) -> bool:
    """Leave one round unused on a run of consecutive ops (graph order) that starts just after
    an op the round leaves unused: each run start's best run, if one lowers the total; whether
    one did. Where a cut stage is followed by a replicated one (a convolution that all-reduces
    its partial sums), the ops after it re-split their input only to all-reduce small weights'
    gradients; no op alone can stop (it would gather its input and scatter its output again),
    and the run is not at the graph's end (`polish._tail_move`): AlexNet on 3x5, batch 60, keeps
    its last convolutions whole over the axis of 3 (1.042 -> 1.006 of the ILP optimum).
    `near`: the ops a run may start at (None: all)."""
    graph, n, moved = rows.graph, len(rows.graph.ops), False
    for r in range(len(rows.mesh.rounds)):
        suffix = paid_suffix(rows)  # what the rows from each op on pay: the most a run saves
        k = 1
        while k < n:
            plan, ops = rows.plan, graph.ops
            if plan[ops[k].name][r] is None or plan[ops[k - 1].name][r] is not None:
                k += 1
                continue
            if near is not None and k not in near:
                k += 1
                continue
            end = _best_run(rows, k, r, suffix, twins, frozen)
            moved |= end > k
            k = max(end, k + 1)
    return moved


def _best_run(
    rows: _Rows,
    k: int,
    r: int,
    suffix: Sequence[float],
    twins: Mapping[int, int],
    frozen: Collection[int],
) -> int:
    """Ops k, k+1, ... with round r's cut dropped, cumulatively, each step re-pricing the rows
    the op reaches; the run k..end-1 that lowers the total most is kept (end; k when none
    does). Stopped at a pinned op or a folded twin, or when even dropping every later row's
    collectives (`suffix`) and those of the rows reached could not beat the best run."""
    graph, plan, n = rows.graph, rows.plan, len(rows.graph.ops)
    trial = Trial(rows)
    best, best_end, best_len = 0.0, k, 0
    for e in range(k, n):
        if e in frozen or e in twins or trial.delta - suffix[e] - trial.left >= best:
            break
        current = plan[graph.ops[e].name]
        if current[r] is None:
            continue
        strategy = (*current[:r], None, *current[r + 1 :])
        if not valid(rows, e, strategy):
            break
        trial.move(e, strategy)
        if trial.beats(best):
            best, best_end, best_len = trial.delta, e + 1, len(trial.changed)
    trial.keep(best_len)
    return best_end
