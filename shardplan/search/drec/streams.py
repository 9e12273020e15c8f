"""Stream moves of D-Rec's exact polish (`polish.py`): one round dropped on a stream of ops.

A stream of round r: the transparent ops (`flex.is_transparent`: every loop dim parallel or
frozen, an element-wise op or a norm) cut in round r that pass tensors to one another split
along the same tensor dim in r on both sides (no redistribution between them there), found by a
union of those edges, and kept when a tensor entering or leaving it changes its layout in round
r. A residual stream split along the hidden units is one: every attention projection's bias,
residual add and shared-expert add, each norm reading it gathering it again (a norm normalises
over the hidden units). No single, pair or run move reaches the plan that keeps the stream whole
in r: each op alone re-splits and gathers on its sides, and the stream's ops are not consecutive
(attention and the experts keep their cuts in between). Each stream of three ops or more has
round r dropped op by op (graph order), priced cumulatively by the evaluator's rows
(`runs.Trial`), a folded twin moving with its op; the prefix that lowers the total most is kept.
Not tried when the compute it adds reaches what the rows it reaches could save (`_paid`), nor
again while nothing its rows read has moved (`_reads`). DeepSeek-MoE-shaped, 3 layers, batch
24, on 2 x 2 x 3 (`benchmarks/quality_random.py --axes 3`, seed 11): D-Rec split the residual
stream along the hidden units over both axes of 2, paying an all-gather at every norm; 1.121 ->
1.061 of the ILP optimum. O(rounds x operands) to find the streams, one trial per stream.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from shardplan.search.drec.flex import is_transparent
from shardplan.search.drec.runs import Trial, row_reads, valid

if TYPE_CHECKING:
    from shardplan.search.drec.polish import _Rows

MIN_STREAM = 3
"""Ops a stream needs: an op and one reader leaving a round together is a pair move."""


def stream_moves(
    rows: _Rows,
    twins: Mapping[int, int],
    frozen: Collection[int],
    near: Collection[int] | None = None,
) -> bool:
    """Drop round r on each stream of round r (module docstring), round by round, when a
    prefix of it lowers the total; whether one did. `near`: the ops a stream must hold one of
    (None: any)."""
    moved = False
    wanted = _wanted(rows)
    for r in range(len(rows.mesh.rounds)):
        for stream in _streams(rows, r, frozen, wanted):
            if near is not None and not any(i in near for i in stream):
                continue
            # a stream tried before, none of the ops its rows read moved since: the same trial
            key = (r, tuple(stream))
            seen = _reads(rows, stream, twins)
            if rows.streams_tried.get(key) == seen:
                continue
            if _best_prefix(rows, stream, r, twins):
                moved, wanted = True, _wanted(rows)
            else:
                rows.streams_tried[key] = seen
    return moved


def _reads(rows: _Rows, stream: list[int], twins: Mapping[int, int]) -> tuple[object, ...]:
    """The strategies of every op the rows a move of `stream` re-prices read (`runs.row_reads`)."""
    moving = (*stream, *(twins[i] for i in stream if i in twins))
    ops = row_reads(rows, {j for i in moving for j in rows.touched[i]})
    return tuple(rows.plan[rows.graph.ops[k].name] for k in ops)


def _wanted(rows: _Rows) -> list[Any]:
    """Per op, the layouts its strategy wants its operands in."""
    plan, cache = rows.plan, rows.cache
    return [
        cache.price(op, cache.classes[i], plan[op.name]).inputs
        for i, op in enumerate(rows.graph.ops)
    ]


def _streams(rows: _Rows, r: int, frozen: Collection[int], wanted: list[Any]) -> list[list[int]]:
    """The streams of round r under the current plan (ops in graph order), of `MIN_STREAM`
    ops or more, pinned ops left out, that redistribute in round r where a tensor enters or
    leaves them (a norm gathering the stream): a stream whose neighbours take its layout there
    as it is has nothing to drop in round r but its own collectives. `wanted`: `_wanted`."""
    graph, plan = rows.graph, rows.plan
    parent = list(range(len(graph.ops)))
    light = rows.cache.memo.get("transparent")  # the graph's alone
    if light is None:
        light = rows.cache.memo["transparent"] = [is_transparent(op) for op in graph.ops]

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for c, op in enumerate(graph.ops):
        if not light[c] or plan[op.name][r] is None or c in frozen:
            continue
        for pos, name in enumerate(op.inputs):
            p = graph.producer.get(name)
            if p is None or p in frozen or plan[graph.ops[p].name][r] is None:
                continue
            split = rows.out[name][r]
            if light[p] and split >= 0 and split == wanted[c][pos][r]:
                parent[root(p)] = root(c)
    groups: dict[int, list[int]] = {}
    for i in range(len(graph.ops)):
        groups.setdefault(root(i), []).append(i)
    return [
        g
        for g in groups.values()
        if len(g) >= MIN_STREAM and _redistributes(rows, set(g), r, wanted)
    ]


def _redistributes(rows: _Rows, group: set[int], r: int, wanted: list[Any]) -> bool:
    """Whether a tensor an op of `group` reads from, or writes to, an op outside it changes
    its layout in round r on the way."""
    graph = rows.graph
    for c in group:
        op = graph.ops[c]
        for pos, name in enumerate(op.inputs):
            p = graph.producer.get(name)
            if p is not None and p not in group and rows.out[name][r] != wanted[c][pos][r]:
                return True
        for name in op.outputs:
            for w, pos in graph.consumers.get(name, ()):
                if w not in group and rows.out[name][r] != wanted[w][pos][r]:
                    return True
    return False


def _best_prefix(rows: _Rows, stream: list[int], r: int, twins: Mapping[int, int]) -> bool:
    """Round r dropped on `stream`'s ops in graph order, each folded twin with its op; the
    prefix lowering the total most kept (none when no prefix lowers it). Whether one was. Not
    tried, or stopped, when the compute added so far reaches what the rows not reached yet
    and the collectives left on those reached could still save (`_paid`)."""
    plan, ops = rows.plan, rows.graph.ops
    added, paid = _paid(rows, stream, r, twins)
    unreached = sum(paid.values())
    if added >= unreached:
        return False
    trial = Trial(rows)
    best, best_len = 0.0, 0
    for i in stream:
        current = plan[ops[i].name]
        if current[r] is None:
            continue  # a twin moved it already
        strategy = (*current[:r], None, *current[r + 1 :])
        if not valid(rows, i, strategy):
            break
        for j in (i, twins[i]) if i in twins else (i,):
            trial.move(j, strategy)
            for k in rows.touched[j]:
                unreached -= paid.pop(k, 0.0)
        if trial.beats(best):
            best, best_len = trial.delta, len(trial.changed)
        elif trial.delta - unreached - trial.left >= best:
            break
    return trial.keep(best_len)


def _paid(
    rows: _Rows, stream: list[int], r: int, twins: Mapping[int, int]
) -> tuple[float, dict[int, float]]:
    """The compute dropping round r on the whole stream adds (each op's piece grows), and per
    row it reaches the most it could save there: a moved op's row, all it pays beyond its
    compute; another row, what it pays to redistribute (its own collectives do not read the
    moved ops' cuts, unless a share credit does: then all it pays beyond its compute). No row
    is priced again."""
    plan, ops, touched, cache = rows.plan, rows.graph.ops, rows.touched, rows.cache
    moving = set(stream) | {twins[i] for i in stream if i in twins}
    added = 0.0
    for i in moving:
        current = plan[ops[i].name]
        dropped = (*current[:r], None, *current[r + 1 :])
        added += rows.compute(i, dropped) - rows.compute(i, current)
    paid: dict[int, float] = {}
    shared = cache.has_previous()
    for j in {j for i in moving for j in touched[i]}:
        strategy = plan[ops[j].name]
        beyond = rows.current(j) - rows.compute(j, strategy)
        if j not in moving and not shared[j]:  # a share credit could lower its own terms
            own = cache.price(ops[j], cache.classes[j], strategy).intra.total
            beyond -= own * rows.weights[j] if rows.weights is not None else own
        paid[j] = max(beyond, 0.0)
    return added, paid


__all__ = ["MIN_STREAM", "stream_moves"]
