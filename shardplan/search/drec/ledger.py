"""What D-Rec carries from one round to the next, so that its rounds add up to the evaluator.

`RoundLedger` is the state the rounds done leave in one D-Rec run (the base of
`costs.RoundCosts`, which prices the current round's cuts on it; `tables.SearchTables` holds what
the graph alone decides). Per op, `OpState`; per round:
  * every operand's layout in the rounds done, and per edge its "context": per earlier round how
    its two layouts relate (`relation`: same split, both replicated, all-to-all, gather, slice).
    An edge's price in round r is its MARGINAL cost, `cost.terms.edge_redistribution` with
    rounds 0..r as decided minus with rounds 0..r-1 as decided, on a representative pair of the
    same context (the price depends on the layouts only through their relations), the rounds
    after them assumed split alike on both sides where their q divides some dim of the tensor
    (`_form`'s ahead: so an early round sees the later ones shrink its collectives, as it sees them
    shrink its all-reduces). Summed over the rounds it telescopes to the evaluator's price of
    the whole edge (multi-round all-to-alls included);
  * the all-reduces each op paid (priced as if the faster later rounds that can cut the op shrink
    the operand): such a round that neither splits nor reduces it charges the backlog and grows
    the pieces;
  * the gradient all-reduces another reader paid for an op (the evaluator's share credit: the
    previous reader, same layout, both reduce): owed back in the round where their layouts part;
  * each operand's size before round r and the hierarchical all-reduce divisor (`_infos`: the
    faster rounds done that reduced it, the faster later ones assumed to, `_assumed`).
`begin_round` extends the edges' contexts by the last round in O(|E|) (O(|E| * r) from scratch);
`apply_round` records a decided round in O(|V| * operands); a marginal price costs O(r ** 2) once
per (relation, context, tensor kind) for all the variants of one call (`EdgeBook`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from shardplan.cost.collectives import all_reduce_s
from shardplan.cost.presets import CostOptions
from shardplan.cost.terms import OperandInfo, edge_redistribution, faster, reduces
from shardplan.ir.graph import Graph
from shardplan.ir.op import Role
from shardplan.mesh import Mesh
from shardplan.search.drec.flex import FlexGraph, through_chain
from shardplan.search.drec.state import EXAMPLE, EdgeBook, OpState, relation, trials
from shardplan.search.drec.tables import SearchTables
from shardplan.sharding import REPLICATED, layout_of_cut

_NONE_CHARGED: frozenset[tuple[str, int]] = frozenset()


class RoundLedger:
    """The rounds done of one D-Rec run: per op its state (`OpState`), per edge its context,
    and the marginal prices that follow from them. `RoundCosts` prices the round's cuts on
    top of it (its subclass: one pricer, split by concern)."""

    def __init__(
        self,
        graph: Graph,
        mesh: Mesh,
        opts: CostOptions,
        flex: FlexGraph,
        tables: SearchTables,
        labels: Sequence[int],
        hopeful: bool,
        shared_edges: EdgeBook | None = None,
    ) -> None:
        self.graph, self.mesh, self.opts, self.rounds = graph, mesh, opts, mesh.rounds
        book = shared_edges if shared_edges is not None else EdgeBook()
        self.hopeful = hopeful
        """Assume every faster later round shrinks an all-reduce, even one that cannot cut the op
        (MindSpore's hierarchical pricing; `_assumed`)."""
        self.binding = False
        """Whether some price assumed fewer later rounds than `hopeful` would (set as it runs)."""
        self.labels = list(labels)
        """Interchangeable ops share a label, so (label, cuts so far) keys their prices."""
        self.layouts, self.out_pos = tables.layouts, tables.out_pos
        self._candidates, self._tables = tables.candidates, tables
        self._prev_reader, self._next_readers = tables.prev_reader, tables.next_readers
        self._no_prev_reader = tables.no_prev_reader
        self._grad = graph.requires_grad
        self.faster_than = [
            [(j, other.q) for j, other in enumerate(self.rounds) if j != r and faster(other, rnd)]
            for r, rnd in enumerate(self.rounds)
        ]
        """Per round: (round, q) of every faster other round (hierarchical all-reduces)."""
        self.states = [
            OpState.of(graph, op, label) for op, label in zip(graph.ops, labels, strict=True)
        ]
        for sib in flex.siblings:
            self.states[sib.a].siblings.append(
                (sib.b, sib.a_pos, sib.b_pos, dict(sib.a_to_b), sib.a_via)
            )
            back = {b: a for a, b in sib.a_to_b}
            self.states[sib.b].siblings.append((sib.a, sib.b_pos, sib.a_pos, back, sib.b_via))
        for edge in flex.edges:
            self.states[edge.consumer].preds.append(edge)
            self.states[edge.producer].succs.append(edge)
        self._r = 0
        self._ctx_round = -1
        """The round the edges' contexts stand at (`begin_round`)."""
        self._ctx_list: list[int] = []
        # contexts: per earlier round how an edge's layouts relate, as small ids (`EdgeBook`)
        self._ctx_next, self._ctx_ids, self._ctxs = book.ctx_next, book.ctx_ids, book.ctxs
        self._ctx_moves = book.ctx_moves
        self._in_ctx: list[list[int]] = []
        """Per op, per input: the context of the edge into it (producer or parameter home)."""
        self._flex_ctx: dict[int, int] = {}
        self._sib_ctx: dict[tuple[int, int], int] = {}
        self._param_ctx: dict[tuple[int, int, int, int], int] = {}
        # edge prices, keyed by context (which holds the round): kept across rounds and shared
        self._edge_cache = book.edge_cache
        self._edge_kinds = book.edge_kinds
        self._prev_price = book.prev_price
        self._chain, self._near_book, self._shared_infos = book.chain, book.near, book.infos
        self._chain_ids, self._chain_of, self._kinds = book.chain_ids, book.chain_of, book.kinds
        self._kind_id = book.kind_id
        for st in self.states:  # numbered: prices keyed by kind hash an int, not a history
            st.kind = self._kind_id(st.kind)  # type: ignore[arg-type]
        # per-round caches (cleared by begin_round) and the all-reduce assumptions per round
        self._forms, self._form_of, self._form_ids = book.forms, book.form_of, book.form_ids
        self._info_cache: dict[tuple[object, ...], tuple[list[OperandInfo], list[OperandInfo]]] = {}
        self._assumed_cache: dict[tuple[object, ...], int] = {}
        self._reduced_cache: dict[tuple[int, str | None], tuple[tuple[bool, int], ...]] = {}
        self._shrink_cache: dict[tuple[int, str | None, int, bool], bool] = {}
        self._alike: dict[tuple[int, int, int, int], bool] = {}  # `_alike_so_far`, this round

    def _in(self, i: int, cut: str | None, pos: int) -> int:
        """Op i's layout of input `pos` under `cut` (one round)."""
        return self.layouts[i][cut][0][pos]

    def _out(self, i: int, cut: str | None, pos: int) -> int:
        """Op i's layout of output `pos` under `cut` (one round)."""
        return self.layouts[i][cut][1][pos]

    def _assumed(self, i: int, r: int) -> int:
        """Bit mask of the later, faster rounds that round r's all-reduce prices of op i assume
        will shrink the operand first (hierarchical reduction): those where op i still has a
        valid cut. A round that cannot cut the op (no loop dim divisible by its q) never shrinks
        anything, so counting it would price round r's all-reduces q times too cheap; `hopeful`
        counts it anyway (the rounds still add up: the backlog repays it)."""
        st = self.states[i]
        key = (r, st.kind)
        mask = self._assumed_cache.get(key)
        if mask is None:
            mask = 0
            for j, q in self.faster_than[r]:
                if j <= r:
                    continue
                if self.hopeful or any(
                    c is not None and self._cut_ok(i, c, q) for c in self._candidates[i]
                ):
                    mask |= 1 << j
                else:
                    self.binding = True
            self._assumed_cache[key] = mask
        return mask

    def _cut_ok(self, i: int, cut: str, q: int) -> bool:
        """Whether op i can cut `cut` q ways from its local extents (`SearchTables.cut_ok`)."""
        st = self.states[i]
        return self._tables.cut_ok(st.op, i, cut, st.extents[cut], q)

    def _infos(self, i: int, r: int) -> tuple[list[OperandInfo], list[OperandInfo]]:
        """Operand sizes before round r, with the hierarchical all-reduce divisor: faster rounds
        already done count when they reduced the operand, faster later rounds that can cut the
        op are assumed to (`_assumed`)."""
        key = (r, self.states[i].kind)
        cached = self._info_cache.get(key)
        if cached is not None:
            return cached
        shared = self._shared_infos.get((self.hopeful, *key))
        if shared is not None:  # another search's, at the same kind and assumption
            self._assumed(i, r)  # flags `binding` as computing them here would
            self._info_cache[key] = shared
            return shared
        st = self.states[i]
        op, graph, train = st.op, self.graph, self.opts.train
        out: list[list[OperandInfo]] = [[], []]
        assumed = self._assumed(i, r)
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
                        divisor *= q if assumed >> j & 1 else 1
                    elif layout_of_cut(groups[pos], st.cuts[j], bool(side), op) < 0 and reduces(
                        op, st.cuts[j], groups[pos], bool(side), grad, train
                    ):
                        divisor *= q
                out[side].append(
                    OperandInfo(sizes[pos], self.opts.element_bytes(t), t.role, grad, divisor)
                )
        result = self._info_cache[key] = self._shared_infos[self.hopeful, *key] = (out[0], out[1])
        return result

    def _grow_backlog(self, i: int, r: int, cut: str | None) -> None:
        """Round r's cut neither splits nor reduces an operand: the earlier, slower rounds' pieces
        of its all-reduce stay q times larger (the backlog just charged), so a later faster round
        that also breaks the hierarchy pays on the grown pieces (the backlogs then telescope to
        the evaluator's hierarchical all-reduce exactly)."""
        st, rnd = self.states[i], self.rounds[r]
        credits = (((False, pos), h) for pos, h in st.credits.items())
        for (is_output, pos), history in (*st.ar_history.items(), *credits):
            if self._shrinks(i, cut, pos, is_output):
                continue
            history[:] = [(j, c * rnd.q if m >> r & 1 else c, m) for j, c, m in history]

    def _shrinks(self, i: int, cut: str | None, pos: int, is_output: bool) -> bool:
        """Does `cut` split or all-reduce this operand of op i? (static: cached)"""
        key = (i, cut, pos, is_output)
        out = self._shrink_cache.get(key)
        if out is None:
            op = self.states[i].op
            groups = (op.signature.outputs if is_output else op.signature.inputs)[pos]
            name = (op.outputs if is_output else op.inputs)[pos]
            grad = name in self._grad
            out = self._shrink_cache[key] = layout_of_cut(groups, cut, is_output, op) >= 0 or (
                reduces(op, cut, groups, is_output, grad, self.opts.train)
            )
        return out

    def _parted(self, i: int, pos: int, decided: dict[int, str | None]) -> bool:
        """Do op i's input `pos` and its previous reader's part in this round (their layouts
        agreed in the rounds before)?"""
        p, p_pos = self._prev_reader[i][pos]  # type: ignore[misc]
        return self._in(p, decided.get(p), p_pos) != self._in(i, decided.get(i), pos)

    def _revoked(self, i: int, r: int, decided: dict[int, str | None]) -> float:
        """The all-reduces the previous reader paid for op i in earlier rounds, owed back now
        that their layouts part (the evaluator's credit needs them equal in every round), each
        with this round's backlog if the cut breaks the hierarchy (`_add_backlog`)."""
        st, rnd = self.states[i], self.rounds[r]
        total = 0.0
        for pos, entries in st.credits.items():
            if entries and self._parted(i, pos, decided):
                grow = not self._shrinks(i, decided.get(i), pos, False)
                for _, c, assumed in entries:
                    total += c * rnd.q if grow and assumed >> r & 1 else c
        return total

    def _credit_costs(
        self, i: int, r: int, cuts: list[str | None], decided: dict[int, str | None]
    ) -> dict[str | None, float]:
        """What each cut of op i costs in credits owed back (`_revoked`): its own, if its reading
        parts from the previous reader's (decided), and those of decided later readers whose
        reading it parts from. A tied embedding that splits its table while the output layer
        keeps it whole makes the output layer repay its gradient credits: the cut pays for it."""
        later = [j for j in self._next_readers[i] if j in decided and self.states[j].credits]
        st = self.states[i]
        mine = any(  # its own credits only against a decided previous reader
            entries and self._prev_reader[i][pos][0] in decided  # type: ignore[index]
            for pos, entries in st.credits.items()
        )
        costs = dict.fromkeys(cuts, 0.0)
        if not later and not mine:
            return costs
        for cut in trials(decided, i, cuts):  # `_parted` reads op i's cut from `decided`
            own = self._revoked(i, r, decided) if mine else 0.0
            costs[cut] = own + sum(self._revoked(j, r, decided) for j in later)
        return costs

    def _local_costs(
        self, i: int, r: int, decided: dict[int, str | None]
    ) -> tuple[dict[str | None, float], dict[str | None, float]]:
        """Op i's own terms per valid cut with the gradient credits `round_cost` grants it, and
        what the cut changes elsewhere in the round: edges to decided neighbours, credits owed
        back (`_credit_costs`) and the credits decided later readers of its inputs earn or lose.
        Their sum differs from op i's share of `round_cost` by a constant, so re-picking by it
        never raises the round's cost (up to the shared-parameter edges, priced pairwise)."""
        alone = self._own_costs(i, r, _NONE_CHARGED)
        cuts = list(alone)
        following = self._next_readers[i]
        later = [j for j in following if j in decided and j != i] if following else following
        extra = self._near_costs(i, cuts, self.rounds[r], decided)
        if not later and not self.states[i].credits and self._no_prev_reader[i]:
            return alone, extra  # no other reader of its inputs: no credit either way
        own: dict[str | None, float] = {}
        owed = self._credit_costs(i, r, cuts, decided)
        for cut in trials(decided, i, cuts):  # credits read op i's cut from `decided`
            own[cut] = self._own_costs(i, r, self._credited(i, r, decided))[cut]
            extra[cut] += owed[cut]
            for j in later:
                extra[cut] += self._own_costs(j, r, self._credited(j, r, decided))[decided[j]]
        return own, extra

    def _record_all_reduces(
        self, i: int, r: int, decided: dict[int, str | None]
    ) -> tuple[int, ...]:
        """Remember the all-reduces round r's cut pays (not those another reader pays); returns
        the input positions skipped so."""
        st, rnd, cut = self.states[i], self.rounds[r], decided.get(i)
        skipped: list[int] = []
        for pos, entries in st.credits.items():
            if entries and self._parted(i, pos, decided):  # owed back: a normal piece again
                st.ar_history.setdefault((False, pos), []).extend(entries)
                entries.clear()
                skipped.append(-1 - pos)
        if cut is None or self.opts.preset.symbolic:
            return tuple(skipped)
        reduced = self._reduced_operands(i, cut)
        if not reduced:
            return tuple(skipped)
        ins, outs = self._infos(i, r)
        credited = self._credited(i, r, decided) if self.opts.train else set()
        assumed, names, prev = self._assumed(i, r), st.op.inputs, self._prev_reader[i]
        for is_output, pos in reduced:
            info = (outs if is_output else ins)[pos]
            nbytes = info.numel * info.dtype_bytes / info.ar_divisor
            piece = (r, all_reduce_s(nbytes, rnd.q, rnd.bandwidth_bytes_per_s), assumed)
            # credited by name; a position without a previous reader (a tensor read twice) has none
            if not is_output and prev[pos] is not None and (names[pos], r) in credited:
                st.credits.setdefault(pos, []).append(piece)
                skipped.append(pos)
                continue
            st.ar_history.setdefault((is_output, pos), []).append(piece)
        return tuple(skipped)

    def _reduced_operands(self, i: int, cut: str | None) -> tuple[tuple[bool, int], ...]:
        """(is_output, position) of the operands op i's `cut` all-reduces, inputs first
        (static: cached per op and cut)."""
        out = self._reduced_cache.get((i, cut))
        if out is None:
            op, train = self.states[i].op, self.opts.train
            out = tuple(
                (is_output, pos)
                for is_output, groups, names in (
                    (False, op.signature.inputs, op.inputs),
                    (True, op.signature.outputs, op.outputs),
                )
                for pos, name in enumerate(names)
                if reduces(op, cut, groups[pos], is_output, name in self._grad, train)
            )
            self._reduced_cache[i, cut] = out
        return out

    def _edge(self, src: int, dst: int, ctx: int, form: int) -> float:
        """Marginal price of one edge in the current round: round r's layouts `src` -> `dst`
        after the earlier rounds' context `ctx`, of a tensor of form `form` (`_form`)."""
        key = (src, dst, ctx, form)
        cost = self._edge_cache.get(key)
        if cost is None:
            shape = self._forms[form]
            if src == dst and (not self._ctx_moves[ctx] or shape[3][self._r] == (src < 0)):
                cost = 0.0  # nothing moves now or before, or this round as the earlier ones
                # assumed it: nothing grows or shrinks
            else:
                kind = (relation(src, dst), ctx, *shape)
                cost = self._edge_kinds.get(kind)
                if cost is None:
                    cost = self._edge_kinds[kind] = self._marginal(*kind)
            self._edge_cache[key] = cost  # (kept, so callers may read the cache first)
        return cost

    def _form(self, name: str) -> int:
        """The number of tensor `name`'s form, (size, element width, gradient status, ahead):
        tensors of one form price alike (layer copies share edge prices). Ahead, per round, is
        the relation an edge of it is assumed to have while the round is not decided: 0 (split
        alike on both sides) where the round's q divides some dim of it, else 1 (replicated).
        Assumed split, a later round shrinks this round's collective, as faster later rounds are
        assumed to shrink an all-reduce (`_assumed`); a later round that does not keep it split
        repays the growth (marginal prices still telescope). Symbolic preset: 1 (MindSpore)."""
        found = self._form_of.get(name)
        if found is None:
            t = self.graph.tensors[name]
            shape, symbolic = t.shape, self.opts.preset.symbolic
            ahead = tuple(
                int(symbolic or not any(n % rnd.q == 0 for n in shape)) for rnd in self.rounds
            )
            form = (float(t.numel), self.opts.element_bytes(t), name in self._grad, ahead)
            found = self._form_ids.get(form)
            if found is None:
                found = self._form_ids[form] = len(self._forms)
                self._forms.append(form)
            self._form_of[name] = found
        return found

    def _marginal(
        self, rel: int, ctx: int, numel: float, width: int, grad: bool, ahead: tuple[int, ...]
    ) -> float:
        """The edge's price over rounds 0..r, then as assumed (`_form`'s ahead), minus its
        price over rounds 0..r-1, then as assumed from round r on (see the module doc)."""
        r, rounds, opts = self._r, self.rounds, self.opts
        codes = self._ctxs[ctx]
        src = tuple(EXAMPLE[c][0] for c in codes)
        dst = tuple(EXAMPLE[c][1] for c in codes)
        later_src = tuple(EXAMPLE[c][0] for c in ahead[r + 1 :])
        later_dst = tuple(EXAMPLE[c][1] for c in ahead[r + 1 :])
        key = (ctx, numel, width, grad, ahead)
        before = self._prev_price.get(key)
        if before is None:
            a, b = EXAMPLE[ahead[r]]
            before = self._prev_price[key] = edge_redistribution(
                (*src, a, *later_src), (*dst, b, *later_dst), numel, width, rounds, grad, opts
            ).total
        a, b = EXAMPLE[rel]
        now = edge_redistribution(
            (*src, a, *later_src), (*dst, b, *later_dst), numel, width, rounds, grad, opts
        ).total
        return now - before

    def _ctx(self, src: Sequence[int], dst: Sequence[int]) -> int:
        """The id of the context of an edge whose layouts in the rounds done are src, dst."""
        codes = tuple(map(relation, src, dst))
        ctx = self._ctx_ids.get(codes)
        if ctx is None:
            ctx = self._ctx_ids[codes] = len(self._ctxs)
            self._ctxs.append(codes)
            self._ctx_moves.append(any(c >= 2 for c in codes))
        return ctx

    def begin_round(self, r: int) -> None:
        """Clear the round's caches and bring every edge's context to round r: from the last
        round's layouts when the contexts stand at round r - 1 (O(|E|)), else from all the
        rounds done (O(|E| * r)). Edge prices stay: their contexts hold the round."""
        self._r = r
        self._info_cache.clear()
        self._param_ctx.clear()
        self._alike.clear()
        if r != self._ctx_round:  # contexts depend on the rounds before r only
            self._contexts(r - 1 if r == self._ctx_round + 1 and r > 0 else None)
            self._ctx_round = r

    def _edge_pairs(self) -> Iterator[tuple[Sequence[int], Sequence[int]]]:
        """Every edge's layouts in the rounds done, in the order of the contexts' tables: inputs
        of each op (from the producer or the parameter's first reader), flex edges (through
        their chains), sibling edges."""
        graph, states, so_far = self.graph, self.states, self._layout_so_far
        for i, st in enumerate(states):
            for pos, name in enumerate(st.op.inputs):
                p = graph.producer.get(name)
                if p is not None:
                    src = so_far(p, self.out_pos[name], True)
                elif graph.tensors[name].role is Role.PARAMETER:
                    first, first_pos = graph.consumers[name][0]
                    src = so_far(first, first_pos, False)
                else:
                    src = so_far(i, pos, False)
                yield src, so_far(i, pos, False)
        for i, st in enumerate(states):
            for e in st.preds:
                pairs = zip(
                    so_far(e.producer, e.out_pos, True), so_far(i, e.in_pos, False), strict=True
                )
                chained = [through_chain(e, a, b, True) for a, b in pairs]
                yield [a for a, _ in chained], [b for _, b in chained]
        for i, st in enumerate(states):
            for other, pos, other_pos, to_other, _ in st.siblings:
                mine = [to_other.get(a, REPLICATED) if a >= 0 else a for a in so_far(i, pos, True)]
                yield mine, so_far(other, other_pos, True)

    def _contexts(self, last: int | None) -> None:
        """Every edge's context from its layouts (`_edge_pairs`): all rounds done (`last`
        None), or the previous context extended by round `last`'s relation (`_last_codes`)."""
        if last is None and not any(st.cuts for st in self.states):  # no round done yet
            size = sum(len(st.preds) + len(st.siblings) for st in self.states)
            out = [self._ctx((), ())] * (len(self._tables.in_edges) + size)
        elif last is None:
            out = [self._ctx(src, dst) for src, dst in self._edge_pairs()]
        else:
            following, extend = self._ctx_next, self._extend
            out = []
            for ctx, code in zip(self._ctx_list, self._last_codes(last), strict=True):
                nxt = following.get((ctx, code))
                out.append(extend(ctx, code) if nxt is None else nxt)
        self._ctx_list = out
        k = 0
        self._in_ctx = []
        for st in self.states:
            n = len(st.op.inputs)
            self._in_ctx.append(out[k : k + n])
            k += n
        self._flex_ctx.clear()
        for st in self.states:
            for e in st.preds:
                self._flex_ctx[id(e)] = out[k]
                k += 1
        self._sib_ctx.clear()
        for i, st in enumerate(self.states):
            for s in range(len(st.siblings)):
                self._sib_ctx[i, s] = out[k]
                k += 1

    def _last_codes(self, last: int) -> list[int]:
        """`relation` of every edge's layouts in round `last` alone, in `_edge_pairs`' order,
        read off the round's cuts (the layouts `apply_round` appended). O(|E|)."""
        states, lay = self.states, self.layouts
        now = [lay[i][st.cuts[last]] for i, st in enumerate(states)]  # (ins, outs) per op
        codes: list[int] = []
        for i, pos, j, side, j_pos in self._tables.in_edges:  # `relation`, inlined
            src, dst = now[j][side][j_pos], now[i][0][pos]
            if src == dst:
                codes.append(0 if src >= 0 else 1)
            elif src >= 0:
                codes.append(2 if dst >= 0 else 3)
            else:
                codes.append(4)
        for i, st in enumerate(states):
            mine = now[i][0]
            for e in st.preds:
                codes.append(
                    relation(*through_chain(e, now[e.producer][1][e.out_pos], mine[e.in_pos], True))
                )
        for i, st in enumerate(states):
            outs = now[i][1]
            for other, pos, other_pos, to_other, _ in st.siblings:
                a = outs[pos]
                a = to_other.get(a, REPLICATED) if a >= 0 else a
                codes.append(relation(a, now[other][1][other_pos]))
        return codes

    def _extend(self, ctx: int, code: int) -> int:
        """The context `ctx` followed by one more round whose layouts relate as `code`."""
        key = (ctx, code)
        out = self._ctx_next.get(key)
        if out is None:
            codes = (*self._ctxs[ctx], code)
            out = self._ctx_ids.get(codes)
            if out is None:
                out = self._ctx_ids[codes] = len(self._ctxs)
                self._ctxs.append(codes)
                self._ctx_moves.append(any(c >= 2 for c in codes))
            self._ctx_next[key] = out
        return out

    def _shared_ctx(self, other: int, other_pos: int, i: int, pos: int) -> int:
        key = (other, other_pos, i, pos)
        ctx = self._param_ctx.get(key)
        if ctx is None:
            ctx = self._param_ctx[key] = self._ctx(
                self._layout_so_far(other, other_pos, False), self._layout_so_far(i, pos, False)
            )
        return ctx

    def _layout_so_far(self, i: int, pos: int, is_output: bool) -> tuple[int, ...]:
        """Op i's layout of operand `pos` in each round done (outputs resolved: partial sums
        replicated), from its cuts. O(rounds)."""
        lay, side = self.layouts[i], int(is_output)
        return tuple(lay[c][side][pos] for c in self.states[i].cuts)

    def _alike_so_far(self, p: int, p_pos: int, i: int, pos: int) -> bool:
        """Do op p's input `p_pos` and op i's input `pos` have one layout in every round done?"""
        lay_p, lay_i = self.layouts[p], self.layouts[i]
        return all(
            lay_p[a][0][p_pos] == lay_i[b][0][pos]
            for a, b in zip(self.states[p].cuts, self.states[i].cuts, strict=True)
        )

    def apply_round(self, r: int, decided: dict[int, str | None]) -> None:
        """Round r is decided: record its all-reduces, cuts, layouts and the local sizes."""
        rnd, symbolic = self.rounds[r], self.opts.preset.symbolic
        skipped: list[tuple[int, ...]] = []
        for i, st in enumerate(self.states):  # before any layout grows: credits compare prefixes
            if st.ar_history or st.credits:  # else nothing to grow
                self._grow_backlog(i, r, decided.get(i))
            if not st.credits and (symbolic or decided.get(i) is None):
                skipped.append(())  # nothing owed back, nothing reduced
            else:
                skipped.append(self._record_all_reduces(i, r, decided))
        kinds, kind_id = self._kinds, self._kind_id
        for i, st in enumerate(self.states):
            cut = decided.get(i)
            st.cuts.append(cut)
            # ops of one kind must keep equal all-reduce histories (they share prices)
            key = (st.kind, (cut, skipped[i]) if skipped[i] else cut)
            kind = kinds.get(key)
            st.kind = kind_id(key) if kind is None else kind
            if cut is None:
                continue
            ins, outs = self.layouts[i][cut]
            st.extents[cut] //= rnd.q
            for pos in range(len(st.op.inputs)):
                if ins[pos] >= 0:
                    st.in_numel[pos] /= rnd.q
            for pos in range(len(st.op.outputs)):
                if outs[pos] >= 0:
                    st.out_numel[pos] /= rnd.q

    def _credited(self, i: int, r: int, decided: dict[int, str | None]) -> set[tuple[str, int]]:
        """The inputs whose gradient all-reduce op i need not pay in round r: as the evaluator's
        `share_credit`, the previous reader of the tensor reads it in the same layout (in the
        rounds so far, this one included) and reduces it in this round too. (The evaluator also
        needs the later rounds' layouts to agree, which no round can see.)"""
        out: set[tuple[str, int]] = set()
        if self._no_prev_reader[i]:
            return out
        cut, names, alike = decided.get(i), self.states[i].op.inputs, self._alike
        mine = self._reduced_operands(i, cut)  # `reduces`, per op and cut
        for pos, prev in enumerate(self._prev_reader[i]):
            if prev is None or (False, pos) not in mine:
                continue
            p, p_pos = prev
            p_cut = decided.get(p)
            if (False, p_pos) in self._reduced_operands(p, p_cut) and self._in(
                p, p_cut, p_pos
            ) == self._in(i, cut, pos):
                same = alike.get((p, p_pos, i, pos))  # layouts so far: fixed in the round
                if same is None:
                    same = alike[p, p_pos, i, pos] = self._alike_so_far(p, p_pos, i, pos)
                if same:
                    out.add((names[pos], r))
        return out
