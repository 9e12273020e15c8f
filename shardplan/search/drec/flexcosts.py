"""D-Rec's prices of the edges between heavy ops: flex edges (through chains of transparent
ops), sibling edges, and the pairs the greedy pass's lookahead prices.

A mixin of `costs.RoundCosts` (it reads the ledger's layouts, contexts and edge prices):
`_flex_costs` prices every cut of a heavy op against its decided heavy neighbours; when one more
neighbour decides, `_flex_added` adds that pair's edges alone (static parts kept per pair);
the lookahead (`search._Search._lookahead`) prices one neighbour's layouts against another's
through `_chain_price` too, on the pairs `_flex_pairs`, `_pair_view` and `_pair_edges` table
(per search; the search keeps their caches). An edge's price through its chain is kept per
(edge's dim map, direction, tensor form, layouts, context) for every round and variant of one
call (`EdgeBook.chain`): copies of an edge in repeated layers share it.
O(edges to the pair x cuts) per call.
"""

from __future__ import annotations

from typing import Any

from shardplan.mesh import Round
from shardplan.search.drec.flex import ELSEWHERE, FlexEdge, through_chain
from shardplan.sharding import REPLICATED

_Task = tuple[int, int, Any, FlexEdge | None, bool, int, int, str, Any]
"""One edge of an op to a decided neighbour (`FlexPrices._flex_costs`): (side, operand position,
set key or None, flex edge or None for a sibling edge, into the op?, the neighbour's layout,
context, tensor, sibling dim map)."""


class FlexPrices:
    """`RoundCosts`' prices of edges between heavy ops (mixed into it; uses its state)."""

    def _flex_costs(
        self,
        i: int,
        cuts: list[str | None],
        rnd: Round,
        decided: dict[int, str | None],
        only: int | None = None,
        shared: dict[tuple[object, ...], dict[str | None, float]] | None = None,
    ) -> dict[str | None, float]:
        """Redistribution of each of `cuts` against the decided heavy neighbours: flex edges (a
        split a chain cannot carry gathers on the way), sibling edges (splits must meet on the
        shared op's dims) and other readers of a shared parameter. `only`: the edges to that
        one decided neighbour alone (added to a neighbour's prices when it decides). Edges one
        layout change serves are charged once, at the dearest (`shared`: each set's charge per
        layout so far): those leaving one output through one transparent op towards one layout
        with one history, and those arriving at one input through a chain from producers
        laid out alike (the embeddings' output is gathered once, not once per layer's reader)."""
        st, costs = self.states[i], dict.fromkeys(cuts, 0.0)
        op, shared = st.op, {} if shared is None else shared
        tasks: list[_Task] = []
        preds, succs, siblings = st.preds, st.succs, enumerate(st.siblings)
        if only is not None:  # the edges to that one neighbour, in the same order
            preds, succs, siblings = self._edges_to(i, only)
        for incoming, edges in ((True, preds), (False, succs)):
            for e in edges:
                j = e.producer if incoming else e.consumer
                if j not in decided or (only is not None and j != only):
                    continue
                if incoming:  # the producer's output layout meets this op's input
                    theirs, side, pos = self._out(j, decided[j], e.out_pos), 0, e.in_pos
                    seen = e.forward.get(theirs, ELSEWHERE) if theirs >= 0 else theirs
                else:  # this op's output meets the consumer's input layout
                    theirs, side, pos = self._in(j, decided[j], e.in_pos), 1, e.out_pos
                    seen = e.backward.get(theirs, ELSEWHERE) if theirs >= 0 else theirs
                name = op.inputs[pos] if incoming else op.outputs[pos]
                ctx = self._flex_ctx[id(e)]
                key = None if e.via < 0 else (side, pos, -1 if incoming else e.via, seen, ctx)
                tasks.append((side, pos, key, e, incoming, theirs, ctx, name, None))
        for k, (other, pos, other_pos, to_other, via) in siblings:
            if other not in decided or (only is not None and other != only):
                continue
            theirs = self._out(other, decided[other], other_pos)
            ctx, name = self._sib_ctx[i, k], self.states[other].op.outputs[other_pos]
            seen = ELSEWHERE if theirs >= 0 else theirs
            for mine, at in to_other.items():
                seen = mine if at == theirs and theirs >= 0 else seen
            key = (1, pos, via, seen, ctx)  # one layout change at `via` serves flex edges too
            tasks.append((1, pos, key, None, False, theirs, ctx, name, to_other))
        valid = tuple(cuts)
        for task in tasks:
            for cut, c in zip(cuts, self._priced(i, cuts, valid, task, shared), strict=True):
                costs[cut] += c
        if self.param_positions[i] and (only is None or only in self._param_peers(i)):
            shared_params = self._shared_param_costs(i, cuts, decided, only)
            for cut in cuts:
                costs[cut] += shared_params[cut]
        return costs

    def _edges_to(
        self, i: int, k: int
    ) -> tuple[list[FlexEdge], list[FlexEdge], list[tuple[int, Any]]]:
        """Op i's flex edges from and to op k and its sibling edges (index, entry) with it, in
        `_flex_costs`' order (static: cached per pair)."""
        found = self._edges_to_cache.get((i, k))
        if found is None:
            st = self.states[i]
            found = self._edges_to_cache[i, k] = (
                [e for e in st.preds if e.producer == k],
                [e for e in st.succs if e.consumer == k],
                [(n, sib) for n, sib in enumerate(st.siblings) if sib[0] == k],
            )
        return found

    def _chain_price(
        self, e: FlexEdge, src: int, dst: int, into_consumer: bool, ctx: int, name: str
    ) -> float:
        """`_edge` of flex edge e's layouts through its chain (`flex.through_chain`), kept by
        (edge, direction, layouts, context) for every round and variant (`EdgeBook.chain`)."""
        c = self._chain[self._chain_id(e, into_consumer, name), src, dst, ctx] = self._edge(
            *through_chain(e, src, dst, into_consumer), ctx, self._form(name)
        )
        return c

    def _chain_id(self, e: FlexEdge, into_consumer: bool, name: str) -> int:
        """The number of flex edge e's pricing in one direction: its dim map, the direction and
        the form of the tensor priced (`_form`) decide its prices through the chain, so the
        copies of an edge in repeated layers share them (`EdgeBook.chain`)."""
        key = (id(e), into_consumer)
        found = self._chain_of.get(key)
        if found is None:
            kind = (e.to_consumer, into_consumer, self._form(name))
            found = self._chain_ids.get(kind)
            if found is None:
                found = self._chain_ids[kind] = len(self._chain_ids)
            self._chain_of[key] = found
        return found

    def _priced(
        self,
        i: int,
        cuts: list[str | None],
        valid: tuple[str | None, ...],
        task: _Task,
        shared: dict[tuple[object, ...], dict[int, float]],
    ) -> list[float]:
        """Each cut's price on one of op i's edges to a decided neighbour (`_flex_costs`' task),
        by the layout it puts on the edge (cuts laying it out alike price alike); with the
        task's set key, above the set's charge so far for that layout (`shared`, updated).
        `valid`: `cuts` as a tuple."""
        side, pos, key, e, incoming, theirs, ctx, name, to_other = task
        found = self._cut_layouts.get((i, side, pos, valid))
        if found is None:  # per cut the layout it puts on the operand, and the distinct ones
            lay = self.layouts[i]
            mines = [lay[cut][side][pos] for cut in cuts]
            found = self._cut_layouts[i, side, pos, valid] = (mines, list(dict.fromkeys(mines)))
        mines, distinct = found
        chain = self._chain
        priced: dict[int, float] = {}
        charged = None if key is None else shared.setdefault(key, {})
        cid = -1 if e is None else self._chain_id(e, incoming, name)
        for mine in distinct:  # in the cuts' order of first use, as the charges accrue
            if e is None:  # a sibling edge: my split carried onto the shared op's dims
                met = to_other.get(mine, REPLICATED) if mine >= 0 else mine
                c = self._edge(met, theirs, ctx, self._form(name))
            elif incoming:  # a flex edge, through the chain's layout rules
                c = chain.get((cid, theirs, mine, ctx))
                if c is None:
                    c = self._chain_price(e, theirs, mine, True, ctx, name)
            else:
                c = chain.get((cid, mine, theirs, ctx))
                if c is None:
                    c = self._chain_price(e, mine, theirs, False, ctx, name)
            if charged is not None:  # the set's charge for this layout so far
                old = charged.get(mine)
                if old is not None and c <= old:
                    c = 0.0
                else:
                    charged[mine] = c
                    c -= old or 0.0
            priced[mine] = c
        return [priced[mine] for mine in mines]

    def _flex_added(
        self,
        i: int,
        costs: dict[str | None, float],
        decided: dict[int, str | None],
        k: int,
        shared: dict[tuple[object, ...], dict[int, float]],
    ) -> dict[str | None, float]:
        """Op i's flex costs `costs` plus its edges to op k, just decided: `costs` plus
        `_flex_costs(i, list(costs), ..., only=k, shared)`, the same tasks priced in the same
        order, from the pair's edges kept per pair (`_pair_tasks`); `costs` itself when they
        add nothing."""
        if k not in decided:
            return costs
        cuts = list(costs)
        valid = tuple(cuts)
        edges, siblings, params = self._pair_tasks(i, k)
        ins, outs = self.layouts[k][decided[k]]
        flex_ctx = self._flex_ctx
        delta: list[float] | None = None
        for e, incoming, pos, via, name in edges:
            if incoming:  # k's output layout meets op i's input
                theirs = outs[e.out_pos]
                seen = e.forward.get(theirs, ELSEWHERE) if theirs >= 0 else theirs
            else:  # op i's output meets k's input layout
                theirs = ins[e.in_pos]
                seen = e.backward.get(theirs, ELSEWHERE) if theirs >= 0 else theirs
            ctx = flex_ctx[id(e)]
            key = None if e.via < 0 else (1 - incoming, pos, via, seen, ctx)
            task = (1 - incoming, pos, key, e, incoming, theirs, ctx, name, None)
            prices = self._priced(i, cuts, valid, task, shared)
            delta = prices if delta is None else [a + b for a, b in zip(delta, prices, strict=True)]
        for n, pos, other_pos, to_other, via, name in siblings:
            theirs = outs[other_pos]
            seen = ELSEWHERE if theirs >= 0 else theirs
            for mine, at in to_other.items():
                seen = mine if at == theirs and theirs >= 0 else seen
            ctx = self._sib_ctx[i, n]
            task = (1, pos, (1, pos, via, seen, ctx), None, False, theirs, ctx, name, to_other)
            prices = self._priced(i, cuts, valid, task, shared)
            delta = prices if delta is None else [a + b for a, b in zip(delta, prices, strict=True)]
        if params:
            extra = self._shared_param_costs(i, cuts, decided, k)
            prices = [extra[cut] for cut in cuts]
            delta = prices if delta is None else [a + b for a, b in zip(delta, prices, strict=True)]
        if delta is None or not any(delta):
            return costs  # nothing added (x + 0.0 == x)
        return {cut: v + d for (cut, v), d in zip(costs.items(), delta, strict=True)}

    def _pair_tasks(
        self, i: int, k: int
    ) -> tuple[
        list[tuple[FlexEdge, bool, int, int, str]],
        list[tuple[int, int, int, dict[int, int], int, str]],
        bool,
    ]:
        """The static part of op i's edges to op k (`_flex_added`), in `_flex_costs`' order:
        flex edges (edge, into op i?, op i's operand position, the set's via, tensor), sibling
        edges (index, my output position, its output position, dim map, via, tensor), and
        whether they share a parameter. Cached per pair."""
        found = self._pair_task_cache.get((i, k))
        if found is None:
            op = self.states[i].op
            preds, succs, siblings = self._edges_to(i, k)
            edges = [(e, True, e.in_pos, -1, op.inputs[e.in_pos]) for e in preds]
            edges += [(e, False, e.out_pos, e.via, op.outputs[e.out_pos]) for e in succs]
            sibs = [
                (n, pos, other_pos, to_other, via, self.states[k].op.outputs[other_pos])
                for n, (_, pos, other_pos, to_other, via) in siblings
            ]
            params = bool(self.param_positions[i]) and k in self._param_peers(i)
            found = self._pair_task_cache[i, k] = (edges, sibs, params)
        return found

    def _pair_edges(
        self, i: int, j: int, preds: list[FlexEdge], succs: list[FlexEdge]
    ) -> list[tuple[int, bool, int, FlexEdge, str]]:
        """Op j's flex edges to op i (`_pair_view`'s: from it, then to it), as (the
        edge's pricing number (`_chain_id`), into j?, context this round, edge, tensor): what the
        lookahead prices them by. All but the context kept per edge list."""
        static = self._pair_static.get((i, j))
        if static is None:
            op, number = self.states[j].op, self._chain_id
            static = [(e, True, op.inputs[e.in_pos]) for e in preds]
            static += [(e, False, op.outputs[e.out_pos]) for e in succs]
            static = [(number(e, into, name), into, id(e), e, name) for e, into, name in static]
            self._pair_static[i, j] = static
        flex_ctx = self._flex_ctx
        return [(cid, into, flex_ctx[eid], e, name) for cid, into, eid, e, name in static]

    def _flex_pairs(self, i: int) -> list[int]:
        """Op i's flex neighbours (consumers and producers), in graph order (cached: static)."""
        out = self._flex_pair_cache.get(i)
        if out is None:
            st = self.states[i]
            nbrs = {e.consumer for e in st.succs} | {e.producer for e in st.preds}
            out = self._flex_pair_cache[i] = sorted(nbrs - {i})
        return out

    def _pair_view(
        self, i: int, j: int
    ) -> tuple[
        list[FlexEdge],
        list[FlexEdge],
        dict[str | None, tuple[int, ...]],
        dict[str | None, tuple[int, ...]],
    ]:
        """Op j's flex edges from and to op i, and per cut the layouts on them: op j's (inputs
        from i, outputs to i) and op i's (its outputs into j, its inputs from j). Layouts per cut
        are the graph's, so this is computed once per pair and search."""
        view = self._pair_views.get((i, j))
        if view is None:
            sj = self.states[j]
            preds = [e for e in sj.preds if e.producer == i]
            succs = [e for e in sj.succs if e.consumer == i]
            lay_j, lay_i = self.layouts[j], self.layouts[i]
            keys = {
                cj: tuple(lay_j[cj][0][e.in_pos] for e in preds)
                + tuple(lay_j[cj][1][e.out_pos] for e in succs)
                for cj in self.candidates[j]
            }
            views = {
                c: tuple(lay_i[c][1][e.out_pos] for e in preds)
                + tuple(lay_i[c][0][e.in_pos] for e in succs)
                for c in self.candidates[i]
            }
            view = self._pair_views[i, j] = (preds, succs, keys, views)
        return view


__all__ = ["FlexPrices"]
