"""Exact polish of a complete D-Rec plan: single-op moves across rounds, priced by the evaluator.

D-Rec decides round by round, and a round prices its cuts under assumptions about the rounds not
yet decided (later rounds shrink an all-reduce, keep both sides of an edge split alike). When the
assumption fails — a later round is left unused, or the other side of an edge parts in a later
round — an early round's cut can be wrong in a way no later round can repair: an MoE layer's
down projection cuts the token groups in round 0 of mesh 12 (its output then needs no
all-to-all in that round) and all-reduces its 800M-entry weight gradient, where the experts cut
(continuing its input's layout) costs only a larger all-to-all, since round 1 parts the two sides
anyway (qwen3-235b-a22b, 1 layer, mesh 12: 1.095 of the ILP optimum from this one op).

Once every round is decided, the evaluator's total is a sum of unary and pairwise terms (an op's
own terms, its operands' redistributions from their producers or parameter homes, and the share
credit of an operand read after another consumer): changing one op's strategy changes only its
own row and the rows of its output's consumers, of the next readers of its inputs and of its
parameters' other readers. The polish visits ops in graph order and moves each to the strategy
— its current one with one round's cut replaced by another valid cut or none — that lowers that
local sum most, exactly the change of the total. A round where every neighbour agrees with the
op's cut is left alone unless the cut is along a reduced dim; then no cut is tried, its partial
sums' all-reduce traded for its input's gather (BERT-base's attention output projection, 2
layers, on 30: 1.054 -> 1.016 of the ILP optimum). Sweeps repeat while some move pays, at most
`SWEEPS` times. On a folded graph (`fold.py`) a block-1 op and its block-2 twin move together
and rows are weighted as in the fold's score, so the plan stays uniform and the score exact.

Weight moves (`_weight_moves`, with the pair moves): where every neighbour agrees with a cut
that leaves a weight whole, its gradient summed over the round, no cut and each cut that splits
a weight are tried, trading that sum for redistributions on both sides (Llama, 1 layer, batch
84, on 4x7: the output head's 32000 x 1024 table summed over the axis of 4 while every neighbour
split the batch, 1.219 -> 1.028 of the ILP optimum).

Pair moves (`pair_polished`, once on a search's final plan, not per variant): an op and a reader
of its result, where both cut one axis of that tensor in some rounds, both cut another of its
axes there instead, and (or) in the rounds both leave idle. Each half alone adds a
redistribution on their edge that the pair removes, so when the pair pays no single move does:
BERT's position-embedding lookup and the add reading it leave the batch for the hidden dim
together, the table's gradient no longer all-reduced (BERT-base on 18: 1.052 of the ILP
optimum, now 1.000). And the tail move (`_tail_move`): the
run of last ops, replicated in every round, that lowers the total most (ResNet-50 on 12 keeps
layer 4 whole on every device: 1.088 -> 1.000). And run moves (`runs.py`): one round left
unused on a run of consecutive ops after an op it leaves unused (AlexNet on 3x5, batch 60:
1.042 -> 1.006), or a region a round leaves unused cut in it, each op reading a moved one
following (an MoE layer on 12, batch 6: 1.116 -> 1.001), and such a region cut in two rounds
at once when neither round alone pays (`compound.py`: a DeepSeek-MoE-style model, 2 layers, on
3x5 cuts its language-model head along the sequence over 3 and the vocabulary over 5: 1.055 ->
1.000). After any of them the single sweeps run again. A pair tried without a move is
remembered with the strategies of the ops its rows read, for every polish of one search, and
tried again only once one of them moves (the same rows would price it alike).

Cost: per sweep O(sum over ops of rounds x loop dims x local rows), linear in the graph; a pair
pass O(edges x tensor axes^2 x local rows).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from shardplan.cost.evaluate import ScoreCache, evaluate_strategies, own_and_edges, param_homes
from shardplan.cost.incremental import graph_readers
from shardplan.cost.presets import CostOptions
from shardplan.ir.dims import DimKind
from shardplan.ir.graph import Graph, Role
from shardplan.mesh import Mesh
from shardplan.search.drec.compound import compound_runs
from shardplan.search.drec.runs import (
    Trial,
    TriedWalk,
    row_reads,
    run_moves,
    split_runs,
    stops,
    valid,
)
from shardplan.search.drec.streams import stream_moves
from shardplan.search.drec.tied import tied_moves
from shardplan.sharding import PARTIAL, REPLICATED, Layout, Strategy, layout_of_cut

SWEEPS = 3
"""At most this many passes over the graph (each pass is linear; most plans settle in one)."""


class _Rows:
    """The evaluator's rows of one plan, kept current as ops move (`evaluate.own_and_edges`)."""

    def __init__(
        self,
        graph: Graph,
        mesh: Mesh,
        plan: dict[str, Strategy],
        cache: ScoreCache,
        weights: Sequence[float] | None,
    ) -> None:
        self.graph, self.mesh, self.plan, self.cache = graph, mesh, plan, cache
        self.weights = weights
        ops = graph.ops
        prices = [
            cache.price(op, cid, plan[op.name]) for op, cid in zip(ops, cache.classes, strict=True)
        ]
        self.homes: dict[str, Layout] = param_homes(graph, plan, None, [p.inputs for p in prices])
        self.out: dict[str, Layout] = {}
        for op, price in zip(ops, prices, strict=True):
            self.out.update(zip(op.outputs, price.resolved, strict=True))
        static = cache.memo.get("polish")  # the graph's alone: one copy for every polish
        if static is None:  # each parameter's first reader (its home), each op's row readers
            readers, first = graph_readers(cache)
            static = cache.memo["polish"] = ({n: i for n, (i, _) in first.items()}, readers)
        self.first_reader, self.touched = static
        self.invalid: set[tuple[object, ...]] = set()  # (class, strategy) pairs found invalid
        self.streams_tried: dict[tuple[object, ...], tuple[object, ...]] = {}
        """(round, stream) -> what its trial read when it was tried and kept nothing
        (`streams.stream_moves`)."""
        # what the moves tried and found nothing in, shared by every polish of this graph's
        # plans with these row weights (one search): keyed by `runs.stops` where it matters
        memo, weighed = cache.memo, None if weights is None else tuple(weights)
        self.splits_tried: dict[object, dict[tuple[int, int], TriedWalk]] = memo.setdefault(
            ("split walks", weighed), {}
        )
        """stops -> (round, start) -> its `runs.split_runs` walk that kept nothing."""
        self.pairs_tried: dict[object, dict[tuple[int, ...], tuple[Strategy, ...]]] = (
            memo.setdefault(("pairs tried", weighed), {})
        )
        """stops -> (op, output, reader, input) -> `_pair_moves`' memo."""
        self.picks: dict[tuple[object, ...], Strategy] = memo.setdefault(
            ("round picks", weighed), {}
        )
        """(op, round, the strategies its row reads) -> `runs.round_pick`'s pick."""
        self.values: dict[int, float] = {}
        """Row -> its value under the current plan (`current`), dropped when an op it reads
        moves."""

    def row(self, j: int) -> float:
        op = self.graph.ops[j]
        price = self.cache.price(op, self.cache.classes[j], self.plan[op.name])
        intra, redis = own_and_edges(self.cache, self.plan, self.homes, self.out, j, op, price)
        total = price.compute + intra.total + redis.total
        return total * self.weights[j] if self.weights is not None else total

    def current(self, j: int) -> float:
        """`row(j)` under the current plan, kept until an op it reads moves (`moved`)."""
        value = self.values.get(j)
        if value is None:
            value = self.values[j] = self.row(j)
        return value

    def moved(self, i: int) -> None:
        """Op i's strategy changed: the rows that read it are priced again when asked for."""
        for j in self.touched[i]:
            self.values.pop(j, None)

    def compute(self, j: int, strategy: Strategy) -> float:
        """Row j's compute (weighted) under `strategy`: a floor of its row."""
        op = self.graph.ops[j]
        compute = self.cache.compute(op, self.cache.classes[j], strategy)
        return compute * self.weights[j] if self.weights is not None else compute

    def set(self, i: int, strategy: Strategy) -> None:
        op = self.graph.ops[i]
        self.plan[op.name] = strategy
        price = self.cache.price(op, self.cache.classes[i], strategy)
        self.out.update(zip(op.outputs, price.resolved, strict=True))
        for pos, name in enumerate(op.inputs):
            if self.first_reader.get(name) == i:
                self.homes[name] = price.inputs[pos]


def polish(
    graph: Graph,
    mesh: Mesh,
    plan: Mapping[str, Strategy],
    cache: ScoreCache,
    weights: Sequence[float] | None = None,
    twins: Mapping[int, int] | None = None,
    frozen: Collection[int] | None = None,
    pairs: bool = False,
    compound: bool = False,
) -> dict[str, Strategy]:
    """`plan` improved by exact single-op moves (module docstring); `weights` and `twins` (op
    index -> the index that moves with it) for a folded graph; `frozen`: ops that keep their
    strategy (user-fixed); `pairs`: once single moves settle, pair moves and the tail move too
    (`_pair_pass`: a search's final plan); `compound`: the pair passes with compound run moves
    (`compound.py`, the final plan's polish alone: they walk from every op).
    Never costlier than `plan`."""
    if cache.opts.zero:  # ZeRO's storage collectives are not in the rows (searches price 0)
        return dict(plan)
    rows = _Rows(graph, mesh, {k: tuple(v) for k, v in plan.items()}, cache, weights)
    _polished(rows, twins or {}, frozen or (), pairs, tied=True, settled=True, compound=compound)
    return rows.plan


def _polished(
    rows: _Rows,
    twins: Mapping[int, int],
    frozen: Collection[int],
    pairs: bool,
    tied: bool,
    settled: bool,
    near: Collection[int] | None = None,
    compound: bool = False,
) -> None:
    """`polish` on `rows`: with `pairs`, the pair pass first (`tied`: with tied-parameter
    moves), then single sweeps, the pair pass again once they settle; `settled`: the plan is
    already settled under single moves (a variant's, polished), so no sweep runs when the first
    pair pass moves nothing; `near`: the ops whose moves are tried (None: all)."""
    n = len(rows.graph.ops)
    if pairs and not _pair_pass(rows, twins, frozen, tied, near, compound) and settled:
        return
    ops = range(n) if near is None else sorted(near)
    for sweep in range(SWEEPS):
        moved = False
        for i in ops:
            if twins.get(i, n) < i or i in frozen:
                continue  # moved with its twin, or pinned
            moved |= _best_move(rows, [i, twins[i]] if i in twins else [i])
        if pairs and (not moved or sweep == SWEEPS - 1):
            # settled: moves of an op with its reader, which no single move reaches
            moved = _pair_pass(rows, twins, frozen, tied, near, compound)
        if not moved:
            break


def _best_move(rows: _Rows, unit: list[int], weights: bool = False) -> bool:
    """Move the ops of `unit` (alike ops that share one strategy) to the strategy, one round's
    cut away from the current one, that lowers the total most; whether one did. A row costs at
    least its compute (its collectives, credits included, and redistributions are >= 0), and the
    other rows' compute does not depend on the move: a candidate whose own compute, then own
    rows, with that floor cannot beat the best is not priced further."""
    graph, plan = rows.graph, rows.plan
    op = graph.ops[unit[0]]
    current = plan[op.name]
    touched = sorted({j for i in unit for j in rows.touched[i]})
    others = [j for j in touched if j not in unit]
    before = sum(rows.current(j) for j in touched)
    best, best_cost = current, before - 1e-12 * max(abs(before), 1e-300)
    floor = sum(rows.compute(j, plan[graph.ops[j].name]) for j in others)
    for strategy in _neighbours(rows, unit[0], weights):
        if sum(rows.compute(i, strategy) for i in unit) + floor >= best_cost:
            continue
        for i in unit:
            rows.set(i, strategy)
        own = sum(rows.row(i) for i in unit)
        if own + floor >= best_cost:
            continue
        cost = own + sum(rows.row(j) for j in others)
        if cost < best_cost:
            best, best_cost = strategy, cost
    for i in unit:
        rows.set(i, best)
        if best != current:
            rows.moved(i)
    return best != current


def _pair_pass(
    rows: _Rows,
    twins: Mapping[int, int],
    frozen: Collection[int],
    tied: bool = True,
    near: Collection[int] | None = None,
    compound: bool = False,
) -> bool:
    """`_pair_moves` of every op in graph order, then `_tail_move`, `runs.run_moves`,
    `runs.split_runs`, (`compound`) `compound.compound_runs`, `streams.stream_moves` and (`tied`)
    `tied.tied_moves`, each tied move
    settled by the rest of the polish around it; whether one moved. `near`: the ops the moves
    start from (None: all, and the tail move)."""
    ops = range(len(rows.graph.ops)) if near is None else sorted(near)
    tried = rows.pairs_tried.setdefault(stops(twins, frozen), {})
    paired = any([_pair_moves(rows, i, twins, frozen, tried) for i in ops])
    paired |= _weight_moves(rows, ops, twins, frozen)
    tail = _tail_move(rows, twins, frozen) if near is None else False
    runs = run_moves(rows, twins, frozen, near)
    split = split_runs(rows, twins, frozen, near)
    if compound:
        split |= compound_runs(rows, twins, frozen, near)
    split |= stream_moves(rows, twins, frozen, near)
    if not tied:
        return split or runs or tail or paired

    def settle(moved: _Rows, around: Collection[int]) -> None:
        _polished(moved, twins, frozen, pairs=True, tied=False, settled=False, near=around)

    return tied_moves(rows, twins, frozen, settle) or split or runs or tail or paired


def _weight_moves(
    rows: _Rows, ops: Sequence[int], twins: Mapping[int, int], frozen: Collection[int]
) -> bool:
    """Each op of `ops` that reads a weight: its best single move among no cut and the cuts
    that split a weight, in the rounds where its neighbours all agree with a cut that leaves a
    weight whole (`_neighbours(weights=True)`); whether one moved. Once per final pass, not per
    sweep: a data-parallel plan has such a round for every weight, each costing a move's price."""
    graph, moved = rows.graph, False
    n = len(graph.ops)
    for i in ops:
        if twins.get(i, n) < i or i in frozen or not _weight_cuts(graph, graph.ops[i]):
            continue
        if rows.current(i) <= rows.compute(i, rows.plan[graph.ops[i].name]):
            continue  # its row pays no collective: no gradient sum to save
        moved |= _best_move(rows, [i, twins[i]] if i in twins else [i], weights=True)
    return moved


def _tail_move(rows: _Rows, twins: Mapping[int, int], frozen: Collection[int]) -> bool:
    """Replicate the graph's last ops in every round, the run of them that lowers the total
    most, if one does: where weights are large and activations small (a CNN's last stage) their
    gradients' all-reduces cost more than the whole compute, which no op alone can drop (it
    would gather its input and scatter its output). Ops from the end backwards, cumulatively,
    each step re-pricing the rows the op reaches; stopped at a pinned op or a folded twin, or
    when even dropping every earlier row's collectives could not beat the best run. O(ops)."""
    graph, plan, n = rows.graph, rows.plan, len(rows.graph.ops)
    none = (None,) * len(rows.mesh.rounds)
    original = {i: plan[op.name] for i, op in enumerate(graph.ops)}
    # what the earlier rows pay beyond their compute: the most a longer run could still save
    paid = [rows.current(j) - rows.compute(j, original[j]) for j in range(n)]
    saveable = [0.0] * (n + 1)
    for j in range(n):
        saveable[j + 1] = saveable[j] + max(paid[j], 0.0)
    trial = Trial(rows)
    best, best_len = 0.0, 0
    for k in range(n - 1, -1, -1):
        if k in frozen or k in twins or trial.delta - saveable[k + 1] - trial.left >= best:
            break
        if original[k] == none:
            continue
        if not valid(rows, k, none):
            break
        trial.move(k, none)
        if trial.beats(best):
            best, best_len = trial.delta, len(trial.changed)
    return trial.keep(best_len)


def _pair_moves(
    rows: _Rows,
    i: int,
    twins: Mapping[int, int],
    frozen: Collection[int],
    tried: dict[tuple[int, ...], tuple[Strategy, ...]],
) -> bool:
    """Op i with each reader j of its results: where both cut a tensor axis a of the result in
    some rounds, both cut another axis b there instead (`_swapped`), kept when the total falls.
    Single moves miss it when each half alone adds a redistribution the pair removes (an
    embedding lookup and the add reading it leave the batch for the hidden dim together, its
    table's gradient no longer all-reduced). Twins (`polish`) move with their twins. `tried`:
    per pair that moved nothing, the strategies of the ops its rows read (`_pair_reads`) then:
    while they hold, trying it again prices the same rows alike and is skipped."""
    graph, plan = rows.graph, rows.plan
    n = len(graph.ops)
    if twins.get(i, n) < i or i in frozen:
        return False
    moved = False
    op = graph.ops[i]
    for pos, name in enumerate(op.outputs):
        for j, k in graph.consumers.get(name, ()):
            if j in frozen or (i in twins) != (j in twins) or twins.get(j, n) < j:
                continue
            if not _pays_collectives(rows, (i, j)):
                continue  # nothing for the pair to save: its rows pay compute alone
            seen = tuple(plan[graph.ops[d].name] for d in _pair_reads(rows, i, j, twins))
            if tried.get((i, pos, j, k)) == seen:
                continue
            reader, here = graph.ops[j], False
            mine, theirs = op.signature.outputs[pos], reader.signature.inputs[k]
            for new_i, new_j in _swapped(mine, theirs, plan[op.name], plan[reader.name]):
                here |= _try_pair(rows, (i, j), (new_i, new_j), twins)
            if here:
                moved = True
            else:
                tried[i, pos, j, k] = seen
    return moved


def _pair_reads(rows: _Rows, i: int, j: int, twins: Mapping[int, int]) -> tuple[int, ...]:
    """The ops whose strategies the rows a move of i and j (and their twins) reaches read
    (`runs.row_reads`), kept per graph."""
    units = (i, j, *(twins[u] for u in (i, j) if u in twins))
    reads = rows.cache.memo.setdefault("pair reads", {})
    found = reads.get(units)
    if found is None:
        found = reads[units] = tuple(row_reads(rows, {t for u in units for t in rows.touched[u]}))
    return found  # type: ignore[no-any-return]


def _pays_collectives(rows: _Rows, pair: tuple[int, int]) -> bool:
    """Whether a row the pair's strategies reach pays collectives or redistributions (its
    value above its compute): what a pair move is for."""
    plan, ops = rows.plan, rows.graph.ops
    touched = {j for i in pair for j in rows.touched[i]}
    return any(rows.current(j) > rows.compute(j, plan[ops[j].name]) for j in touched)


def _swapped(
    mine: Sequence[Sequence[str]],
    theirs: Sequence[Sequence[str]],
    cuts_i: Strategy,
    cuts_j: Strategy,
) -> list[tuple[Strategy, Strategy]]:
    """Strategy pairs of the writer and reader of one tensor (its axes' loop dims `mine` and
    `theirs`) cutting an axis b neither cuts yet: in every round where both cut axis a, or in
    every round where both cut nothing, or both (axes of one loop dim on each side)."""
    if len(mine) != len(theirs):
        return []  # the two sides see the tensor with other ranks: no axis to match
    axes = [  # the tensor's axes each side reads through one loop dim (not a flattened group)
        (m[0], t[0]) for m, t in zip(mine, theirs, strict=True) if len(m) == 1 and len(t) == 1
    ]
    both = list(zip(cuts_i, cuts_j, strict=True))
    idle = [r for r, (c, d) in enumerate(both) if c is None and d is None]
    out = []
    for b_i, b_j in axes:
        if b_i in cuts_i or b_j in cuts_j:
            continue  # an axis already cut in another round: its extent may not allow more
        sets: list[list[int]] = []
        for a_i, a_j in axes:
            rounds = [r for r, (c, d) in enumerate(both) if c == a_i and d == a_j]
            if a_i != b_i and a_j != b_j and rounds:
                sets += [rounds, sorted(rounds + idle)] if idle else [rounds]
        sets += [idle] if idle else []
        for rounds in dict.fromkeys(map(tuple, sets)):  # each set of rounds once, in order
            new_i = tuple(b_i if r in rounds else c for r, c in enumerate(cuts_i))
            new_j = tuple(b_j if r in rounds else c for r, c in enumerate(cuts_j))
            out.append((new_i, new_j))
    return out


def _try_pair(
    rows: _Rows, pair: tuple[int, int], moves: tuple[Strategy, Strategy], twins: Mapping[int, int]
) -> bool:
    """Set both ops of `pair` (and their twins) to `moves` when valid and the total falls."""
    graph, plan = rows.graph, rows.plan
    units = [(i, s) for i, s in zip(pair, moves, strict=True)]
    units += [(twins[i], s) for i, s in units if i in twins]
    if not all(valid(rows, i, strategy) for i, strategy in units):
        return False
    touched = sorted({j for i, _ in units for j in rows.touched[i]})
    before = sum(rows.current(j) for j in touched)
    moving = {i for i, _ in units}
    # a row costs at least its compute, which only the moving ops' own strategies change
    floor = sum(rows.compute(i, s) for i, s in units)
    floor += sum(rows.compute(j, plan[graph.ops[j].name]) for j in touched if j not in moving)
    if floor >= before:
        return False
    old = [(i, plan[graph.ops[i].name]) for i, _ in units]
    for i, strategy in units:
        rows.set(i, strategy)
    after = sum(rows.row(j) for j in touched)
    keep = after < before - 1e-12 * max(abs(before), 1e-300)
    for i, strategy in units if keep else old:
        rows.set(i, strategy)
        if keep:
            rows.moved(i)
    return keep


def _neighbours(rows: _Rows, i: int, weights: bool = False) -> list[Strategy]:
    """Valid strategies one round's cut away from op i's: in round r, no cut, or a cut that
    splits some operand as its producer, parameter home or a reader splits it in round r (the
    layouts a move could agree with; any other cut only adds a redistribution). `weights`:
    instead, in the rounds where every neighbour agrees and the cut leaves a weight whole, no
    cut and the cuts that split a weight (`_weight_moves`)."""
    graph, cache, op = rows.graph, rows.cache, rows.graph.ops[i]
    current = rows.plan[op.name]
    sig = op.signature
    sides: list[tuple[Layout, object, bool]] = []  # (neighbour layout, operand dims, output?)
    for pos, name in enumerate(op.inputs):
        src = rows.out.get(name) or rows.homes.get(name)
        if src is not None:
            sides.append((src, sig.inputs[pos], False))
    for pos, name in enumerate(op.outputs):
        for j, k in graph.consumers.get(name, ()):
            reader = graph.ops[j]
            layout = cache.layouts(reader, cache.classes[j], rows.plan[reader.name])[0][k]
            sides.append((layout, sig.outputs[pos], True))
    dims = [None, *(d.name for d in sig.loop_dims)]
    reducing = {d.name for d in sig.loop_dims if d.kind is DimKind.REDUCE}
    splits, rounds = _weight_cuts(graph, op) if weights else [], rows.mesh.rounds
    # each cut's layout of each side, in any round: a cut lays an operand out alike every round
    mine = {cut: [_layout(op, cut, side) for side in sides] for cut in {*dims, *current}}
    out = []
    alike: set[tuple[object, ...]] = set()  # `weights`: rounds alike to one tried already
    for r in range(len(current)):
        now = mine[current[r]]
        # the sides the current cut disagrees with in round r (their layout): a move must agree
        # with one of them
        off = [(k, side[0][r]) for k, side in enumerate(sides) if now[k] != side[0][r]]
        if weights:  # all agree, and a weight the cut leaves whole has its gradient summed
            summed = current[r] is not None and any(current[r] not in w for w in splits)
            same = (rounds[r].mesh_axis, rounds[r].q, current[r], *(t[0][r] for t in sides))
            if off or not summed or same in alike:
                continue  # rounds alike in axis, ways and layouts: their moves price alike
            alike.add(same)
            tried = [None, *sorted(set().union(*splits) - {current[r]})]
        elif off:
            tried = dims
        elif current[r] in reducing:  # all agree: a reduction cut may still not pay its
            tried = [None]  # all-reduce (no cut: the input gathered, the compute whole instead)
        else:
            continue
        for cut in tried:
            if cut == current[r] or (off and not any(mine[cut][k] == t for k, t in off)):
                continue  # agrees with no neighbour the current cut disagrees with
            strategy = (*current[:r], cut, *current[r + 1 :])
            if valid(rows, i, strategy):
                out.append(strategy)
    return out


def _weight_cuts(graph: Graph, op) -> list[set[str]]:
    """Per parameter op reads, the loop dims that split it."""
    out = []
    for pos, name in enumerate(op.inputs):
        if graph.tensors[name].role is Role.PARAMETER:
            out.append({d for axis in op.signature.inputs[pos] for d in axis})
    return out


def _layout(op, cut: str | None, side: tuple[Layout, object, bool]) -> int:
    """The layout `cut` leaves the operand of `side` in, in one round (partial sums: replicated);
    a move agrees with the neighbour in round r when it equals the neighbour's layout there."""
    _, dims, is_output = side
    mine = layout_of_cut(dims, cut, is_output, op)
    return REPLICATED if mine == PARTIAL else mine


def plan_score(
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    memory_lambda: float,
    fold: Any,
    cache: Any,
    strategies: dict[str, Strategy],
) -> float:
    """cost + lambda * memory of a plan of `graph` (of the full graph when `fold`, a `Fold` of
    it, is given): what the variants' plans, polished or not, are compared by."""
    if fold is not None:
        return fold.score(mesh, strategies, opts, memory_lambda, cache)
    cost = evaluate_strategies(graph, mesh, strategies, opts, cache=cache)
    return cost.total + memory_lambda * cost.memory_per_device


def polished_if_lower(
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    memory_lambda: float,
    fold: Any,
    cache: Any,
    best: dict[str, Strategy],
    best_score: float | None,
    candidate: dict[str, Strategy],
    frozen: Collection[int] | None = None,
    pairs: bool = False,
    compound: bool = False,
) -> dict[str, Strategy]:
    """`candidate` (another search's plan, in `mesh`'s rounds) polished on `mesh` (`pairs`: with
    pair and tail moves too) when it then scores lower than `best` (scored `best_score`; None:
    scored here if need be), else `best`; `best` too when the polish leaves `fold`'s interior
    non-uniform. The other searches' plans (`submesh.py`, `roundorder.py`) compete with the
    variants' best this way, and `pair_polished`'s plan with the plan it started from."""
    weights = fold.round_weights() if fold is not None else None
    twins = fold.twins() if fold is not None else None
    candidate = polish(
        graph, mesh, candidate, cache, weights, twins, frozen, pairs=pairs, compound=compound
    )
    if candidate == best or (fold is not None and not fold.uniform(candidate)):
        return best
    if best_score is None:
        best_score = plan_score(graph, mesh, opts, memory_lambda, fold, cache, best)
    score = plan_score(graph, mesh, opts, memory_lambda, fold, cache, candidate)
    return candidate if score < best_score * (1 - 1e-12) and not math.isnan(score) else best


def pair_polished(
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    memory_lambda: float,
    fold: Any,
    cache: ScoreCache | None,
    plan: dict[str, Strategy],
    frozen: Collection[int] | None = None,
) -> dict[str, Strategy]:
    """The search's final plan with pair and tail moves too (`polish(pairs=True)`), once per
    search rather than per variant (they cost about what the single moves cost), kept when it
    scores lower (cost + lambda * memory; the polish prices time alone) and leaves `fold`'s
    interior uniform (`polished_if_lower`)."""
    cache = cache if cache is not None else ScoreCache(graph, mesh, opts)
    args = (graph, mesh, opts, memory_lambda, fold, cache, plan, None, plan, frozen)
    return polished_if_lower(*args, pairs=True, compound=True)
