"""D-Rec, the Double-Recursive search (Wang, Li, Tachon et al., Euro-Par 2021), made general.

Outer recursion over the devices: one round per prime factor q of the mesh (outermost axis
first); in each round every operator cuts one loop dim q ways or none, and local sizes shrink.
Inner pass over the graph, per round r (prices: `costs.RoundCosts`):
  1. heavy operators (see flex.py), heaviest first — weight = the largest cost among their valid
     cuts, ties by graph index — each pick the cut c minimising
        own(c) + sum over flex neighbours decided in round r of redist(c) + lookahead(c)
     where own = intra-op collectives + extra compute of "no cut" + backlog [+ lambda * bytes
     kept replicated, under a memory budget] + what c leaves the transparent ops that follow
     its layout paying above their cheapest cut (`RoundCosts._greedy_costs`), and
     lookahead(c) is the largest extra cost c forces on an undecided flex neighbour (its best
     answer given c and its own decided neighbours, over its best without c; a neighbour that
     decides with other readers of its input is priced at its share of their total, as they
     will pay it). Heavy readers of one activation (q, k, v) decide together, since only a
     common cut lets them share their input's gradient all-reduce;
  2. layout-transparent operators then take their cut from their immediate neighbours: a forward
     pass in topological order, then a backward pass (reverse order) against all neighbours, so a
     chain between two heavy ops carries one layout unless the chain itself forces a change;
  3. the result is compared, by the round's full cost, with whole-round alternatives: every heavy
     op continuing its previous cut, every one cutting its result's leading dim, and the round
     left unused (all replicated); the cheapest is locally improved op by op (bounded worklist).
`drec()` runs this for a few variants (how "no cut" is priced, which heavy ops go first, leading
mesh axes left unused, how hopefully all-reduces are priced, whether heavy ops see the next
round), polishes each plan by exact single-op moves across rounds (`polish.py`, linear per
sweep) and keeps the plan the evaluator scores lowest.
Cost: per round O(|V| log |V| + |E| * budget) — a sort plus dictionary look-ups — so the search is
O((|V| log |V| + |E|) * rounds * variants), variants <= 2 * (3 + mesh axes) + 1: linear in the
graph, logarithmic in the devices.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from shardplan.cost.evaluate import ScoreCache
from shardplan.cost.presets import CostOptions
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.search.drec.blocks import with_block_copies
from shardplan.search.drec.columns import with_column_moves
from shardplan.search.drec.costs import RoundCosts
from shardplan.search.drec.flex import FlexEdge, build_flex_graph
from shardplan.search.drec.fold import Fold, find_fold
from shardplan.search.drec.gates import without_gc_pauses
from shardplan.search.drec.overlay import Overlay
from shardplan.search.drec.polish import pair_polished
from shardplan.search.drec.redecide import with_round_redecided
from shardplan.search.drec.roundorder import with_round_orders
from shardplan.search.drec.submesh import with_smaller_meshes
from shardplan.search.drec.swaps import Plan
from shardplan.search.drec.tiedwhole import with_tied_whole
from shardplan.search.drec.variants import best_variant
from shardplan.sharding import Strategy


class _Search(RoundCosts):
    """One D-Rec run: the decisions of each round, priced by `RoundCosts`."""

    def __init__(
        self,
        *args: Any,
        defer_ties: bool = False,
        lightest_cut_order: bool = False,
        fixed: Mapping[int, Strategy] | None = None,
        rounds_seen: dict[tuple[object, ...], tuple[dict[int, str | None], bool]] | None = None,
        free_round: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)  # RoundCosts' arguments
        self.defer_ties = defer_ties
        """Whether a heavy op with tied best cuts decides after the others."""
        self.lightest_cut_order = lightest_cut_order
        """Order heavy ops by their cheapest cut (MindSpore 2020) instead of their dearest."""
        self.fixed, self.free_round = dict(fixed or {}), free_round
        """Op index -> its pinned strategy (`--force`, `redecide.py`): one candidate per round."""
        self.rounds_seen = rounds_seen if rounds_seen is not None else {}
        """(the round's pricing, the rounds done, the greedy pass's decisions) -> the round's
        decisions and whether pricing them after the greedy pass hit a binding assumption; and
        (the round's pricing, the rounds done, the greedy order's options) -> its decisions and
        whether the round hit one: shared by the variants of one call (`run_round`)."""
        self._flex_pair_cache: dict[int, list[int]] = {}
        self._pair_static: dict[tuple[int, int], list[tuple[int, bool, int, FlexEdge, str]]] = {}
        """(i, j) -> `_pair_edges`' static part (all but the contexts)."""
        self._pair_views: dict[tuple[int, int], Any] = {}
        """(i, j) -> `_pair_view` (static: the graph's layouts per cut)."""
        self._alone: dict[tuple[int, ...], frozenset[int]] = {}
        """The ops `_settle` need not price again in its backward sweep, per list of ops."""
        self.history: tuple[tuple[str | None, ...], ...] = ()
        """Every op's cut in each round done: with `pricing`, it determines the state."""

    def _order(self, r: int) -> tuple[dict[int, dict[str | None, float]], list[int]]:
        """The heavy ops' own costs in round r, and the order they decide in: heaviest first
        (by their dearest cut, or their cheapest), ties by graph index."""
        own = {i: self._greedy_costs(i, r, set()) for i in self.heavy}
        weight = min if self.lightest_cut_order else max
        return own, sorted(self.heavy, key=lambda i: (-weight(own[i].values()), i))

    def _greedy(
        self, r: int, own: dict[int, dict[str | None, float]], order: list[int]
    ) -> dict[int, str | None]:
        """Heavy ops in `order`, each against the flex neighbours decided before it."""
        rnd = self.rounds[r]
        decided: dict[int, str | None] = {}
        charged: set[tuple[str, int]] = set()
        deferred: set[int] = set()
        queue = deque(order)
        memo: dict[int, dict[str | None, float]] = {}
        sets: dict[int, dict[tuple[object, ...], dict[str | None, float]]] = {}

        pending: dict[int, list[int]] = {}
        shared = self._group_shares(r, own)

        def flex_of(j: int) -> dict[str | None, float]:
            """`_flex_costs` of op j, kept; the edges to flex neighbours decided since are
            added when it is asked for again (incremental prices)."""
            costs = memo.get(j)
            if costs is None:
                sets[j] = {}
                costs = memo[j] = self._flex_costs(j, list(own[j]), rnd, decided, None, sets[j])
                pending.pop(j, None)
            for k in pending.pop(j, ()):
                costs = memo[j] = self._flex_added(j, costs, decided, k, sets[j])
            return costs

        while queue:
            i = queue.popleft()
            if i in decided:
                continue
            group = self.group_of.get(i, [i])
            totals: dict[str | None, float] = {}
            flex = {}
            for j in group:  # with the credits the cut makes a tensor's other readers repay
                flex[j] = self._owing(j, r, own[j], decided, flex_of(j))
            if len(group) == 1:  # alone: its own terms do not change with its trial charges
                costs = self._greedy_costs(i, r, charged)
                totals = {cut: costs[cut] + flex[i][cut] for cut in own[i] if cut in costs}
            for cut in own[i] if len(group) > 1 else ():
                trial = Overlay(charged)
                total = 0.0
                for j in group:  # readers of one tensor decide together: they share its grad
                    costs = self._greedy_costs(j, r, trial)
                    if cut not in costs:
                        break
                    total += costs[cut] + flex[j][cut]
                    self._charge(j, cut, r, trial)
                else:
                    totals[cut] = total
            if not totals:  # the readers have no common valid cut: decide alone
                group = [i]
                totals = dict(self._greedy_costs(i, r, charged))
                for cut in totals:
                    totals[cut] += flex[i][cut]
            ahead = [self._lookahead(j, decided, shared, flex_of) for j in group]
            # regrets >= 0: a cut above the cheapest's total plus regret cannot win: not priced
            first = min(totals, key=totals.__getitem__)
            regrets = dict.fromkeys(totals, math.inf)
            regrets[first] = max(f(first) for f in ahead)
            bound = totals[first] + regrets[first]
            bound += abs(bound) * 1e-9 + 1e-30
            for c in totals:
                if c != first and totals[c] <= bound:
                    regrets[c] = max(f(c) for f in ahead)
            cut = self._pick(totals, regrets)
            if self.defer_ties and i not in deferred and self._indifferent(totals, regrets, cut):
                deferred.add(i)  # no cut is better yet: decide after the others, following them
                queue.append(i)
                continue
            for j in group:
                decided[j] = cut
                self._charge(j, cut, r, charged)
                for k in self._flex_nbrs[j]:  # k's prices now owe the edges to j
                    if k in memo:
                        pending.setdefault(k, []).append(j)
        return decided

    def _owing(
        self,
        j: int,
        r: int,
        own: dict[str | None, float],
        decided: dict[int, str | None],
        mine: dict[str | None, float],
    ) -> dict[str | None, float]:
        """Op j's flex prices `mine` plus the credits each cut makes a tensor's other readers
        repay (`_credit_costs`); `mine` itself when it owes none (no reader to owe)."""
        if not self._next_readers[j] and not self.states[j].credits:
            return mine
        owed = self._credit_costs(j, r, list(own), decided)
        return {c: v + owed[c] for c, v in mine.items()} if any(owed.values()) else mine

    def _group_shares(
        self, r: int, own: dict[int, dict[str | None, float]]
    ) -> dict[int, dict[str | None, float]]:
        """The own costs the lookahead sees: a reader of a shared activation (q, k, v) decides
        with the others, so each common cut is priced at its share of the group's total (the
        input's gradient all-reduced once for all), as the group will pay it."""
        out = dict(own)
        for i in own:
            group = self.group_of.get(i, [i])
            if len(group) < 2 or i != group[0] or any(j not in own for j in group):
                continue
            shares: dict[str | None, float] = {}
            for cut in own[i]:
                trial = Overlay(set())
                total = 0.0
                for j in group:
                    costs = self._greedy_costs(j, r, trial)
                    if cut not in costs:
                        break
                    total += costs[cut]
                    self._charge(j, cut, r, trial)
                else:
                    shares[cut] = total / len(group)
            for j in group:
                out[j] = {c: shares.get(c, v) for c, v in own[j].items()}
        return out

    @staticmethod
    def _indifferent(totals: dict[Any, float], regrets: dict[Any, float], cut: Any) -> bool:
        """Another cut ties with the pick (a batched matmul free to cut batch or heads)."""
        best = totals[cut] + regrets[cut]
        return any(c != cut and totals[c] + regrets[c] <= best * (1 + 1e-9) + 1e-30 for c in totals)

    def _lookahead(
        self,
        i: int,
        decided: dict[int, str | None],
        own: dict[int, dict[str | None, float]],
        flex_of: Callable[[int], dict[str | None, float]],
    ) -> Callable[[str | None], float]:
        """One step ahead: what each cut of op i forces on its undecided flex neighbours — their
        best answer (own terms, edges to their decided neighbours and to i) over their best
        without i. A cut that is free for i but strands a neighbour between i and an already
        decided op (a first conv cutting its channels before a batch-cut conv) pays for it.
        The largest regret counts, not the sum: neighbours reached through one shared chain
        (q, k and v after a norm) pay one redistribution, not one each. Returns the regret as a
        function of the cut, so the caller prices only the cuts that can still win."""
        pairs = []
        for j in self._flex_pairs(i):
            if j in decided:
                continue
            flex = flex_of(j)
            preds, succs, keys, views = self._pair_view(i, j)
            # the pair's edges see only the layouts on them: price each distinct pair once
            answers: dict[tuple[int, ...], float] = {}  # the cheapest of j's cuts per key
            floor = math.inf
            for cj, c in own[j].items():
                c += flex[cj]
                if c < floor:
                    floor = c
                key = keys[cj]
                best = answers.get(key)
                if best is None or c < best:
                    answers[key] = c
            pairs.append((self._pair_edges(i, j, preds, succs), answers, floor, {}, views))
        chain, chain_price = self._chain, self._chain_price

        def regret(cut: str | None) -> float:
            worst = 0.0
            for edges, answers, floor, forced_by, views in pairs:
                mine = views[cut]
                forced = forced_by.get(mine)
                if forced is None:
                    forced = math.inf
                    if len(edges) == 1:  # the usual pair: one edge (its price is the pair's)
                        eid, into, ctx, e, name = edges[0]
                        m = mine[0]
                        for key, c in answers.items():
                            a, b = (m, key[0]) if into else (key[0], m)
                            price = chain.get((eid, a, b, ctx))
                            if price is None:
                                price = chain_price(e, a, b, into, ctx, name)
                            c += price
                            if c < forced:
                                forced = c
                    for key, c in answers.items() if len(edges) != 1 else ():
                        cost = 0.0  # the pair's edges, each through its chain
                        for (eid, into, ctx, e, name), a, b in zip(edges, mine, key, strict=True):
                            if not into:  # j's output into i: j's layout is the source
                                a, b = b, a
                            price = chain.get((eid, a, b, ctx))
                            if price is None:
                                price = chain_price(e, a, b, into, ctx, name)
                            cost += price
                        c += cost
                        if c < forced:
                            forced = c
                    forced_by[mine] = forced
                if forced - floor > worst:
                    worst = forced - floor
            return worst

        return regret

    def _settle(self, r: int, decided: dict[int, str | None], ops: list[int]) -> None:
        """Each op of `ops` (forward, then backward) re-picks against its decided neighbours.
        An op whose local costs read no op after it in `ops` (`SearchTables.reads`) sees in the
        backward sweep what it saw in the forward one: its pick stands, it is not priced again."""
        key, reads = tuple(ops), self._tables.reads
        alone = self._alone.get(key)
        if alone is None:
            later = {i: k for k, i in enumerate(ops)}
            alone = self._alone[key] = frozenset(
                i for k, i in enumerate(ops) if all(later.get(j, -1) < k for j in reads[i])
            )
        for i in ops:
            decided.pop(i, None)
            decided[i] = self._pick(*self._local_costs(i, r, decided))
        for i in reversed(ops):
            if i not in alone:
                decided.pop(i, None)
                decided[i] = self._pick(*self._local_costs(i, r, decided))

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
            costs, extra = self._local_costs(i, r, decided)
            if old in costs and costs[old] + extra[old] <= min(costs[c] + extra[c] for c in costs):
                decided[i] = old  # keep the current cut on ties: the pass only ever improves
                continue
            decided[i] = self._pick(costs, extra)
            for j in self._neighbours(i):
                if j not in queued and j != i:
                    queued.add(j)
                    heapq.heappush(heap, j)

    def _alternatives(self, r: int) -> list[dict[int, str | None]]:
        """Whole-round assignments the greedy result is checked against: every heavy op
        continuing its previous round's cut, and every heavy op cutting the leading dim of its
        result (the first valid candidate), so a uniform split is never missed by greediness."""
        rnd = self.rounds[r]
        out: list[dict[int, str | None]] = []
        fixed = [] if r == self.free_round else list(self.fixed.items())  # `redecide.py`
        if r > 0:
            previous: dict[int, str | None] = {}
            for i in self.heavy:
                st = self.states[i]
                cut = st.cuts[-1]
                valid = cut is not None and self._cut_ok(i, cut, rnd.q)
                previous[i] = cut if valid else None
            out.append(previous)
            previous.update((i, s[r]) for i, s in fixed if i in previous)
        leading: dict[int, str | None] = {}
        for i in self.heavy:
            leading[i] = next(
                (c for c in self.candidates[i] if c is None or self._cut_ok(i, c, rnd.q)),
                None,
            )
        out.append(leading)
        out.append(dict.fromkeys(self.heavy))  # leave the round unused: replicate everything
        for alternative in out[-2:]:
            alternative.update((i, s[r]) for i, s in fixed if i in alternative)
        return out

    def run_round(self, r: int) -> None:
        """Greedy D-Rec assignment, checked against the whole-round alternatives; the cheapest
        (by the round's full cost) is then locally improved, one op at a time. A variant that
        prices alike, with the same rounds done, whose greedy pass decides alike, ends the round
        alike: the end another variant reached from there is reused (`rounds_seen`); one that
        also orders its greedy pass alike (the same heavy ops first) takes the round whole."""
        self.begin_round(r)
        if r < self.unused_rounds:
            self._done(r, dict.fromkeys(range(len(self.states))))
            return
        pricing = self._price_keys[r]
        before, self.binding = self.binding, False  # whether this round binds
        own, order = self._order(r)
        # the state is the rounds done (with `hopeful`, in the pricing): a search that prices
        # this round alike and runs its greedy pass in the same order decides it alike, whole
        ahead = (pricing, self.history, self.defer_ties, tuple(order))
        seen = self.rounds_seen.get(ahead)
        if seen is not None:
            self.binding = before or self.binding or seen[1]
            self._done(r, dict(seen[0]))
            return
        decided = self._greedy(r, own, order)
        key = (pricing, self.history, tuple(decided.get(i) for i in range(len(self.states))))
        seen = self.rounds_seen.get(key)
        if seen is not None:
            decided, binds = dict(seen[0]), self.binding or seen[1]
        else:
            greedy_binds, self.binding = self.binding, False  # whether the rest of it binds
            decided = self._finish(r, decided)
            self.rounds_seen[key] = (dict(decided), self.binding)
            binds = greedy_binds or self.binding
        self.rounds_seen[ahead] = (dict(decided), binds)
        self.binding = before or binds
        self._done(r, decided)

    def _done(self, r: int, decided: dict[int, str | None]) -> None:
        self.apply_round(r, decided)
        self.history += (tuple(decided.get(i) for i in range(len(self.states))),)

    def _finish(self, r: int, decided: dict[int, str | None]) -> dict[int, str | None]:
        """Round r's decisions from the greedy pass's (`run_round`)."""
        light = [i for i in range(len(self.states)) if i not in self.heavy]
        self._settle(r, decided, light)
        best = self.round_cost(r, decided)
        tried: list[dict[int, str | None]] = []
        for alternative in self._alternatives(r):
            heavy_cuts = {i: alternative[i] for i in self.heavy}
            if heavy_cuts in tried:
                continue  # another alternative already had these heavy cuts (settled alike)
            tried.append(heavy_cuts)
            if all(cut is None for cut in alternative.values()) and not self.fixed:
                # nothing to follow: replicate all; compare every op, the light ones included
                alternative.update(dict.fromkeys(light))
                if alternative == decided:
                    continue
            elif all(alternative[i] == decided[i] for i in self.heavy):
                continue
            else:
                self._settle(r, alternative, light)
            cost = self.round_cost(r, alternative)
            if cost < best:
                decided, best = alternative, cost
        improved = dict(decided)
        self._improve(r, improved)
        if improved == decided or self.round_cost(r, improved) <= best:  # its per-op view
            # can miss shared-parameter edges: keep it only when the round's cost agrees
            decided = improved
        return decided

    def run(self) -> dict[str, Strategy]:
        for r in range(len(self.rounds)):
            self.run_round(r)
        return {st.op.name: tuple(st.cuts) for st in self.states}


class _PinnedSearch(_Search):
    """D-Rec with user-fixed ops (`--force`), each its own only candidate in every pass."""

    def _pinned(self, i: int, r: int, costs: dict[str | None, float]) -> dict[str | None, float]:
        if i in self.fixed and r != self.free_round:  # one candidate: every pass keeps it
            return {self.fixed[i][r]: costs[self.fixed[i][r]]}
        return costs

    def _own_costs(self, i: int, r: int, charged: Any) -> dict[str | None, float]:
        return self._pinned(i, r, super()._own_costs(i, r, charged))

    def _greedy_costs(self, i: int, r: int, charged: Any) -> dict[str | None, float]:
        return self._pinned(i, r, super()._greedy_costs(i, r, charged))

    def run_round(self, r: int) -> None:
        if self.free_round is None or r == self.free_round or len(self.fixed) < len(self.states):
            return super().run_round(r)
        self._done(r, {i: s[r] for i, s in self.fixed.items()})  # all pinned (`redecide.py`)


def drec(
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    memory_lambda: float = 0.0,
    fold: bool = True,
    fixed: Mapping[str, Strategy] | None = None,
) -> dict[str, Strategy]:
    """Strategies of every op by D-Rec (`drec_folded` without the fold it used)."""
    return drec_folded(graph, mesh, opts, memory_lambda, fold, fixed)[0]


def drec_folded(
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    memory_lambda: float = 0.0,
    fold: bool = True,
    fixed: Mapping[str, Strategy] | None = None,
    cache: Any = None,
) -> tuple[dict[str, Strategy], Fold | None]:
    """Strategies of every op by D-Rec, and the fold of repeated blocks it searched (None: the full
    graph was searched; `cache`, a `ScoreCache` of `graph`, labels `find_fold`'s ops);
    `memory_lambda` (cost units per byte) penalises cuts that keep tensors replicated, used by the
    memory-aware driver (`driver.py`). `fixed` (op name -> strategy, checked by the caller) pins
    ops: they are their own only candidate in every pass, so their neighbours plan around them;
    variants that would override them are skipped and the graph is not folded (a pinned op makes its
    layer unlike the others).

    A few variants of the search run and the plan the evaluator scores lower (cost + lambda *
    memory) is kept, each variant correcting a myopia of the round-by-round greedy:
      * "no cut" priced by this round's local compute (pessimistic: later rounds may still cut) and
        by its exact share of the final compute (optimistic: assumes they do) — the second also lets
        a heavy op whose best cuts tie (a batched matmul free to cut batch or heads) decide after
        the others, following them;
      * the leading mesh axes left unused (every op replicated across them): a slow inter-node axis
        often costs more than it saves for small batches, which no single round sees, down to the
        fully replicated plan — not searched when `gates.unused_floor` reaches the best score found
        (it cannot win);
      * heavy ops taken by their dearest cut first (MindSpore since 2022) and by their cheapest
        (MindSpore 2020): an op with one terrible cut (attention scores along their contraction)
        otherwise decides before the ops it should follow;
      * all-reduces priced assuming the faster later rounds shrink them only where they can cut the
        op, and (rerun when that changed a price) that they all do, as MindSpore does;
      * when some round cuts another number of ways than the next (mesh 12 = 2 x 2 x 3), heavy ops'
        cuts also priced by their cheapest own price in that next round (`nextround.py`; a variant,
        not the pricing: it over-weighs the next round where edges decide).
    Each variant's plan is then polished exactly (`polish.py`: single-op moves across rounds, priced
    by the evaluator's rows), which repairs a round's cut made under assumptions the later rounds
    broke. When the innermost axis mixes primes, the variants also run on the mesh without its
    trailing rounds of the largest prime (`submesh.py`), and once more with each axis's largest
    prime rounds first (`roundorder.py`). The best plan then gets pair moves and the tail move
    (`polish.pair_polished`: an op and its reader leave one axis of their tensor together; the last
    ops replicated; a run of ops left unused in one round, or cut in a round that left them unused,
    `runs.py`; or in two rounds at once, `compound.py`; a tied parameter's readers re-cut together
    in one round, `tied.py`); when replication beats every variant, the two best cut plans are tried
    with two same-axis rounds exchanged (`swaps.py`); the first round of each class of rounds but
    the last one's is searched again, last, on what the other rounds leave (`redecide.py`). Then the
    later moves: the variants run once more with a costly tied parameter's readers kept whole
    (`tiedwhole.py`), the column moves (one round's cuts exchanged with another axis's round of
    equal ways, or copied from another round, `columns.py`) and, on an unfolded graph, every
    repeated block given one block's strategies (`blocks.py`), each candidate scored and the best
    below the plan polished. Each module names the case it fixed (docs/search.md). That is at most 3
    * (3 + mesh axes) + 1 linear searches, and one per class of rounds; the unused-axis ones are
    shorter. With the symbolic "mindspore" preset only the first runs, as MindSpore's own search
    does.

    A run of >= 6 identical blocks is folded (`fold.py`): the variants search blocks 0, 1, 2 and the
    last; when blocks 1 and 2 decide alike every interior block takes that decision, else (or with
    `fold=False`) the full graph is searched."""
    with without_gc_pauses():
        return _drec_folded(graph, mesh, opts, memory_lambda, fold, fixed, cache)


def _drec_folded(
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    memory_lambda: float,
    fold: bool,
    fixed: Mapping[str, Strategy] | None,
    cache: Any = None,
) -> tuple[dict[str, Strategy], Fold | None]:
    """`drec_folded` with the collector paused."""
    labels = cache.classes if cache is not None else None  # the front door's classes
    repeats = find_fold(graph, labels) if fold and not fixed else None
    flex = repeats.flex_graph() if repeats is not None else None
    # the variants score in the front door's price table: its final scoring reads their prices
    table = cache.table if cache is not None and cache.mesh == mesh else None
    if repeats is not None and flex is not None:
        scoring = ScoreCache(repeats.reduced, mesh, opts, table)
        plan = _orders(
            _variants, repeats.reduced, mesh, opts, memory_lambda, repeats, flex, cache=scoring
        )
        if plan is not None:
            plan = pair_polished(repeats.reduced, mesh, opts, memory_lambda, repeats, scoring, plan)
            args = (repeats.reduced, mesh, opts, memory_lambda, repeats, flex)
            finish = partial(_later_moves, args, scoring, False)
            plan = with_round_redecided(_PinnedSearch, finish, *args, scoring, plan)
            return repeats.expand(plan), repeats
    pinned = {graph.op_index[name]: tuple(s) for name, s in (fixed or {}).items()}
    flex = build_flex_graph(graph)
    scoring = cache if table is not None and cache.graph is graph and cache.opts == opts else None
    plan = _orders(_variants, graph, mesh, opts, memory_lambda, None, flex, pinned, cache=scoring)
    assert plan is not None
    frozen = list(pinned) if pinned else None
    plan = pair_polished(graph, mesh, opts, memory_lambda, None, scoring, plan, frozen)
    if not pinned:  # pinned ops stay as the user fixed them
        args = (graph, mesh, opts, memory_lambda, None, flex)
        scores = scoring or ScoreCache(graph, mesh, opts)
        later = partial(_later_moves, args, scores, True)
        plan = with_round_redecided(_PinnedSearch, later, *args, scores, plan)
    return plan, None


def _later_moves(args: tuple[Any, ...], scores: ScoreCache, blocks: bool, plan: Plan) -> Plan:
    """Tied readers kept whole, column moves, block copies (`blocks`); `args`: the search's."""
    plan = with_tied_whole(_variants, *args, plan, scores)
    plan = with_column_moves(*args[:5], scores, plan)
    return with_block_copies(*args[:4], scores, plan) if blocks else plan


# the variants' best plan of a graph (None: a variant broke the fold's uniform interior), each
# variant one `_Search` (`_PinnedSearch` with pinned ops)
_variants = partial(best_variant, searches=(_Search, _PinnedSearch))
# the ascending round order with smaller meshes, then the largest primes first (`roundorder.py`)
_orders = partial(with_round_orders, first=with_smaller_meshes)
