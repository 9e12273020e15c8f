"""The strategy space the exact searches (ILP, DP) explore: every valid strategy of every op.

A strategy gives each round of the mesh one loop dim to cut q ways, or None (replicate). The
space of one op is every tuple in (splittable loop dims + [None]) ** rounds that `cut_problem`
accepts: the loop dim is not FROZEN, it is the major loop dim of every tensor group it appears
in, and its extent (and a WINDOW dim's input span), already divided by the cuts of earlier rounds,
is divisible by the round's q.
Enumeration is deterministic: depth first over the rounds, candidates in the signature's loop-dim
order, then None; so "all None" is the last strategy. With d candidates and R rounds an op has up
to (d + 1) ** R strategies (e.g. 5 ** 5 = 3125 for a linear layer on a 4x8 mesh): this is what
makes the exact methods exponential in the number of rounds, where D-Rec makes d + 1 choices per
round.

`count_strategies` counts without enumerating (memoised on the remaining extents), so callers can
refuse a space that is too large before building it. No ops are merged: every op keeps its own
variables, which keeps the exact objective identical to the evaluator's.

The pairwise cost model both exact methods optimise over this space is `model.build_model`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from shardplan.errors import SolverError
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op
from shardplan.mesh import Mesh, Round
from shardplan.sharding import Strategy, cut_problem


def candidate_dims(op: Op) -> tuple[str, ...]:
    """Loop dims that may ever be cut: splittable and never a minor dim of a tensor group."""
    out = []
    for d in op.signature.loop_dims:
        if cut_problem(op, d.name, d.extent, 1) is None:  # q = 1: only the structural checks
            out.append(d.name)
    return tuple(out)


def op_strategies(op: Op, rounds: Sequence[Round]) -> tuple[Strategy, ...]:
    """Every valid strategy of `op` on `rounds`, in the deterministic order of the module doc."""
    dims = candidate_dims(op)
    out: list[Strategy] = []
    prefix: list[str | None] = []
    extents = op.signature.extents

    def walk(r: int) -> None:
        if r == len(rounds):
            out.append(tuple(prefix))
            return
        q = rounds[r].q
        for d in dims:
            if cut_problem(op, d, extents[d], q) is None:  # the one validity rule
                extents[d] //= q
                prefix.append(d)
                walk(r + 1)
                prefix.pop()
                extents[d] *= q
        prefix.append(None)
        walk(r + 1)
        prefix.pop()

    walk(0)
    return tuple(out)


def count_strategies(op: Op, rounds: Sequence[Round]) -> int:
    """len(op_strategies(op, rounds)) without building the tuples."""
    dims = candidate_dims(op)
    memo: dict[tuple[int, tuple[int, ...]], int] = {}

    def count(r: int, ext: tuple[int, ...]) -> int:
        if r == len(rounds):
            return 1
        key = (r, ext)
        if key in memo:
            return memo[key]
        q = rounds[r].q
        n = count(r + 1, ext)
        for i, e in enumerate(ext):
            if cut_problem(op, dims[i], e, q) is None:  # the one validity rule
                n += count(r + 1, ext[:i] + (e // q,) + ext[i + 1 :])
        memo[key] = n
        return n

    extents = op.signature.extents
    return count(0, tuple(extents[d] for d in dims))


@dataclass(frozen=True, slots=True)
class StrategySpace:
    """The strategies of every op of `graph` on `mesh` (index-aligned with graph.ops)."""

    graph: Graph
    mesh: Mesh
    strategies: tuple[tuple[Strategy, ...], ...]

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(len(s) for s in self.strategies)

    @property
    def total(self) -> int:
        return sum(self.sizes)

    def of(self, op_name: str) -> tuple[Strategy, ...]:
        return self.strategies[self.graph.op_index[op_name]]


def build_space(
    graph: Graph,
    mesh: Mesh,
    max_strategies: int | None = None,
    deadline: float | None = None,
    method: str = "search",
    time_limit: float | None = None,
) -> StrategySpace:
    """Enumerate every op's strategies; raise SolverError when the space exceeds
    `max_strategies` in all (counted first, so nothing large is built) or `deadline`
    (a `time.perf_counter()` value) passes."""
    rounds = mesh.rounds
    if max_strategies is not None:
        total = 0
        for op in graph.ops:
            total += count_strategies(op, rounds)
            if total > max_strategies:
                raise SolverError(
                    f"{method} did not finish: the strategy space of {graph.name!r} on mesh "
                    f"{mesh.text()} "
                    f"({len(rounds)} rounds) has more than {max_strategies:,} strategies in all "
                    f"(op {op.name!r} alone has {count_strategies(op, rounds)}); the exact "
                    "methods grow as (dims + 1) ** rounds per op: use drec, or fewer devices"
                )
    out = []
    for op in graph.ops:
        if deadline is not None and time.perf_counter() > deadline:
            limit = "the time limit" if time_limit is None else f"{time_limit:g} s"
            raise SolverError(f"{method} did not finish within {limit} (enumerating strategies)")
        out.append(op_strategies(op, rounds))
    for op, strategies in zip(graph.ops, out, strict=True):
        if not strategies:  # pragma: no cover - "all None" is always valid
            raise SolverError(f"op {op.name!r} has no valid strategy")
    return StrategySpace(graph, mesh, tuple(out))
