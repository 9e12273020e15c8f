"""What D-Rec's rounds cost: the per-round pricing of cuts and edges.

`RoundCosts` prices, on the state the rounds done left (`ledger.RoundLedger`, its base: per op
local extents and sizes, the cuts so far, flex edges to other heavy ops; edge contexts) and from
the graph's tables (`tables.SearchTables`), for one round r with its bandwidth and the local
sizes left by rounds < r, every candidate cut of an op:
  * own terms: intra-operator collectives (`cost.terms.intra_terms`; gradient all-reduces shrunk
    by the faster rounds that will reduce them first), the extra compute of "no cut", the
    all-reduce "backlog" of earlier slower rounds a cut breaks, and lambda * bytes kept replicated;
    in the greedy pass, a heavy op's cut also pays what it leaves its followers (the transparent
    ops that take its layout: `tables.SearchTables.followers`) above their cheapest cuts;
  * redistribution against decided neighbours: through flex edges (heavy to heavy across chains
    of layout-transparent ops; edges one layout change serves are charged once, at the dearest),
    against immediate neighbours, and between readers of one parameter. An edge's price in
    round r is its MARGINAL cost (`ledger.RoundLedger._marginal`): the evaluator's price of the
    edge with rounds 0..r as decided minus with rounds 0..r-1 as decided, the rounds not decided
    yet assumed split alike on both sides in both (the edge's "context": per earlier round how
    its two layouts relate, `relation`). Summed over the rounds this telescopes to the
    evaluator's price of the whole edge, multi-round all-to-alls included; a round that keeps a
    split on both sides earns the shrinking of earlier rounds' collectives (a negative price);
  * the full cost of a round's complete assignment, to compare whole-round alternatives.
Every price is a dictionary look-up after its first computation (own terms are keyed by (round,
op kind: label and cuts so far, numbered), intra terms shared by variants that assume
all-reduces alike; edges by (relation, context, size, dtype, gradient status) in a
`state.EdgeBook` the variants of one call share, a context holding its round; so identical ops
of repeated layers share them), so
each is O(1) amortised and a round costs O(|V| + |E|) look-ups plus O(|E|) to extend the edges'
contexts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from operator import add
from typing import Any

from shardplan.cost.presets import CostOptions
from shardplan.cost.terms import (
    OperandInfo,
    intra_terms,
    param_bytes,
    piece_compute,
    reduces,
    replicate_symbolic,
)
from shardplan.ir.graph import Graph
from shardplan.ir.op import Role
from shardplan.mesh import Mesh, Round
from shardplan.search.drec.flex import (
    FlexGraph,
    build_flex_graph,
)
from shardplan.search.drec.flexcosts import FlexPrices
from shardplan.search.drec.fold import op_labels
from shardplan.search.drec.followers import follower_excess
from shardplan.search.drec.ledger import _NONE_CHARGED, RoundLedger
from shardplan.search.drec.nextround import NextRoundPrices, differs, scaled
from shardplan.search.drec.overlay import Charges
from shardplan.search.drec.state import EdgeBook
from shardplan.search.drec.tables import SearchTables, layout
from shardplan.sharding import layout_of_cut

_UNDECIDED = object()
"""`decided.get`'s default: an op not decided yet (None is "no cut")."""


class RoundCosts(NextRoundPrices, FlexPrices, RoundLedger):
    """One D-Rec call's state and per-round prices (no module state)."""

    def __init__(
        self,
        graph: Graph,
        mesh: Mesh,
        opts: CostOptions,
        memory_lambda: float,
        unused_rounds: int = 0,
        final_compute: bool = False,
        flex: FlexGraph | None = None,
        weights: Sequence[float] | None = None,
        labels: Sequence[int] | None = None,
        hopeful: bool = False,
        tables: SearchTables | None = None,
        shared_prices: dict[tuple[object, ...], dict[str | None, float]] | None = None,
        next_round: bool = False,
        shared_edges: EdgeBook | None = None,
    ) -> None:
        flex = flex or build_flex_graph(graph)
        tables = tables or SearchTables.of(graph, flex)
        labels = list(labels) if labels is not None else op_labels(graph)
        # the rounds done
        super().__init__(graph, mesh, opts, flex, tables, labels, hopeful, shared_edges)
        # Price "no cut" by what it adds to the final compute if later rounds cut (telescopes
        # to the exact extra over all rounds) instead of by the local compute of this round.
        self.compute_divisor = [
            float(math.prod(x.q for x in mesh.rounds[r + 1 :])) if final_compute else 1.0
            for r in range(len(mesh.rounds))
        ]
        self.unused_rounds = unused_rounds
        self.next_round = next_round
        """Heavy ops' cuts also pay their cheapest price in the next round (`_add_next_round`)."""
        self.weights = list(weights) if weights is not None else [1.0] * len(graph.ops)
        """How many ops of the searched model each op stands for in a round's total (folding)."""
        self.memory_lambda = memory_lambda
        self.heavy = flex.heavy
        self.candidates, self.layouts = tables.candidates, tables.layouts
        self.group_of, self.param_positions = tables.group_of, tables.param_positions
        self._flex_nbrs = tables.flex_nbrs
        self._in_adj, self._out_adj = tables.in_adj, tables.out_adj
        self.followers = tables.followers
        self._follow_cache: dict[tuple[int, tuple[int, ...]], dict[str | None, float]] = {}
        """(heavy op, inputs another reader reduces) -> `_greedy_costs` this round."""
        self._cache: dict[tuple[object, ...], dict[str | None, float]] = {}
        """(round, op kind, inputs another reader reduces) -> own cost of each valid cut."""
        self._edges_to_cache: dict[tuple[int, int], Any] = {}  # `_edges_to`
        self._pair_task_cache: dict[tuple[int, int], Any] = {}  # `_pair_tasks`
        self._cut_layouts: dict[tuple[object, ...], Any] = {}  # `_priced`
        self._splits: dict[tuple[int, str | None], tuple[bool, ...] | None] = {}  # `_split`
        self._sources = self._input_sources()  # `round_cost`
        self._peers: dict[int, set[int]] = {}  # `_param_peers`
        self._near_cache: dict[tuple[object, ...], list[float]] = {}
        """(op, operand, neighbour's layout) -> the edge's price under each of op's cuts."""
        self._shared_prices = shared_prices if shared_prices is not None else {}
        """The same, for every search of one call that prices alike (an op's kind holds its
        whole state: searches that reach it price it alike)."""
        rounds = mesh.rounds
        self._price_keys = [
            (
                self.compute_divisor[r],
                hopeful,
                memory_lambda,
                # the next round's prices count only where it cuts another number of ways
                self.compute_divisor[r + 1]
                if next_round and r + 1 < len(rounds) and differs(rounds[r], rounds[r + 1])
                else None,
            )
            for r in range(len(rounds))
        ]
        """Per round, what its prices read beyond the state: searches with one key there price
        it alike, whatever they assume in other rounds (the last round's final compute is its
        local one; the lookahead adds nothing where the next round cuts as many ways)."""
        self._reduced_inputs: list[dict[str | None, tuple[str, ...]]] = [{} for _ in graph.ops]
        """Per op, per cut: the inputs whose gradient the cut all-reduces."""
        self.begin_round(0)

    # -- per-round helpers --------------------------------------------------------------------
    def _own_costs(self, i: int, r: int, charged: Charges) -> dict[str | None, float]:
        """Intra + compute + memory terms of every valid candidate of op i in round r (cached per
        round: they change only with which inputs' gradients another consumer already reduces)."""
        st = self.states[i]
        shared = (
            tuple(pos for pos, name in enumerate(st.op.inputs) if (name, r) in charged)
            if charged
            else ()
        )
        key = (r, st.kind, shared)
        cached = self._cache.get(key)
        if cached is None:
            cached = self._shared_prices.get((self._price_keys[r], *key))
            if cached is not None:
                self._assumed(i, r)  # flags `binding` as computing the prices here would
            else:
                cached = self._shared_prices[self._price_keys[r], *key] = self._compute_own_costs(
                    i, r, charged
                )
            self._cache[key] = cached
        return cached  # shared: callers copy before changing it

    def _greedy_costs(self, i: int, r: int, charged: Charges) -> dict[str | None, float]:
        """Heavy op i's own costs as the greedy pass prices its cuts: with what each leaves the
        transparent ops that follow its layout paying (`followers.follower_excess`)."""
        if not self.followers[i] or self.opts.preset.symbolic:
            return RoundCosts._own_costs(self, i, r, charged)
        inputs = self.states[i].op.inputs
        shared = (
            tuple(p for p, name in enumerate(inputs) if (name, r) in charged) if charged else ()
        )
        cached = self._follow_cache.get((i, shared))
        if cached is None:  # searches that price alike share it at the same states
            states = self.states
            key = ("followers", *self._price_keys[r], r, states[i].kind, shared)
            key += tuple(states[t].kind for t, _, _ in self.followers[i])
            cached = self._shared_prices.get(key)
            if cached is not None:  # flag `binding` as computing the prices here would
                for t in (i, *(f[0] for f in self.followers[i])):
                    self._assumed(t, r)
            else:
                own = RoundCosts._own_costs(self, i, r, charged)
                extra = follower_excess(
                    self.followers[i], list(own), lambda t: RoundCosts._own_costs(self, t, r, set())
                )
                cached = self._shared_prices[key] = {c: v + extra[c] for c, v in own.items()}
            self._follow_cache[i, shared] = cached
        return cached

    def _compute_own_costs(self, i: int, r: int, charged: Charges) -> dict[str | None, float]:
        st, rnd, opts = self.states[i], self.rounds[r], self.opts
        inputs = st.op.inputs
        given = tuple(p for p, name in enumerate(inputs) if (name, r) in charged) if charged else ()
        # intra terms do not depend on how "no cut" is priced: variants that assume alike share
        key = ("intra", self.hopeful, r, st.kind, given)
        intra = self._shared_prices.get(key)
        if intra is None:
            intra = self._shared_prices[key] = self._intra_costs(i, r, charged)
        costs = dict(intra)
        if opts.preset.symbolic:
            cuts = [c for k, c in costs.items() if k is not None]
            if None in costs:
                costs[None] = replicate_symbolic(min(cuts), opts.preset) if cuts else 0.0
        else:
            self._add_compute(i, r, costs)
            self._add_backlog(i, r, costs)
            if self.next_round and i in self.heavy:
                self._add_next_round(i, r, costs)
        if self.memory_lambda:
            for cut in costs:
                costs[cut] += self.memory_lambda * self._kept_bytes(i, cut, rnd)
        return costs

    def _intra_costs(self, i: int, r: int, charged: Charges) -> dict[str | None, float]:
        """Intra-operator collectives of every valid candidate of op i in round r, the inputs
        another reader reduces (`charged`) credited: a function of op i's kind, the round and
        the all-reduce assumption (`_infos`), so variants pricing "no cut" otherwise share it."""
        st, rnd, opts = self.states[i], self.rounds[r], self.opts
        op = st.op
        ins, outs = self._infos(i, r)
        costs: dict[str | None, float] = {}
        for cut in self.candidates[i]:
            if cut is not None and not self._cut_ok(i, cut, rnd.q):
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
        return costs

    def _add_compute(self, i: int, r: int, costs: dict[str | None, float]) -> None:
        """Each candidate pays the roofline compute of its piece above that of an ideal 1/q piece
        (all FLOPs and bytes split): over one round it sums to the evaluator's compute."""
        st, rnd = self.states[i], self.rounds[r]
        div = self.compute_divisor[r]  # later rounds' cuts, when pricing the final compute
        before = math.prod(self.rounds[j].q for j, c in enumerate(st.cuts) if c is not None)
        flops = st.op.flops / before / div
        ins, outs = self._infos(i, r)
        mesh, opts, q = self.mesh, self.opts, rnd.q
        # ops of one label (one evaluator class) with the same FLOPs and operand sizes price
        # their pieces alike, whatever their cuts so far: kept for every round and variant
        sizes = (tuple(x.numel / div for x in ins), tuple(x.numel / div for x in outs))
        key = ("pieces", self.labels[i], q, flops, sizes)
        pieces: Any = self._shared_prices.get(key)
        if pieces is None:
            pieces = self._shared_prices[key] = {}
        splits = [self._split(i, cut) for cut in costs]
        if "ideal" not in pieces or any(split not in pieces for split in splits):
            ins, outs = scaled(ins, div), scaled(outs, div)
            if "ideal" not in pieces:
                pieces["ideal"] = piece_compute(
                    st.op, None, q, flops, ins, outs, opts, mesh, ideal=True
                )
            for cut, split in zip(costs, splits, strict=True):
                if split not in pieces:  # cuts splitting alike price alike
                    pieces[split] = piece_compute(st.op, cut, q, flops, ins, outs, opts, mesh)
        base = pieces["ideal"]
        for cut, split in zip(costs, splits, strict=True):
            costs[cut] += pieces[split] - base

    def _split(self, i: int, cut: str | None) -> tuple[bool, ...] | None:
        """Which operands of op i `cut` splits (None: no cut): a piece's compute depends on the
        cut only through them (static: cached)."""
        found = self._splits.get((i, cut), False)
        if found is False:
            lay = self.layouts[i][cut] if cut is not None else None
            found = self._splits[i, cut] = (
                None if lay is None else tuple(x >= 0 for side in lay for x in side)
            )
        return found  # type: ignore[return-value]

    def _add_backlog(self, i: int, r: int, costs: dict[str | None, float]) -> None:
        """Earlier, slower rounds priced their all-reduces assuming this faster round would shrink
        the operand first (hierarchical reduction). A cut that neither splits nor reduces it
        breaks that assumption: it pays the (q-1)-fold growth of those earlier pieces."""
        st, rnd, graph = self.states[i], self.rounds[r], self.graph
        op = st.op
        for (is_output, pos), history in st.ar_history.items():
            backlog = sum(c for _, c, assumed in history if assumed >> r & 1) * (rnd.q - 1)
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

    def _kept_bytes(self, i: int, cut: str | None, rnd: Round) -> float:
        """Bytes per device this cut leaves replicated (parameters count with their state)."""
        st, graph, opts = self.states[i], self.graph, self.opts
        kept = 0.0
        for pos, name in enumerate(st.op.inputs):
            t = graph.tensors[name]
            if t.role is Role.PARAMETER and layout(st.op, cut, pos, False) < 0:
                kept += param_bytes(st.in_numel[pos], opts.element_bytes(t), opts)
        if opts.train:
            for pos, name in enumerate(st.op.outputs):
                if layout(st.op, cut, pos, True) < 0:
                    kept += st.out_numel[pos] * opts.element_bytes(graph.tensors[name])
        return kept * (rnd.q - 1) / rnd.q

    def _param_peers(self, i: int) -> set[int]:
        """The other readers of op i's parameters (static: cached)."""
        found = self._peers.get(i)
        if found is None:
            op, consumers = self.states[i].op, self.graph.consumers
            found = self._peers[i] = {
                w for pos in self.param_positions[i] for w, _ in consumers[op.inputs[pos]]
            } - {i}
        return found

    def _shared_param_costs(
        self,
        i: int,
        cuts: list[str | None],
        decided: dict[int, str | None],
        only: int | None = None,
    ) -> dict[str | None, float]:
        """Redistribution between this op's reading of a shared parameter and other readers'
        (`only`: that reader's alone)."""
        st, graph = self.states[i], self.graph
        costs = dict.fromkeys(cuts, 0.0)
        for pos in self.param_positions[i]:
            name = st.op.inputs[pos]
            form = self._form(name)
            for other, other_pos in graph.consumers[name]:
                if other != i and other in decided and (only is None or other == only):
                    src = self._in(other, decided[other], other_pos)
                    ctx = self._shared_ctx(other, other_pos, i, pos)
                    for cut in cuts:
                        costs[cut] += self._edge(src, self._in(i, cut, pos), ctx, form)
        return costs

    def _near_costs(
        self, i: int, cuts: list[str | None], rnd: Round, decided: dict[int, str | None]
    ) -> dict[str | None, float]:
        """Redistribution of each candidate against the immediate neighbours decided so far. An
        edge's prices over op i's cuts, given its neighbour's layout, are kept for the round
        (settling revisits the same pairs), and added in edge order as before."""
        layouts = self.layouts
        costs: list[float] | None = None  # none yet: all zero (the first row is kept as is)
        if self.param_positions[i] and any(j in decided for j in self._param_peers(i)):
            shared = self._shared_param_costs(i, cuts, decided)
            costs = [shared[cut] for cut in cuts]  # per cut, in `cuts` order
        known = self._near_cache
        for pos, name, p, p_pos in self._in_adj[i]:
            cut = decided.get(p, _UNDECIDED)
            if cut is not _UNDECIDED:
                src = layouts[p][cut][1][p_pos]  # type: ignore[index]
                key = (i, pos, src)
                prices = known.get(key)
                if prices is None:
                    prices = known[key] = self._edge_prices(i, cuts, pos, src, True, i, pos, name)
                costs = prices if costs is None else list(map(add, costs, prices))
        for pos, name, users in self._out_adj[i]:
            for w, w_pos in users:
                cut = decided.get(w, _UNDECIDED)
                if cut is not _UNDECIDED:
                    dst = layouts[w][cut][0][w_pos]  # type: ignore[index]
                    key = (i, pos, w, w_pos, dst)
                    prices = known.get(key)
                    if prices is None:
                        prices = known[key] = self._edge_prices(
                            i, cuts, pos, dst, False, w, w_pos, name
                        )
                    costs = prices if costs is None else list(map(add, costs, prices))
        if costs is None:
            return dict.fromkeys(cuts, 0.0)
        return dict(zip(cuts, costs, strict=True))

    def _edge_prices(
        self,
        i: int,
        cuts: list[str | None],
        pos: int,
        other: int,
        incoming: bool,
        reader: int,
        reader_pos: int,
        name: str,
    ) -> list[float]:
        """One edge of op i priced under each of its cuts: its input `pos` from a producer's
        layout `other` (`incoming`), or its output `pos` into a reader's layout `other`. Kept
        with the edge's context for every round and variant (`EdgeBook.near`): the round's own
        cache (`_near_costs`) misses when the round is new, not the edge's context. Ops of one
        label lay out their operands alike per cut: copies in other layers read the prices."""
        ctx, form = self._in_ctx[reader][reader_pos], self._form(name)
        key = (self.labels[i], pos, other, incoming, ctx, form, tuple(cuts))
        found = self._near_book.get(key)
        if found is not None:
            return found
        lay, edge, known = self.layouts[i], self._edge, self._edge_cache
        out = self._near_book[key] = []
        for cut in cuts:  # `_edge`, its kept prices read first
            src, dst = (other, lay[cut][0][pos]) if incoming else (lay[cut][1][pos], other)
            c = known.get((src, dst, ctx, form))
            out.append(edge(src, dst, ctx, form) if c is None else c)
        return out

    @staticmethod
    def _pick(costs: dict[str | None, float], extra: dict[str | None, float]) -> str | None:
        best, best_cost = None, float("inf")
        for cut, c in costs.items():  # candidate order; strict < keeps the first of equals
            total = c + extra[cut]
            if total < best_cost:
                best, best_cost = cut, total
        return best

    def _charge(self, i: int, cut: str | None, r: int, charged: Charges) -> None:
        """Mark the inputs whose gradient this cut all-reduces in round r."""
        names = self._reduced_inputs[i].get(cut)
        if names is None:
            op = self.states[i].op
            names = self._reduced_inputs[i][cut] = tuple(
                name
                for pos, name in enumerate(op.inputs)
                if reduces(
                    op,
                    cut,
                    op.signature.inputs[pos],
                    False,
                    name in self.graph.requires_grad,
                    self.opts.train,
                )
            )
        for name in names:
            charged.add((name, r))

    # -- the double recursion -----------------------------------------------------------------
    def begin_round(self, r: int) -> None:
        """The ledger's new round, and no own cost or edge price of the last one."""
        self._cache.clear()
        self._near_cache.clear()
        self._follow_cache.clear()
        super().begin_round(r)

    def round_cost(self, r: int, decided: dict[int, str | None]) -> float:
        """The round's cost of a complete assignment: own terms plus every edge once."""
        layouts, in_ctx, weights, edge = self.layouts, self._in_ctx, self.weights, self._edge
        no_prev, sources, known = self._no_prev_reader, self._sources, self._edge_cache
        total = 0.0
        for i, st in enumerate(self.states):
            cut = decided[i]
            credited = _NONE_CHARGED if no_prev[i] else self._credited(i, r, decided)
            mine = self._own_costs(i, r, credited)[cut]
            if st.credits:
                mine += self._revoked(i, r, decided)
            ins, ctx = layouts[i][cut][0], in_ctx[i]
            for pos, form, j, side, j_pos in sources[i]:  # from its producer or parameter home
                src, dst = layouts[j][decided[j]][side][j_pos], ins[pos]
                c = known.get((src, dst, ctx[pos], form))  # `_edge`, its kept prices first
                mine += edge(src, dst, ctx[pos], form) if c is None else c
            total += weights[i] * mine  # an op and its incoming edges, for each copy
        return total

    def _input_sources(self) -> list[list[tuple[int, int, int, int, int]]]:
        """Per op, the inputs `round_cost` prices an edge into: (position, the tensor's form
        (`_form`), the op whose layout it comes from, 1 for its output or 0 for its input (a
        parameter's first reader), that operand's position), in input order."""
        graph = self.graph
        out: list[list[tuple[int, int, int, int, int]]] = []
        for i, st in enumerate(self.states):
            row: list[tuple[int, int, int, int, int]] = []
            for pos, name in enumerate(st.op.inputs):
                p = graph.producer.get(name)
                if p is not None:
                    row.append((pos, self._form(name), p, 1, self.out_pos[name]))
                elif graph.tensors[name].role is Role.PARAMETER:
                    first, first_pos = graph.consumers[name][0]
                    if first != i:
                        row.append((pos, self._form(name), first, 0, first_pos))
            out.append(row)
        return out
