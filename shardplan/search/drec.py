"""D-Rec, the Double-Recursive search (Wang, Li, Tachon et al., Euro-Par 2021), made general.

Outer recursion over the devices: one round per prime factor q of the mesh (outermost axis
first); in each round every operator cuts one loop dim q ways or none, and local sizes shrink.
Inner pass over the graph, per round r:
  1. heavy operators (see flex.py), heaviest first — weight = the largest cost among their valid
     cuts, ties by graph index — each pick the cut c minimising
        intra(c) + compute_extra(c) + sum over flex neighbours decided in round r of redist(c)
        [+ lambda * memory kept replicated by c, when a memory budget forces it]
     with round r's bandwidth and the local sizes left by rounds < r;
  2. layout-transparent operators then take their cut from their immediate neighbours: a forward
     pass in topological order, then a backward pass (reverse order) against all neighbours, so a
     chain between two heavy ops carries one layout unless the chain itself forces a change.
Cost: per round O(|V| log |V| + |E| * budget) — a sort plus dictionary look-ups — so the search is
O((|V| log |V| + |E|) * rounds): linear in the graph, logarithmic in the devices.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from shardplan.cost.collectives import all_reduce_s
from shardplan.cost.presets import CostOptions
from shardplan.cost.terms import (
    OperandInfo,
    compute_cost,
    faster,
    intra_terms,
    redistribution_terms,
    reduces,
    replicate_symbolic,
)
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role
from shardplan.mesh import Mesh, Round
from shardplan.search.flex import FlexEdge, build_flex_edges, heavy_ops
from shardplan.sharding import PARTIAL, REPLICATED, Strategy, cut_problem, layout_of_cut

ELSEWHERE = 1 << 20
"""Layout value of a split on a tensor dim that does not survive a flex chain."""


@dataclass(slots=True)
class _OpState:
    """Mutable per-search state of one op (local to one `drec` call)."""

    op: Op
    extents: dict[str, int]
    in_numel: list[float]
    out_numel: list[float]
    cuts: list[str | None] = field(default_factory=list)
    preds: list[FlexEdge] = field(default_factory=list)
    succs: list[FlexEdge] = field(default_factory=list)
    ar_history: dict[tuple[bool, int], list[tuple[int, float]]] = field(default_factory=dict)
    """(is_output, position) -> [(round, all-reduce cost charged then)]."""


def _layout(op: Op, cut: str | None, pos: int, is_output: bool) -> int:
    dims = (op.signature.outputs if is_output else op.signature.inputs)[pos]
    value = layout_of_cut(dims, cut, is_output, op)
    return REPLICATED if value == PARTIAL else value


def _candidate_order(op: Op) -> list[str | None]:
    """Tie order: dims of the result in its order (batch, rows, columns), then the other
    splittable dims (reductions), then "no cut"."""
    names: list[str | None] = []
    for dims in op.signature.outputs:
        for group in dims:
            for name in group:
                if name not in names and op.signature.loop_dim(name).splittable:
                    names.append(name)
    names += [d.name for d in op.signature.loop_dims if d.splittable and d.name not in names]
    return names + [None]


class _Search:
    """One D-Rec run; holds only state local to the call (no module state)."""

    def __init__(
        self,
        graph: Graph,
        mesh: Mesh,
        opts: CostOptions,
        memory_lambda: float,
        unused_rounds: int = 0,
        final_compute: bool = False,
    ) -> None:
        self.graph, self.mesh, self.opts = graph, mesh, opts
        # Price "no cut" by what it adds to the final compute if later rounds cut (telescopes
        # to the exact extra over all rounds) instead of by the local compute of this round.
        self.compute_divisor = [
            float(math.prod(x.q for x in mesh.rounds[r + 1 :])) if final_compute else 1.0
            for r in range(len(mesh.rounds))
        ]
        self.unused_rounds = unused_rounds
        self.rounds = mesh.rounds
        self.memory_lambda = memory_lambda
        self._cache: dict[tuple[int, int, tuple[int, ...]], dict[str | None, float]] = {}
        self._edge_cache: dict[tuple[int, int, float, str, int], float] = {}
        self._info_cache: dict[tuple[int, int], tuple[list[OperandInfo], list[OperandInfo]]] = {}
        self.faster_than = [
            [(j, other.q) for j, other in enumerate(self.rounds) if j != r and faster(other, rnd)]
            for r, rnd in enumerate(self.rounds)
        ]
        self.states = [
            _OpState(
                op,
                op.signature.extents,
                [float(graph.tensors[t].numel) for t in op.inputs],
                [float(graph.tensors[t].numel) for t in op.outputs],
            )
            for op in graph.ops
        ]
        self.heavy = heavy_ops(graph)
        for edge in build_flex_edges(graph, self.heavy):
            self.states[edge.consumer].preds.append(edge)
            self.states[edge.producer].succs.append(edge)
        self.candidates = [_candidate_order(op) for op in graph.ops]
        self.layouts = [
            {
                cut: (
                    tuple(_layout(op, cut, p, False) for p in range(len(op.inputs))),
                    tuple(_layout(op, cut, p, True) for p in range(len(op.outputs))),
                )
                for cut in cuts
            }
            for op, cuts in zip(graph.ops, self.candidates, strict=True)
        ]
        self.out_pos = {t: op.outputs.index(t) for op in graph.ops for t in op.outputs}
        self.param_positions = [
            [p for p, t in enumerate(op.inputs) if graph.tensors[t].role is Role.PARAMETER]
            for op in graph.ops
        ]

    # -- per-round helpers --------------------------------------------------------------------
    def _infos(self, i: int, r: int) -> tuple[list[OperandInfo], list[OperandInfo]]:
        """Operand sizes before round r, with the hierarchical all-reduce divisor: faster rounds
        already done count when they reduced the operand, faster later rounds are assumed to."""
        key = (r, i)
        cached = self._info_cache.get(key)
        if cached is not None:
            return cached
        st = self.states[i]
        op, graph, train = st.op, self.graph, self.opts.train
        out: list[list[OperandInfo]] = [[], []]
        for side, names, groups, sizes in (
            (0, op.inputs, op.signature.inputs, st.in_numel),
            (1, op.outputs, op.signature.outputs, st.out_numel),
        ):
            for pos, name in enumerate(names):
                t = graph.tensors[name]
                grad = name in graph.requires_grad
                divisor = 1.0
                for j, q in self.faster_than[r]:
                    if j > r:
                        divisor *= q
                    elif layout_of_cut(groups[pos], st.cuts[j], bool(side), op) < 0 and reduces(
                        op, st.cuts[j], groups[pos], bool(side), grad, train
                    ):
                        divisor *= q
                out[side].append(OperandInfo(sizes[pos], t.dtype_bytes, t.role, grad, divisor))
        result = self._info_cache[key] = (out[0], out[1])
        return result

    def _own_costs(self, i: int, r: int, charged: set[tuple[str, int]]) -> dict[str | None, float]:
        """Intra + compute + memory terms of every valid candidate of op i in round r (cached per
        round: they change only with which inputs' gradients another consumer already reduces)."""
        op = self.states[i].op
        shared = tuple(pos for pos, name in enumerate(op.inputs) if (name, r) in charged)
        key = (r, i, shared)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._cache[key] = self._compute_own_costs(i, r, charged)
        return dict(cached)

    def _compute_own_costs(
        self, i: int, r: int, charged: set[tuple[str, int]]
    ) -> dict[str | None, float]:
        st, rnd, opts = self.states[i], self.rounds[r], self.opts
        op = st.op
        ins, outs = self._infos(i, r)
        costs: dict[str | None, float] = {}
        for cut in self.candidates[i]:
            if cut is not None and cut_problem(op, cut, st.extents[cut], rnd.q) is not None:
                continue
            infos = ins
            if cut is not None and charged:
                infos = [
                    OperandInfo(
                        x.numel,
                        x.dtype_bytes,
                        x.role,
                        x.requires_grad,
                        x.ar_divisor,
                        (name, r) in charged,
                    )
                    for x, name in zip(ins, op.inputs, strict=True)
                ]
            extent = st.extents[cut] if cut is not None else 1
            costs[cut] = intra_terms(op, cut, rnd, infos, outs, extent, opts).total
        if None in costs:
            if opts.preset.symbolic:
                cuts = [c for k, c in costs.items() if k is not None]
                costs[None] = replicate_symbolic(min(cuts), opts.preset) if cuts else 0.0
            else:
                flops = op.flops
                for j, c in enumerate(st.cuts):
                    if c is not None:
                        flops /= self.rounds[j].q
                flops /= self.compute_divisor[r]
                costs[None] = compute_cost(flops * (rnd.q - 1) / rnd.q, opts, self.mesh.flops_per_s)
        if not opts.preset.symbolic:
            self._add_backlog(i, r, costs)
        if self.memory_lambda:
            for cut in costs:
                costs[cut] += self.memory_lambda * self._kept_bytes(i, cut, rnd)
        return costs

    def _add_backlog(self, i: int, r: int, costs: dict[str | None, float]) -> None:
        """Earlier, slower rounds priced their all-reduces assuming this faster round would shrink
        the operand first (hierarchical reduction). A cut that neither splits nor reduces it
        breaks that assumption: it pays the (q-1)-fold growth of those earlier pieces."""
        st, rnd, graph = self.states[i], self.rounds[r], self.graph
        op = st.op
        for (is_output, pos), history in st.ar_history.items():
            backlog = sum(c for j, c in history if faster(rnd, self.rounds[j])) * (rnd.q - 1)
            if not backlog:
                continue
            groups = (op.signature.outputs if is_output else op.signature.inputs)[pos]
            name = (op.outputs if is_output else op.inputs)[pos]
            grad = name in graph.requires_grad
            for cut in costs:
                if layout_of_cut(groups, cut, is_output, op) < 0 and not reduces(
                    op, cut, groups, is_output, grad, self.opts.train
                ):
                    costs[cut] += backlog

    def _record_all_reduces(self, i: int, r: int, cut: str | None) -> None:
        st, rnd = self.states[i], self.rounds[r]
        if cut is None or self.opts.preset.symbolic:
            return
        op = st.op
        ins, outs = self._infos(i, r)
        for is_output, infos, groups in (
            (False, ins, op.signature.inputs),
            (True, outs, op.signature.outputs),
        ):
            for pos, info in enumerate(infos):
                if reduces(op, cut, groups[pos], is_output, info.requires_grad, self.opts.train):
                    nbytes = info.numel * info.dtype_bytes / info.ar_divisor
                    st.ar_history.setdefault((is_output, pos), []).append(
                        (r, all_reduce_s(nbytes, rnd.q, rnd.bandwidth_bytes_per_s))
                    )

    def _kept_bytes(self, i: int, cut: str | None, rnd: Round) -> float:
        """Bytes per device this cut leaves replicated (parameters count with their state)."""
        st, graph, opts = self.states[i], self.graph, self.opts
        per_param = 2 + opts.optimizer.state_bytes_per_param / 4 if opts.train else 1
        kept = 0.0
        for pos, name in enumerate(st.op.inputs):
            t = graph.tensors[name]
            if t.role is Role.PARAMETER and _layout(st.op, cut, pos, False) < 0:
                kept += st.in_numel[pos] * t.dtype_bytes * per_param
        if opts.train:
            for pos, name in enumerate(st.op.outputs):
                if _layout(st.op, cut, pos, True) < 0:
                    kept += st.out_numel[pos] * graph.tensors[name].dtype_bytes
        return kept * (rnd.q - 1) / rnd.q

    def _edge(self, src: int, dst: int, numel: float, name: str, rnd: Round) -> float:
        if src == dst:
            return 0.0
        key = (src, dst, numel, name, rnd.index)
        cost = self._edge_cache.get(key)
        if cost is None:
            t = self.graph.tensors[name]
            cost = self._edge_cache[key] = redistribution_terms(
                src, dst, numel, t.dtype_bytes, rnd, name in self.graph.requires_grad, self.opts
            ).total
        return cost

    def _in(self, i: int, cut: str | None, pos: int) -> int:
        return self.layouts[i][cut][0][pos]

    def _out(self, i: int, cut: str | None, pos: int) -> int:
        return self.layouts[i][cut][1][pos]

    def _flex_cost(
        self, i: int, cut: str | None, rnd: Round, decided: dict[int, str | None]
    ) -> float:
        st = self.states[i]
        op = st.op
        cost = 0.0
        for e in st.preds:
            if e.producer not in decided:
                continue
            src = self._out(e.producer, decided[e.producer], e.out_pos)
            dst = self._in(i, cut, e.in_pos)
            if src >= 0:
                src = dict(e.to_consumer).get(src, ELSEWHERE)
                if src == ELSEWHERE:  # the chain cannot carry that split: it gathers on the way
                    dst = REPLICATED
            cost += self._edge(src, dst, st.in_numel[e.in_pos], op.inputs[e.in_pos], rnd)
        for e in st.succs:
            if e.consumer not in decided:
                continue
            dst = self._in(e.consumer, decided[e.consumer], e.in_pos)
            src = self._out(i, cut, e.out_pos)
            if dst >= 0:
                back = {c: p for p, c in e.to_consumer}
                dst = back.get(dst, REPLICATED)
            if src >= 0 and src not in dict(e.to_consumer):
                dst = REPLICATED  # the chain cannot carry this split: it gathers on the way
            cost += self._edge(src, dst, st.out_numel[e.out_pos], op.outputs[e.out_pos], rnd)
        return cost + self._shared_param_costs(i, [cut], rnd, decided)[cut]

    def _shared_param_costs(
        self, i: int, cuts: list[str | None], rnd: Round, decided: dict[int, str | None]
    ) -> dict[str | None, float]:
        """Redistribution between this op's reading of a shared parameter and other readers'."""
        st, graph = self.states[i], self.graph
        costs = dict.fromkeys(cuts, 0.0)
        for pos in self.param_positions[i]:
            name = st.op.inputs[pos]
            for other, other_pos in graph.consumers[name]:
                if other != i and other in decided:
                    src = self._in(other, decided[other], other_pos)
                    for cut in cuts:
                        dst = self._in(i, cut, pos)
                        if src != dst:
                            costs[cut] += self._edge(src, dst, st.in_numel[pos], name, rnd)
        return costs

    def _near_costs(
        self, i: int, cuts: list[str | None], rnd: Round, decided: dict[int, str | None]
    ) -> dict[str | None, float]:
        """Redistribution of each candidate against the immediate neighbours decided so far."""
        st, graph = self.states[i], self.graph
        op = st.op
        costs = self._shared_param_costs(i, cuts, rnd, decided)
        for pos, name in enumerate(op.inputs):
            p = graph.producer.get(name)
            if p is not None and p in decided:
                src = self._out(p, decided[p], self.out_pos[name])
                for cut in cuts:
                    dst = self._in(i, cut, pos)
                    if src != dst:
                        costs[cut] += self._edge(src, dst, st.in_numel[pos], name, rnd)
        for pos, name in enumerate(op.outputs):
            for w, w_pos in graph.consumers.get(name, ()):
                if w in decided:
                    dst = self._in(w, decided[w], w_pos)
                    for cut in cuts:
                        src = self._out(i, cut, pos)
                        if src != dst:
                            costs[cut] += self._edge(src, dst, st.out_numel[pos], name, rnd)
        return costs

    @staticmethod
    def _pick(costs: dict[str | None, float], extra: dict[str | None, float]) -> str | None:
        best, best_cost = None, float("inf")
        for cut, c in costs.items():  # candidate order; strict < keeps the first of equals
            total = c + extra[cut]
            if total < best_cost:
                best, best_cost = cut, total
        return best

    def _charge(self, i: int, cut: str | None, r: int, charged: set[tuple[str, int]]) -> None:
        op = self.states[i].op
        for pos, name in enumerate(op.inputs):
            if reduces(
                op,
                cut,
                op.signature.inputs[pos],
                False,
                name in self.graph.requires_grad,
                self.opts.train,
            ):
                charged.add((name, r))

    # -- the double recursion -----------------------------------------------------------------
    def _greedy(self, r: int) -> dict[int, str | None]:
        """Heavy ops, heaviest first, each against the flex neighbours decided before it."""
        rnd = self.rounds[r]
        decided: dict[int, str | None] = {}
        charged: set[tuple[str, int]] = set()
        own = {i: self._own_costs(i, r, charged) for i in self.heavy}
        order = sorted(self.heavy, key=lambda i: (-max(own[i].values()), i))
        for i in order:
            costs = self._own_costs(i, r, charged) if charged else own[i]
            extra = {cut: self._flex_cost(i, cut, rnd, decided) for cut in costs}
            for cut, regret in self._lookahead(i, list(costs), rnd, decided, own).items():
                extra[cut] += regret
            decided[i] = self._pick(costs, extra)
            self._charge(i, decided[i], r, charged)
        return decided

    def _lookahead(
        self,
        i: int,
        cuts: list[str | None],
        rnd: Round,
        decided: dict[int, str | None],
        own: dict[int, dict[str | None, float]],
    ) -> dict[str | None, float]:
        """One step ahead: what each cut of op i forces on its undecided flex neighbours — their
        best answer (own terms, edges to their decided neighbours and to i) over their best
        without i. A cut that is free for i but strands a neighbour between i and an already
        decided op (a first conv cutting its channels before a batch-cut conv) pays for it."""
        st = self.states[i]
        regret = dict.fromkeys(cuts, 0.0)
        neighbours = {e.consumer for e in st.succs} | {e.producer for e in st.preds}
        for j in sorted(neighbours - decided.keys() - {i}):
            base = {cj: c + self._flex_cost(j, cj, rnd, decided) for cj, c in own[j].items()}
            floor = min(base.values())
            for cut in cuts:
                pinned = {i: cut}
                regret[cut] += (
                    min(c + self._flex_cost(j, cj, rnd, pinned) for cj, c in base.items()) - floor
                )
        return regret

    def _settle(self, r: int, decided: dict[int, str | None], ops: list[int]) -> None:
        """Each op of `ops` (forward, then backward) re-picks against its decided neighbours."""
        rnd = self.rounds[r]
        charged: set[tuple[str, int]] = set()
        for i in range(len(self.states)):
            if i in decided:
                self._charge(i, decided[i], r, charged)
        for sweep in (ops, ops[::-1]):
            for i in sweep:
                decided.pop(i, None)
                costs = self._own_costs(i, r, charged)
                extra = self._near_costs(i, list(costs), rnd, decided)
                decided[i] = self._pick(costs, extra)

    def _neighbours(self, i: int) -> list[int]:
        graph, op = self.graph, self.states[i].op
        out = [graph.producer[t] for t in op.inputs if t in graph.producer]
        out += [w for t in op.outputs for w, _ in graph.consumers.get(t, ())]
        out += [w for pos in self.param_positions[i] for w, _ in graph.consumers[op.inputs[pos]]]
        return out

    def _improve(self, r: int, decided: dict[int, str | None], max_visits: int = 4) -> None:
        """Local improvement: starting from the heavy ops, an op re-picks against its decided
        neighbours; when it changes, its neighbours are revisited (lowest graph index first;
        each op at most `max_visits` times, so the pass stays linear)."""
        rnd = self.rounds[r]
        charged: set[tuple[str, int]] = set()
        for i, cut in decided.items():
            self._charge(i, cut, r, charged)
        heap = sorted(self.heavy)
        queued = set(heap)
        visits: dict[int, int] = {}
        while heap:
            i = heapq.heappop(heap)
            queued.discard(i)
            if visits.get(i, 0) >= max_visits:
                continue
            visits[i] = visits.get(i, 0) + 1
            old = decided.pop(i)
            costs = self._own_costs(i, r, charged)
            extra = self._near_costs(i, list(costs), rnd, decided)
            if old in costs and costs[old] + extra[old] <= min(costs[c] + extra[c] for c in costs):
                decided[i] = old  # keep the current cut on ties: the pass only ever improves
                continue
            decided[i] = self._pick(costs, extra)
            for j in self._neighbours(i):
                if j not in queued and j != i:
                    queued.add(j)
                    heapq.heappush(heap, j)

    def _round_cost(self, r: int, decided: dict[int, str | None]) -> float:
        """The round's cost of a complete assignment: own terms plus every edge once."""
        rnd, graph = self.rounds[r], self.graph
        charged: set[tuple[str, int]] = set()
        total = 0.0
        for i, st in enumerate(self.states):
            op, cut = st.op, decided[i]
            total += self._own_costs(i, r, charged)[cut]
            self._charge(i, cut, r, charged)
            for pos, name in enumerate(op.inputs):
                dst = self._in(i, cut, pos)
                p = graph.producer.get(name)
                if p is not None:
                    src = self._out(p, decided[p], self.out_pos[name])
                    total += self._edge(src, dst, st.in_numel[pos], name, rnd)
                elif graph.tensors[name].role is Role.PARAMETER:
                    first, first_pos = graph.consumers[name][0]
                    if first != i:
                        src = self._in(first, decided[first], first_pos)
                        total += self._edge(src, dst, st.in_numel[pos], name, rnd)
        return total

    def _alternatives(self, r: int) -> list[dict[int, str | None]]:
        """Whole-round assignments the greedy result is checked against: every heavy op
        continuing its previous round's cut, and every heavy op cutting the leading dim of its
        result (the first valid candidate), so a uniform split is never missed by greediness."""
        rnd = self.rounds[r]
        out: list[dict[int, str | None]] = []
        if r > 0:
            previous: dict[int, str | None] = {}
            for i in self.heavy:
                st = self.states[i]
                cut = st.cuts[-1]
                valid = cut is not None and cut_problem(st.op, cut, st.extents[cut], rnd.q) is None
                previous[i] = cut if valid else None
            out.append(previous)
        leading: dict[int, str | None] = {}
        for i in self.heavy:
            st = self.states[i]
            leading[i] = next(
                (
                    c
                    for c in self.candidates[i]
                    if c is None or cut_problem(st.op, c, st.extents[c], rnd.q) is None
                ),
                None,
            )
        out.append(leading)
        out.append(dict.fromkeys(self.heavy))  # leave the round unused: replicate everything
        return out

    def run_round(self, r: int) -> None:
        """Greedy D-Rec assignment, checked against the whole-round alternatives; the cheapest
        (by the round's full cost) is then locally improved, one op at a time."""
        rnd = self.rounds[r]
        self._cache.clear()
        self._edge_cache.clear()
        self._info_cache.clear()
        if r < self.unused_rounds:
            for st in self.states:
                st.cuts.append(None)
            return
        light = [i for i in range(len(self.states)) if i not in self.heavy]
        decided = self._greedy(r)
        self._settle(r, decided, light)
        best = self._round_cost(r, decided)
        for alternative in self._alternatives(r):
            if all(alternative[i] == decided[i] for i in self.heavy):
                continue
            self._settle(r, alternative, light)
            cost = self._round_cost(r, alternative)
            if cost < best:
                decided, best = alternative, cost
        self._improve(r, decided)
        for i, st in enumerate(self.states):
            cut = decided.get(i)
            self._record_all_reduces(i, r, cut)
            st.cuts.append(cut)
            if cut is None:
                continue
            st.extents[cut] //= rnd.q
            for pos in range(len(st.op.inputs)):
                if _layout(st.op, cut, pos, False) >= 0:
                    st.in_numel[pos] /= rnd.q
            for pos in range(len(st.op.outputs)):
                if _layout(st.op, cut, pos, True) >= 0:
                    st.out_numel[pos] /= rnd.q

    def run(self) -> dict[str, Strategy]:
        for r in range(len(self.rounds)):
            self.run_round(r)
        return {st.op.name: tuple(st.cuts) for st in self.states}


def drec(
    graph: Graph, mesh: Mesh, opts: CostOptions, memory_lambda: float = 0.0
) -> dict[str, Strategy]:
    """Strategies of every op by D-Rec; `memory_lambda` (cost units per byte) penalises cuts that
    keep tensors replicated, used by the memory-aware driver in `search.api`.

    A few variants of the search run and the plan the evaluator scores lower (cost + lambda *
    memory) is kept, each variant correcting a myopia of the round-by-round greedy:
      * "no cut" priced by this round's local compute (pessimistic: later rounds may still cut)
        and by its exact share of the final compute (optimistic: assumes they do);
      * the leading mesh axes left unused (every op replicated across them): a slow inter-node
        axis often costs more than it saves for small batches, which no single round sees,
        down to the fully replicated plan.
    That is at most 2 + (mesh axes) linear searches; the unused-axis ones are shorter.
    """
    from shardplan.cost.evaluate import evaluate_strategies

    best: dict[str, Strategy] | None = None
    best_score = float("inf")
    rounds = mesh.rounds
    axis_ends = [r for r in range(1, len(rounds)) if rounds[r].mesh_axis != rounds[r - 1].mesh_axis]
    variants = [(0, False), (0, True)] + [(k, False) for k in [*axis_ends, len(rounds)]]
    for unused, final_compute in variants:
        search = _Search(graph, mesh, opts, memory_lambda, unused, final_compute)
        strategies = search.run()
        cost = evaluate_strategies(graph, mesh, strategies, opts)
        score = cost.total + memory_lambda * cost.memory_per_device
        if score < best_score:
            best, best_score = strategies, score
    assert best is not None
    return best


def heavy_names(graph: Graph) -> Sequence[str]:
    return [graph.ops[i].name for i in sorted(heavy_ops(graph))]
