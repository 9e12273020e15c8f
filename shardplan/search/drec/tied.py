"""Tied-parameter moves of D-Rec's exact polish (`polish.py`): a shared parameter's readers re-cut
together in one round, then the plan around them settled again by the polish's other moves.

A parameter read by several ops (GPT-2's token embedding table, read by the lookup and by the
tied output head) has one gradient: each round where its readers cut dims that do not index it
all-reduces that gradient. Leaving the batch for one of the table's axes pays only when every
reader does so in the same round (the table then stays split alike, its gradient never summed
there), and each reader alone then moves its neighbours' layouts too. So no single, pair or run
move reaches it, and the move itself raises the total until the ops around it follow: GPT-2
small (2 layers, batch 5, sequence 160) on 2x2 had the lookup and the head cut the sequence in
round 0 (1.155 of the ILP optimum); moving both to the hidden axis in that round, then letting
the loss and the head's other round follow, reaches the optimum.

The move (`tied_moves`): for each parameter with two or more readers and each round where
re-cutting them can drop enough to first order (`_first_order`: the gradient's sum over the
round when a reader cuts a dim the parameter lacks, the compute of readers that cut nothing
there; at least `GAIN` of the plan's total), each axis of the parameter every reader can cut
and none: every reader takes that cut in that round, then the rest of the polish (pair, run and
single moves) settles the plan from there. Priced exactly by the evaluator's rows, kept when the
total falls, else undone. Run once per search, on its final plan, with the pair moves. Cost:
O(tied parameters x rounds x (parameter axes + 1)) polishes, gated as said.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING

from shardplan.cost.collectives import all_reduce_s
from shardplan.ir.graph import Graph, Role
from shardplan.mesh import Mesh
from shardplan.search.drec.runs import valid
from shardplan.sharding import Strategy

if TYPE_CHECKING:
    from shardplan.search.drec.polish import _Rows

GAIN = 0.01
"""A round's move is tried only when what it can drop there to first order (`_first_order`: the
parameter's gradient all-reduce, the readers' compute repeated on every device) is at least this
share of the plan's total. Each try settles the whole plan again."""


NEAR = 3
"""The settling after a move tries moves of the ops within this many producer / reader steps of
the moved readers: a tied table's readers sit at the graph's two ends, whose neighbours follow
them; the rest of the plan was settled already."""


def tied_moves(
    rows: _Rows,
    twins: Mapping[int, int],
    frozen: Collection[int],
    settle: Callable[[_Rows, Collection[int]], object],
) -> bool:
    """Every tied-parameter move (module docstring) kept when it lowers the total; whether one
    was. `settle`: the polish's other moves, run from the moved plan until they settle."""
    graph, moved = rows.graph, False
    if not rows.cache.opts.train:
        return False  # no gradient summed: nothing a reader's cut elsewhere pays twice
    total: float | None = None
    # (plan, move) pairs that did not pay, for every polish of this graph: from the same plan
    # the same move settles alike (the pair pass runs again whenever the single moves settle)
    failed = rows.cache.memo.setdefault("tied moves failed", set())
    for name, readers in tied_parameters(graph).items():
        users = graph.consumers[name]
        if any(i in frozen or i in twins for i in readers):
            continue  # pinned, or a weight shared across folded blocks: moved elsewhere
        for r in range(len(rows.mesh.rounds)):
            if all(s[r] is None for s in rows.plan.values()):
                continue  # a round the plan leaves unused: cutting in it is `runs.split_runs`'
            gain = _first_order(rows, name, users, r)
            if not gain:
                continue
            if total is None:
                total = sum(rows.current(j) for j in range(len(graph.ops)))
            if gain < GAIN * total:
                continue  # too little to drop to pay for trying
            for kick in _kicks(rows, name, users, r):
                moved |= _try_kick(rows, kick, settle, failed)
    return moved


def _near(graph: Graph, kick: Mapping[int, Strategy], hops: int) -> set[int]:
    """The ops within `hops` producer / reader steps of the moved ops (them included)."""
    producer = graph.producer
    ball, frontier = set(kick), set(kick)
    for _ in range(hops):
        step: set[int] = set()
        for i in frontier:
            op = graph.ops[i]
            step.update(producer[t] for t in op.inputs if t in producer)
            step.update(j for t in op.outputs for j, _ in graph.consumers.get(t, ()))
        frontier = step - ball
        ball |= frontier
    return ball


def tied_parameters(graph: Graph) -> dict[str, list[int]]:
    """Parameters read by two or more ops, each with its readers (op indices, ascending)."""
    out = {}
    for name, users in graph.consumers.items():
        readers = sorted({i for i, _ in users})
        if len(readers) > 1 and graph.tensors[name].role is Role.PARAMETER:
            out[name] = readers
    return out


def gradient_rounds(
    graph: Graph, mesh: Mesh, plan: Mapping[str, Strategy], name: str
) -> dict[int, float]:
    """Per round where a reader of parameter `name` cuts a dim the parameter lacks (its gradient
    summed over the round's devices), that round's share of the sum, to first order: an
    all-reduce of the parameter's piece as its first reader lays it out, taken hierarchically
    (the fastest links first, each later round summing what the earlier ones left, 1/q of it)."""
    users, rounds, ops = graph.consumers[name], mesh.rounds, graph.ops
    first, first_pos = users[0]
    groups = ops[first].signature.inputs[first_pos]
    home = zip(rounds, plan[ops[first].name], strict=True)
    nbytes = graph.tensors[name].nbytes / math.prod(q.q for q, c in home if _indexes(c, groups))
    summed = [
        r
        for r in range(len(rounds))
        if any(
            plan[ops[i].name][r] is not None
            and not _indexes(plan[ops[i].name][r], ops[i].signature.inputs[pos])
            for i, pos in users
        )
    ]
    return _hierarchical(mesh, nbytes, summed)


def _hierarchical(mesh: Mesh, nbytes: float, summed: list[int]) -> dict[int, float]:
    """Each of rounds `summed`'s share of an all-reduce of `nbytes` over them, fastest first."""
    rounds = mesh.rounds
    out = {}
    for r in sorted(summed, key=lambda r: (-rounds[r].bandwidth_bytes_per_s, r)):
        out[r] = all_reduce_s(nbytes, rounds[r].q, rounds[r].bandwidth_bytes_per_s)
        nbytes /= rounds[r].q
    return out


def whole_sum_s(graph: Graph, mesh: Mesh, name: str) -> float:
    """Seconds summing parameter `name`'s whole gradient over every round (hierarchically, as
    `gradient_rounds`): what a plan cutting its readers elsewhere in every round pays."""
    every = list(range(len(mesh.rounds)))
    return sum(_hierarchical(mesh, graph.tensors[name].nbytes, every).values())


def _indexes(cut: str | None, groups: tuple[tuple[str, ...], ...]) -> bool:
    """Whether loop dim `cut` indexes an operand of tensor dims `groups`."""
    return cut is not None and any(cut in group for group in groups)


def _first_order(rows: _Rows, name: str, users: list[tuple[int, int]], r: int) -> float:
    """What re-cutting the readers of parameter `name` in round r can drop to first order: its
    gradient's sum over the round (`gradient_rounds`) and the compute of the readers that cut
    nothing in it but a 1/q share; 0 when every reader cuts the parameter in round r already."""
    plan, q = rows.plan, rows.mesh.rounds[r].q
    gain = gradient_rounds(rows.graph, rows.mesh, plan, name).get(r, 0.0)
    for i, _ in users:
        current = plan[rows.graph.ops[i].name]
        if current[r] is None:
            gain += rows.compute(i, current) * (1 - 1 / q)
    return gain


def _kicks(
    rows: _Rows, name: str, users: list[tuple[int, int]], r: int
) -> list[dict[int, Strategy]]:
    """The moves of round r for parameter `name` read by `users` ((op, input position)): per
    axis of the parameter, every reader cutting it through a loop dim of its own; and every
    reader cutting nothing."""
    graph, plan = rows.graph, rows.plan
    ops = graph.ops
    rank = len(graph.tensors[name].shape)
    cuts = [  # per reader: the loop dim of each axis of the parameter, or None
        tuple(group[0] if group else None for group in ops[i].signature.inputs[pos])
        for i, pos in users
    ]
    if any(len(c) != rank for c in cuts):
        return []
    out = []
    for axis in [*range(rank), None]:
        kick: dict[int, Strategy] = {}
        for (i, _), dims in zip(users, cuts, strict=True):
            cut = None if axis is None else dims[axis]
            if axis is not None and cut is None:
                break  # a broadcast axis for this reader: no common cut
            current = plan[ops[i].name]
            strategy = (*current[:r], cut, *current[r + 1 :])
            if kick.get(i, strategy) != strategy or not valid(rows, i, strategy):
                break  # one op reading it twice along two axes, or a cut its sizes refuse
            kick[i] = strategy
        else:
            if any(plan[ops[i].name] != s for i, s in kick.items()):
                out.append(kick)
    return out


def _try_kick(
    rows: _Rows,
    kick: dict[int, Strategy],
    settle: Callable[[_Rows, Collection[int]], object],
    failed: set[tuple[object, ...]],
) -> bool:
    """Apply `kick`, let `settle` move the plan from there, keep the result when the total (the
    sum of the rows) fell, else undo every op that moved and remember it in `failed`."""
    graph, plan = rows.graph, rows.plan
    key = (tuple(plan[op.name] for op in graph.ops), tuple(kick.items()))
    if key in failed:
        return False
    snapshot = dict(plan)
    old = sum(rows.current(j) for j in range(len(graph.ops)))
    for i, strategy in kick.items():
        rows.set(i, strategy)
        rows.moved(i)
    settle(rows, _near(rows.graph, kick, NEAR))
    new = sum(rows.current(j) for j in range(len(graph.ops)))
    if new < old - 1e-12 * max(abs(old), 1e-300):
        return True
    for i, op in enumerate(graph.ops):
        if plan[op.name] != snapshot[op.name]:
            rows.set(i, snapshot[op.name])
            rows.moved(i)
    failed.add(key)
    return False


__all__ = ["GAIN", "gradient_rounds", "tied_moves", "whole_sum_s", "tied_parameters"]
