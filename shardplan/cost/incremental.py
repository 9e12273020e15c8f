"""A plan's placement and rows from the last plan its cache placed, where few ops differ.

Sibling plans of one graph are scored one after another (the training-step search prices a
Megatron plan, its sequence-parallel twin and its expert- and context-parallel variants on each
sub-graph; D-Rec's polish scores plans a few moves apart). A row of the evaluator
(`rows.op_rows`) reads its op's strategy and those of the ops its operands come from (their
producers' result layouts, a parameter's first reader, the tensor's previous reader for share
credits); so when only ops C changed, every row outside `row_readers` of C is the last plan's,
bit for bit. `placed_since` takes the last placement (kept on the `ScoreCache`), re-prices and
checks the ops of C, updates the layouts they leave, and names the rows to recompute; the
caller sums all rows in op order as before, so the breakdown equals a full evaluation's exactly.
Without ZeRO storage (its collectives read every parameter) and when over `SHARE` of the ops
changed, the caller places the plan whole. O(ops) to compare plus O(rows reached).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardplan.cost.price import OpPrice
from shardplan.cost.rows import Rows
from shardplan.cost.zero import param_reads
from shardplan.ir.graph import Graph
from shardplan.sharding import Layout, Strategy, check_strategies

if TYPE_CHECKING:  # the cache's class lives with the evaluator, which imports this module
    from shardplan.cost.evaluate import ScoreCache

SHARE = 0.5
"""Placed from the last plan when at most this share of the ops changed (else whole: the
comparison and the copies would cost what they save)."""


@dataclass(frozen=True, slots=True)
class Placement:
    """A placed plan (`evaluate._placed`) and its rows: what the next plan starts from."""

    strategies: dict[str, Strategy]
    prices: list[OpPrice]
    homes: dict[str, Layout]
    out_layout: dict[str, Layout]
    rows: Rows


def graph_readers(cache: ScoreCache) -> tuple[list[list[int]], dict[str, tuple[int, int]]]:
    """The cache's graph's `row_readers` and `first_reads`, kept in its memo (the graph's alone:
    shared by the incremental placement and D-Rec's polish, `search.drec.polish`)."""
    found = cache.memo.get("row readers")
    if found is None:
        first = first_reads(cache.graph)
        found = cache.memo["row readers"] = (row_readers(cache.graph, first), first)
    return found  # type: ignore[no-any-return]


def row_readers(
    graph: Graph, first: Mapping[str, tuple[int, int]] | None = None
) -> list[list[int]]:
    """Per op i, the rows that read its strategy: its own, its results' readers, the next
    reader of each of its operands (share credits) and, for a parameter it reads first, every
    reader of that parameter (its home is i's layout); `first`: `first_reads(graph)` when
    known."""
    first = first_reads(graph) if first is None else first
    out = []
    for index, op in enumerate(graph.ops):
        rows = {index}
        rows.update(w for t in op.outputs for w, _ in graph.consumers.get(t, ()))
        for pos, name in enumerate(op.inputs):
            users = graph.consumers.get(name, ())
            k = users.index((index, pos))
            if k + 1 < len(users):
                rows.add(users[k + 1][0])
            if first.get(name, (None,))[0] == index:
                rows.update(w for w, _ in users)
        out.append(sorted(rows))
    return out


def first_reads(graph: Graph) -> dict[str, tuple[int, int]]:
    """Per parameter, its first read (op index, operand position): whose layout is its home
    (`evaluate.param_homes`)."""
    first: dict[str, tuple[int, int]] = {}
    for index, pos, name in param_reads(graph):
        first.setdefault(name, (index, pos))
    return first


def placed_since(
    last: Placement, strategies: Mapping[str, Strategy], cache: ScoreCache
) -> tuple[dict[str, Strategy], list[OpPrice], dict[str, Layout], dict[str, Layout], list[int]]:
    """The placement of `strategies` (tuples, as `evaluate._placed` makes them) from `last`,
    and the rows to recompute, in op order; ValueError when too many ops changed (the caller
    places the plan whole). Raises PlanError for an invalid changed op, as a whole check would
    for the first invalid op (the unchanged ones passed it)."""
    graph = cache.graph
    ops, before = graph.ops, last.strategies
    new = {name: tuple(s) for name, s in strategies.items()}
    try:
        changed = [i for i, op in enumerate(ops) if new[op.name] != before[op.name]]
    except KeyError:  # an op without a strategy: the whole placement names it
        raise ValueError("an op has no strategy: place the plan whole") from None
    if len(changed) > SHARE * len(ops) or len(new) != len(before):
        raise ValueError("too many ops changed: place the plan whole")
    classes = cache.classes
    moved = [ops[i] for i in changed]
    check_strategies(moved, new, cache.mesh.rounds, [classes[i] for i in changed], cache.valid)
    readers, first = graph_readers(cache)
    prices = list(last.prices)
    homes, out_layout = dict(last.homes), dict(last.out_layout)
    rows: set[int] = set()
    for i, op in zip(changed, moved, strict=True):
        price = prices[i] = cache.price(op, classes[i], new[op.name])
        out_layout.update(zip(op.outputs, price.resolved, strict=True))
        for pos, name in enumerate(op.inputs):
            if first.get(name) == (i, pos):  # its home: the first reader's first operand
                homes[name] = price.inputs[pos]
        rows.update(readers[i])
    return new, prices, homes, out_layout, sorted(rows)


__all__ = ["SHARE", "Placement", "first_reads", "graph_readers", "placed_since", "row_readers"]
