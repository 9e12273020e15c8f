"""The one evaluator: scores any set of strategies (from any method) with the same cost terms.

For every op and round: intra-operator terms of its cut (terms.intra_terms), compute over its cuts;
for every edge (producer -> consumer operand, or a parameter's home layout -> consumer) and round:
redistribution terms. Memory per device: parameters + gradients + optimizer state divided by the
cuts of each parameter's home layout, plus activations kept for backward (training) or the
largest op working set (inference). A ZeRO stage (`CostOptions.zero`, `cost/zero.py`) divides
parameter state further by each parameter's data-parallel group and adds its collectives.
O(rounds * sum of operand counts): linear in the graph.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from dataclasses import replace as dataclass_replace
from typing import Any

from shardplan.cost.classes import op_classes, op_key, previous_consumer, previous_consumers
from shardplan.cost.collectives import CollectiveKind
from shardplan.cost.incremental import Placement, placed_since
from shardplan.cost.memory import memory_per_device
from shardplan.cost.presets import CostOptions
from shardplan.cost.price import (
    OpPrice,
    faster_rounds,
    op_compute,
    operand_infos,
    price_op,
    round_intra,
    shared_intra,
    sum_rounds,
)
from shardplan.cost.rows import OpCost, Rows, credited, op_rows, own_and_edges
from shardplan.cost.terms import (
    ZERO,
    CommTerms,
    edge_redistribution,
    local_bytes,
    reduces,
)
from shardplan.cost.zero import zero_pricing
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role
from shardplan.mesh import Mesh, Round
from shardplan.sharding import (
    Layout,
    Strategy,
    check_strategies,
    operand_layout,
    operand_layouts,
    resolved,
)


@dataclass(frozen=True, slots=True)
class CostBreakdown:
    """Predicted cost of a plan. `units` is "s" (shardplan preset) or "elements" (mindspore)."""

    total: float
    compute: float
    comm: CommTerms
    memory_per_device: float
    param_memory: float
    activation_memory: float
    units: str
    ops: tuple[OpCost, ...]

    def to_dict(self, per_op: bool = False) -> dict[str, object]:
        c = self.comm
        out: dict[str, object] = {
            "units": self.units,
            "total": self.total,
            "compute": self.compute,
            "communication": c.total,
            "intra_fwd": c.intra_fwd,
            "intra_bwd": c.intra_bwd,
            "grad_sync": c.grad_sync,
            "halo": c.halo,
            "redistribution": c.redistribution_fwd + c.redistribution_bwd,
            "redistribution_fwd": c.redistribution_fwd,
            "redistribution_bwd": c.redistribution_bwd,
            "memory_per_device_bytes": self.memory_per_device,
            "param_memory_bytes": self.param_memory,
            "activation_memory_bytes": self.activation_memory,
            "collective_bytes": {
                CollectiveKind.ALL_REDUCE: c.all_reduce_bytes,
                CollectiveKind.ALL_GATHER: c.all_gather_bytes,
                CollectiveKind.ALL_TO_ALL: c.all_to_all_bytes,
                "halo": c.halo_bytes,
                # ZeRO's (cost/zero.py); only when used, so stage-0 breakdowns keep their keys
                **({CollectiveKind.REDUCE_SCATTER: c.reduce_scatter_bytes}
                   if c.reduce_scatter_bytes else {}),
            },
        }
        if per_op:
            out["ops"] = [
                {
                    "name": o.name,
                    "compute": o.compute,
                    "intra": o.intra,
                    "redistribution": o.redistribution,
                }
                for o in self.ops
            ]
        return out


def op_intra(
    graph: Graph,
    op: Op,
    strategy: Strategy,
    rounds: Sequence[Round],
    opts: CostOptions,
    shared: Sequence[tuple[int, int]] = (),
) -> CommTerms:
    """Intra-operator terms of a whole strategy, round by round.

    `shared` lists (input position, round) whose gradient all-reduce another consumer pays.
    """
    fast = faster_rounds(rounds)
    ins_lay, outs_lay = operand_layouts(op, strategy)
    ins = operand_infos(graph, op, strategy, False, rounds, opts, ins_lay, fast)
    for pos, r in shared:
        ins[r][pos] = dataclass_replace(ins[r][pos], grad_shared=True)
    outs = operand_infos(graph, op, strategy, True, rounds, opts, outs_lay, fast)
    return sum_rounds(round_intra(op, strategy, rounds, ins, outs, opts))


def unary_terms(
    graph: Graph, op: Op, strategy: Strategy, mesh: Mesh, opts: CostOptions
) -> tuple[CommTerms, float]:
    """What an op's strategy costs on its own: (intra-operator terms, compute)."""
    price = price_op(graph, op, strategy, mesh, opts)
    return price.intra, price.compute


def edge_terms(
    graph: Graph,
    tensor: str,
    src: Layout,
    dst: Layout,
    rounds: Sequence[Round],
    opts: CostOptions,
    only: int | None = None,
) -> CommTerms:
    """Redistribution of `tensor` from layout `src` (producer or parameter home) to `dst` (of
    round `only` alone, when given)."""
    t = graph.tensors[tensor]
    grad = tensor in graph.requires_grad
    return edge_redistribution(src, dst, t.numel, opts.element_bytes(t), rounds, grad, opts, only)


def shared_rounds(
    graph: Graph,
    tensor: str,
    prev: tuple[Op, int, Strategy],
    cur: tuple[Op, int, Strategy],
    opts: CostOptions,
) -> list[int]:
    """Rounds in which `cur` need not all-reduce `tensor`'s gradient: the previous consumer of the
    same tensor reads it in the same layout and reduces it in that round too (gradients are
    summed locally first, then reduced once). Pairwise by construction, so the ILP can model it."""
    (p_op, p_pos, p_strategy), (c_op, c_pos, c_strategy) = prev, cur
    if operand_layout(p_op, p_strategy, p_pos) != operand_layout(c_op, c_strategy, c_pos):
        return []
    return _shared_rounds(graph, tensor, prev, cur, opts)


def _shared_rounds(
    graph: Graph,
    tensor: str,
    prev: tuple[Op, int, Strategy],
    cur: tuple[Op, int, Strategy],
    opts: CostOptions,
) -> list[int]:
    """`shared_rounds` of two consumers known to read `tensor` in the same layout."""
    (p_op, p_pos, p_strategy), (c_op, c_pos, c_strategy) = prev, cur
    grad = tensor in graph.requires_grad
    return [
        r
        for r in range(len(c_strategy))
        if reduces(p_op, p_strategy[r], p_op.signature.inputs[p_pos], False, grad, opts.train)
        and reduces(c_op, c_strategy[r], c_op.signature.inputs[c_pos], False, grad, opts.train)
    ]


def share_credit(
    graph: Graph,
    tensor: str,
    prev: tuple[Op, int, Strategy],
    cur: tuple[Op, int, Strategy],
    mesh: Mesh,
    opts: CostOptions,
) -> CommTerms:
    """The (negative) terms `cur` saves thanks to `prev` (see `shared_rounds`)."""
    rounds = shared_rounds(graph, tensor, prev, cur, opts)
    if not rounds:
        return ZERO
    c_op, c_pos, c_strategy = cur
    full = op_intra(graph, c_op, c_strategy, mesh.rounds, opts)
    cut = op_intra(graph, c_op, c_strategy, mesh.rounds, opts, [(c_pos, r) for r in rounds])
    return cut - full


def param_homes(
    graph: Graph,
    strategies: Mapping[str, Strategy],
    overrides: Mapping[str, Layout] | None = None,
    layouts: Sequence[Sequence[Layout]] | None = None,
) -> dict[str, Layout]:
    """Where each parameter lives: an override (e.g. FSDP) or its first consumer's layout
    (`layouts`: per op, its inputs' layouts when known)."""
    homes: dict[str, Layout] = dict(overrides or {})
    for index, op in enumerate(graph.ops):
        for i, name in enumerate(op.inputs):
            if graph.tensors[name].role is Role.PARAMETER and name not in homes:
                if layouts is not None:
                    homes[name] = layouts[index][i]
                else:
                    homes[name] = operand_layout(op, strategies[op.name], i)
    return homes


def output_layouts(graph: Graph, strategies: Mapping[str, Strategy]) -> dict[str, Layout]:
    """The layout each op output is left in by its producer (partial sums resolved)."""
    return {
        name: resolved(operand_layout(op, strategies[op.name], i, True))
        for op in graph.ops
        for i, name in enumerate(op.outputs)
    }


@dataclass(frozen=True, slots=True)
class EdgeTerm:
    """One redistribution: `tensor`, read as operand `position`, moves from `src` to `dst`."""

    tensor: str
    position: int
    src: Layout
    dst: Layout
    terms: CommTerms


@dataclass(frozen=True, slots=True)
class OpTerms:
    """What `evaluate_strategies` charges one operator (the `index`-th of the graph).

    `intra`: its own collectives (`unary_terms`) plus the share credits (<= 0) of the operands it
    reads after another consumer of the same tensor; `compute`: its compute cost; `edges`: the
    redistributions of its operands, in operand order.
    """

    index: int
    op: Op
    strategy: Strategy
    intra: CommTerms
    compute: float
    edges: tuple[EdgeTerm, ...]

    @property
    def redistribution(self) -> CommTerms:
        """The edges' terms summed in operand order."""
        redis = ZERO
        for edge in self.edges:
            redis = redis + edge.terms
        return redis


def op_terms(
    graph: Graph,
    mesh: Mesh,
    strategies: Mapping[str, Strategy],
    opts: CostOptions,
    homes: Mapping[str, Layout],
    out_layout: Mapping[str, Layout],
    unary: Callable[[Graph, Op, Strategy, Mesh, CostOptions], tuple[CommTerms, float]] = (
        unary_terms
    ),
    cache: ScoreCache | None = None,
) -> Iterator[OpTerms]:
    """Per operator in graph order, the terms `evaluate_strategies` sums (see `OpTerms`).
    `unary` prices an op's own terms (`unary_terms`, or a memo of it).

    An operand's source layout is its producer's output layout (`output_layouts`) or its
    parameter home (`param_homes`); graph inputs and constants have none: they arrive in
    whatever layout the op reads. The one walk shared by the evaluator and the verifier's
    per-operator prediction (`shardplan.fidelity.predict`).
    `cache` (a `ScoreCache` of this graph, mesh and options) prices each class of repeated
    layers once; every price in it is a pure function of its key.
    """
    cache = cache if cache is not None else ScoreCache(graph, mesh, opts)
    cache.check(graph, mesh, opts)
    classes = cache.classes
    for index, op in enumerate(graph.ops):
        strategy = strategies[op.name]
        cid = classes[index]
        if unary is unary_terms:
            intra, compute = cache.unary(op, cid, strategy)
        else:
            intra, compute = unary(graph, op, strategy, mesh, opts)
        dsts = cache.layouts(op, cid, strategy)[0]
        intra = credited(cache, strategies, index, op, intra)
        edges: list[EdgeTerm] = []
        for i, name in enumerate(op.inputs):
            src = out_layout.get(name) or homes.get(name)
            if src is None:
                continue
            dst = dsts[i]
            if src != dst:
                edges.append(EdgeTerm(name, i, src, dst, cache.move(name, src, dst)))
        yield OpTerms(index, op, strategy, intra, compute, tuple(edges))


class PriceTable:
    """The prices `ScoreCache`s of several graphs on one mesh under one set of options share
    (sub-graphs of one model: its pipeline chunks and their reductions): op classes by `op_key`,
    which holds everything a price reads, so an op priced in one graph is priced in all."""

    def __init__(self, mesh: Mesh, opts: CostOptions) -> None:
        self.mesh, self.opts = mesh, opts
        self.ids: dict[tuple[object, ...], int] = {}
        self.fast = faster_rounds(mesh.rounds)
        self.forward_opts = dataclass_replace(opts, train=False)
        self.prices: dict[tuple[int, Strategy], OpPrice] = {}
        self.computes: dict[tuple[int, Strategy], float] = {}  # compute alone, not yet priced
        self.valid: set[tuple[object, ...]] = set()  # (class, strategy) pairs checked valid
        self.credits: dict[tuple[object, ...], CommTerms] = {}
        self.moves: dict[tuple[object, ...], CommTerms] = {}
        self.bytes: dict[tuple[object, ...], float] = {}
        self.zero: dict[tuple[object, ...], Any] = {}  # `cost.zero.zero_steps`' memo


class ScoreCache:
    """Prices `evaluate_strategies` reuses while scoring plans of one graph on one mesh under one
    set of options: ops of equal `op_key` (repeated layers) form a class, and a class's own
    prices (`price.OpPrice`: terms, compute, operand layouts) and share credits, like each
    redistribution, are priced once per strategy. `table`: a `PriceTable` shared with the caches
    of other graphs on the same mesh and options (else its own). Local to its caller (one
    search), never module state; O(ops) to build."""

    def __init__(
        self, graph: Graph, mesh: Mesh, opts: CostOptions, table: PriceTable | None = None
    ) -> None:
        self.graph, self.mesh, self.opts = graph, mesh, opts
        if table is None:
            table = PriceTable(mesh, opts)
        elif table.mesh != mesh or table.opts != opts:
            raise ValueError("a PriceTable prices one mesh and set of options only")
        self.table = table
        self.classes = op_classes(graph, table.ids)
        self._previous: list[list[tuple[int, int] | None]] | None = None
        self._has_previous: list[bool] | None = None
        self._fast, self._forward_opts = table.fast, table.forward_opts
        self._prices, self.valid = table.prices, table.valid
        self._credits, self._moves = table.credits, table.moves
        self._computes = table.computes
        self._bytes: dict[tuple[object, ...], float] = {}  # by tensor name: this graph's
        self._sizes = table.bytes  # by (elements, width, layout): any graph's
        self.memo: dict[str, Any] = {}  # facts of this graph other cost modules derive once

    @property
    def previous(self) -> list[list[tuple[int, int] | None]]:
        """Per op and operand, the tensor's reader just before it (`previous_consumers`), made
        on first use: a search scoring a fold's reduced graph never walks the full one's."""
        if self._previous is None:
            self._previous = previous_consumers(self.graph)
        return self._previous

    def has_previous(self) -> list[bool]:
        """Per op, whether it reads a tensor after another reader (a share credit to price)."""
        if self._has_previous is None:
            self._has_previous = [any(p is not None for p in ps) for ps in self.previous]
        return self._has_previous

    def check(self, graph: Graph, mesh: Mesh, opts: CostOptions) -> None:
        if graph is not self.graph or mesh != self.mesh or opts != self.opts:
            raise ValueError("a ScoreCache prices one graph, mesh and set of options only")

    def price(self, op: Op, cid: int, strategy: Strategy) -> OpPrice:
        """`price.price_op` of the op (of class `cid`) under `strategy`."""
        key = (cid, strategy)
        found = self._prices.get(key)
        if found is None:
            found = self._prices[key] = price_op(
                self.graph, op, strategy, self.mesh, self.opts, self._fast, self._forward_opts
            )
        return found

    def compute(self, op: Op, cid: int, strategy: Strategy) -> float:
        """The op's compute under `strategy`: its price's, else `price.op_compute` (kept) when
        the strategy is not priced yet (a floor tested before pricing it whole)."""
        key = (cid, strategy)
        price = self._prices.get(key)
        if price is not None:
            return price.compute
        found = self._computes.get(key)
        if found is None:
            found = self._computes[key] = op_compute(
                self.graph, op, strategy, self.mesh, self.opts, self._fast
            )
        return found

    def unary(self, op: Op, cid: int, strategy: Strategy) -> tuple[CommTerms, float]:
        price = self.price(op, cid, strategy)
        return price.intra, price.compute

    def layouts(self, op: Op, cid: int, strategy: Strategy) -> tuple[tuple[Layout, ...], ...]:
        """(input layouts, resolved output layouts) of the op under `strategy`."""
        price = self.price(op, cid, strategy)
        return price.inputs, price.resolved

    def forward(self, op: Op, cid: int, strategy: Strategy) -> float:
        """The op's forward compute (`cost.work.forward_compute`)."""
        return self.price(op, cid, strategy).forward

    def credit(
        self, tensor: str, prior: tuple[Op, int, Strategy], cur: tuple[Op, int, Strategy], cid: int
    ) -> CommTerms:
        """`share_credit` of `cur` after `prior`, from their classes' prices."""
        p_op, p_pos, p_strategy = prior
        c_op, c_pos, c_strategy = cur
        p_cid = self.classes[self.graph.op_index[p_op.name]]
        key = (p_cid, p_pos, p_strategy, cid, c_pos, c_strategy)
        found = self._credits.get(key)
        if found is None:
            mine = self.price(c_op, cid, c_strategy)
            theirs = self.price(p_op, p_cid, p_strategy)
            found = ZERO
            if theirs.inputs[p_pos] == mine.inputs[c_pos]:
                rounds = _shared_rounds(self.graph, tensor, prior, cur, self.opts)
                if rounds:
                    shared = [(c_pos, r) for r in rounds]
                    cut = shared_intra(c_op, c_strategy, self.mesh.rounds, mine, shared, self.opts)
                    found = cut - mine.intra
            self._credits[key] = found
        return found

    def move(self, tensor: str, src: Layout, dst: Layout) -> CommTerms:
        t = self.graph.tensors[tensor]
        key = (t.numel, self.opts.element_bytes(t), tensor in self.graph.requires_grad, src, dst)
        found = self._moves.get(key)
        if found is None:
            found = self._moves[key] = edge_terms(
                self.graph, tensor, src, dst, self.mesh.rounds, self.opts
            )
        return found

    def local_bytes(self, tensor: str, layout: Layout) -> float:
        found = self._bytes.get((tensor, layout))  # the tensor's name: no size to compute first
        if found is None:
            t = self.graph.tensors[tensor]
            key = (t.numel, self.opts.element_bytes(t), layout)
            found = self._sizes.get(key)
            if found is None:
                found = self._sizes[key] = local_bytes(
                    self.graph, tensor, layout, self.mesh.rounds, self.opts
                )
            self._bytes[tensor, layout] = found
        return found


__all__ = [  # with the per-op facts of `cost.classes` its callers import from here
    "CostBreakdown",
    "EdgeTerm",
    "OpCost",
    "OpTerms",
    "PriceTable",
    "ScoreCache",
    "edge_terms",
    "evaluate_strategies",
    "op_classes",
    "op_intra",
    "op_key",
    "op_terms",
    "own_and_edges",
    "output_layouts",
    "param_homes",
    "plan_rows",
    "previous_consumer",
    "previous_consumers",
    "share_credit",
    "shared_rounds",
    "unary_terms",
]


def evaluate_strategies(
    graph: Graph,
    mesh: Mesh,
    strategies: Mapping[str, Strategy],
    opts: CostOptions,
    param_layouts: Mapping[str, Layout] | None = None,
    cache: ScoreCache | None = None,
    repeats: tuple[Rows, Sequence[int]] | None = None,
) -> CostBreakdown:
    """Score one complete assignment of strategies (raises PlanError if one is invalid);
    `cache` shares prices between the plans one search scores (`ScoreCache`).

    total = sum over ops of unary_terms + sum over edges of edge_terms + sum over consecutive
    consumers of a tensor of share_credit: unary and pairwise terms only (what the ILP models).
    `repeats` (rows of a smaller graph, and per op of this one the op whose row it repeats: a
    fold of repeated blocks, `search.drec.fold`) gives the rows instead of walking the ops: the
    caller vouches that each op sees what its stand-in sees (`rows.Rows.repeated`).
    """
    rounds = mesh.rounds
    cache = cache if cache is not None else ScoreCache(graph, mesh, opts)
    last = cache.memo.get("placement") if repeats is None and param_layouts is None else None
    since = None
    if last is not None and not opts.zero:  # from the last plan placed: few ops differ
        try:
            strategies, prices, homes, out_layout, changed = placed_since(last, strategies, cache)
            zero, since = zero_pricing(graph, rounds, strategies, opts, None), (last.rows, changed)
        except ValueError:  # too many changed: placed whole
            pass
    if since is None:
        placed = _placed(graph, strategies, opts, param_layouts, cache)
        strategies, zero, prices, homes, out_layout = placed
    if repeats is None:
        rows = op_rows(cache, strategies, homes, out_layout, prices, zero.by_reader, since)
        if param_layouts is None and not opts.zero:
            cache.memo["placement"] = Placement(strategies, prices, homes, out_layout, rows)
    else:
        rows = repeats[0].repeated(repeats[1], [op.name for op in graph.ops])
    ins = [p.inputs for p in prices]
    param_mem, act_mem = memory_per_device(
        graph, rounds, homes, out_layout, strategies, opts, cache.local_bytes, zero.params, ins
    )
    return breakdown(rows, param_mem, act_mem, opts)


def plan_rows(
    graph: Graph,
    mesh: Mesh,
    strategies: Mapping[str, Strategy],
    opts: CostOptions,
    cache: ScoreCache,
) -> Rows:
    """The rows `evaluate_strategies` sums for `strategies` (no ZeRO storage layouts)."""
    strategies, zero, prices, homes, out_layout = _placed(graph, strategies, opts, None, cache)
    return op_rows(cache, strategies, homes, out_layout, prices, zero.by_reader)


def _placed(
    graph: Graph,
    strategies: Mapping[str, Strategy],
    opts: CostOptions,
    param_layouts: Mapping[str, Layout] | None,
    cache: ScoreCache,
) -> tuple[dict[str, Strategy], Any, list[OpPrice], dict[str, Layout], dict[str, Layout]]:
    """The checked strategies, ZeRO's pricing, each op's price, the parameters' homes and the
    results' layouts of a plan (what its rows and memory read)."""
    rounds = cache.mesh.rounds
    strategies = {name: tuple(s) for name, s in strategies.items()}
    check_strategies(graph.ops, strategies, rounds, cache.classes, cache.valid)
    zero = zero_pricing(graph, rounds, strategies, opts, param_layouts)
    prices = [
        cache.price(op, cid, strategies[op.name])
        for op, cid in zip(graph.ops, cache.classes, strict=True)
    ]
    ins = [p.inputs for p in prices]
    homes = param_homes(graph, strategies, None if zero.params else param_layouts, ins)
    out_layout: dict[str, Layout] = {}
    for op, price in zip(graph.ops, prices, strict=True):
        out_layout.update(zip(op.outputs, price.resolved, strict=True))
    return strategies, zero, prices, homes, out_layout


def breakdown(rows: Rows, param_mem: float, act_mem: float, opts: CostOptions) -> CostBreakdown:
    """The breakdown of `rows` and the plan's memory (parameter state, activations)."""
    comm_terms = CommTerms(*rows.field_sums())
    compute = rows.compute()
    return CostBreakdown(
        comm_terms.total + compute,
        compute,
        comm_terms,
        param_mem + act_mem,
        param_mem,
        act_mem,
        "elements" if opts.preset.symbolic else "s",
        rows.ops,
    )
