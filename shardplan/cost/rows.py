"""The evaluator's rows: per op its compute, own collectives and incoming redistributions.

`op_rows` walks the ops once in graph order (`evaluate.op_terms`' walk inlined): an op's own
terms are its class's price (`ScoreCache.price`) plus the share credits of the operands it reads
after another reader of the same tensor (`credited`), its redistribution the moves of its
operands from their producers' layouts or parameter homes (and a parameter's ZeRO collectives on
its first reader's row). Each op's fields are kept, and `field_sums` adds them field by field in
op order, `comm + intra + redistribution` per op: the same additions in the same order as adding
the ops' CommTerms, so a field's sum does not depend on the others'.
`repeated` gives the rows of a larger graph whose ops each repeat an op of this one, in its own
op order (the interior of a fold of repeated blocks, `search.drec.fold`): the same rows, renamed,
summed by the same additions, so the breakdown equals the larger graph's own evaluation.
O(operands); `repeated` O(ops of the larger graph).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardplan.cost.price import OpPrice
from shardplan.cost.terms import ZERO, CommTerms
from shardplan.ir.op import Op
from shardplan.sharding import Layout, Strategy

if TYPE_CHECKING:  # the cache's class lives with the evaluator, which imports this module
    from shardplan.cost.evaluate import ScoreCache


@dataclass(frozen=True, slots=True)
class OpCost:
    """One row of the breakdown: an op's compute, its own comm and its incoming redistribution."""

    name: str
    compute: float
    intra: float
    redistribution: float
    activation_bytes: float
    intra_fwd: float = 0.0
    """The forward and backward parts of `intra` (what the step model overlaps)."""
    intra_bwd: float = 0.0

    @property
    def total(self) -> float:
        return self.compute + self.intra + self.redistribution


@dataclass(frozen=True, slots=True)
class Rows:
    """The rows of a plan with, per op, the fields of its own and redistribution terms."""

    ops: tuple[OpCost, ...]
    intra: tuple[tuple[float, ...], ...]
    """Per op, its own terms' fields (`CommTerms.values`), share credits included."""
    redistribution: tuple[tuple[float, ...], ...]

    def compute(self) -> float:
        """The rows' compute, added in op order."""
        total = 0.0
        for row in self.ops:
            total += row.compute
        return total

    def field_sums(self) -> list[float]:
        """Each CommTerms field summed over the ops (module docstring)."""
        comm = [0.0] * len(ZERO.values())
        columns = zip(
            zip(*self.intra, strict=True), zip(*self.redistribution, strict=True), strict=False
        )
        for f, (a_col, b_col) in enumerate(columns):
            if not any(a_col) and not any(b_col):
                continue  # every op adds 0.0 (+ -0.0): the sum stays 0.0
            acc = 0.0
            for a, b in zip(a_col, b_col, strict=True):
                acc = acc + a + b
            comm[f] = acc
        return comm

    def repeated(self, stand_in: Sequence[int], names: Sequence[str]) -> Rows:
        """The rows of a graph whose op k (named `names[k]`) repeats this one's `stand_in[k]`."""
        ops, intra, redis = self.ops, self.intra, self.redistribution
        rows = []
        for k, name in zip(stand_in, names, strict=True):
            r = ops[k]
            rows.append(
                OpCost(
                    name,
                    r.compute,
                    r.intra,
                    r.redistribution,
                    r.activation_bytes,
                    r.intra_fwd,
                    r.intra_bwd,
                )
            )
        return Rows(
            tuple(rows), tuple(intra[k] for k in stand_in), tuple(redis[k] for k in stand_in)
        )


def op_rows(
    cache: ScoreCache,
    strategies: Mapping[str, Strategy],
    homes: Mapping[str, Layout],
    out_layout: Mapping[str, Layout],
    prices: Sequence[OpPrice],
    by_reader: Mapping[int, CommTerms],
    since: tuple[Rows, Sequence[int]] | None = None,
) -> Rows:
    """The rows of the plan `strategies` of the cache's graph (module docstring); `prices`: per
    op, its price under its strategy; `by_reader`: ZeRO collectives per first reader's index.
    `since`: another plan's rows and the ops whose rows differ (`incremental.placed_since`):
    only those are computed, the others kept."""
    graph = cache.graph
    zero_fields = (ZERO.values(), ZERO.total)
    known: dict[int, tuple[tuple[float, ...], float]] = {id(ZERO): zero_fields}
    ops = graph.ops
    if since is None:
        indices: Sequence[int] = range(len(ops))
        rows: list[OpCost] = [None] * len(ops)  # type: ignore[list-item]
        intras: list[tuple[float, ...]] = [()] * len(ops)
        redises: list[tuple[float, ...]] = [()] * len(ops)
    else:
        indices = since[1]
        base = since[0]
        rows, intras, redises = list(base.ops), list(base.intra), list(base.redistribution)
    sizes = cache.local_bytes
    move, credits = cache.move, cache.has_previous()
    for index in indices:
        op, price = ops[index], prices[index]
        intra = price.intra
        if credits[index]:
            intra = credited(cache, strategies, index, op, intra)
        redis = ZERO
        wanted = price.inputs
        for i, name in enumerate(op.inputs):
            src = out_layout.get(name) or homes.get(name)
            if src is not None and src != wanted[i]:
                redis = redis + move(name, src, wanted[i])
        if index in by_reader:
            redis = redis + by_reader[index]
        # a CommTerms the prices keep (alive, so its id is its own): its fields summed once
        kept = known.get(id(intra)) if intra is price.intra else None
        if kept is None:
            kept = (intra.values(), intra.total)
            if intra is price.intra:
                known[id(intra)] = kept
        intras[index] = kept[0]
        mine = zero_fields if redis is ZERO else (redis.values(), redis.total)
        redises[index] = mine[0]
        outputs = op.outputs
        if len(outputs) == 1:
            act = 0 + sizes(outputs[0], out_layout[outputs[0]])  # as sum() of one value
        else:
            act = sum([sizes(name, out_layout[name]) for name in outputs])
        rows[index] = OpCost(
            op.name, price.compute, kept[1], mine[1], act, intra.intra_fwd, intra.intra_bwd
        )
    return Rows(tuple(rows), tuple(intras), tuple(redises))


def own_and_edges(
    cache: ScoreCache,
    strategies: Mapping[str, Strategy],
    homes: Mapping[str, Layout],
    out_layout: Mapping[str, Layout],
    index: int,
    op: Op,
    price: OpPrice,
) -> tuple[CommTerms, CommTerms]:
    """`OpTerms.intra` and `OpTerms.redistribution` of the `index`-th op (see `op_terms`)."""
    intra, redis = credited(cache, strategies, index, op, price.intra), ZERO
    for i, name in enumerate(op.inputs):
        src = out_layout.get(name) or homes.get(name)
        if src is not None and src != price.inputs[i]:
            redis = redis + cache.move(name, src, price.inputs[i])
    return intra, redis


def credited(
    cache: ScoreCache, strategies: Mapping[str, Strategy], index: int, op: Op, intra: CommTerms
) -> CommTerms:
    """`intra` with the `index`-th op's share credits (`ScoreCache.credit`), in operand order."""
    strategy, cid = strategies[op.name], cache.classes[index]
    for i, (name, prev) in enumerate(zip(op.inputs, cache.previous[index], strict=True)):
        if prev is not None:
            p_op = cache.graph.ops[prev[0]]
            earlier = (p_op, prev[1], strategies[p_op.name])
            intra = intra + cache.credit(name, earlier, (op, i, strategy), cid)
    return intra


__all__ = ["OpCost", "Rows", "credited", "op_rows", "own_and_edges"]
