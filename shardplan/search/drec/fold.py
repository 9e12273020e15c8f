"""Repeated layers folded: search a graph with four copies of a repeated block instead of n.

A deep model repeats one block n times (96 identical GPT-3 layers). D-Rec's decisions are local
(an op against its neighbours one or two flex edges away), so identical blocks in identical
context get identical decisions. `find_fold` finds the longest run of identical consecutive
blocks and builds a reduced graph keeping blocks 0, 1, 2 and n-1 (the last one reading block 2
where it read block n-2). D-Rec searches the reduced graph, weighting blocks 1 and 2 by the
(n-2) blocks they stand for when it compares whole rounds; when blocks 1 and 2 decide alike the
interior is at its fixed point and every block 1..n-2 takes that decision (`expand`), else the
caller searches the full graph. `score` is the evaluator's exact cost of the expanded plan,
computed on the reduced graph: blocks 3..n-2 see the same neighbours as block 2, so their terms
are block 2's, counted n-3 times.

Identical blocks: op by op the same kind, signature, shapes, dtypes, roles and FLOPs (a label per
op), each block k >= 2 reading block k-1 (or itself) exactly where block k-1 reads block k-2 (or
itself), and the same outside tensors or block-local parameters/constants of the same form; no
block but the last is read outside itself and its successor.
Cost: labels O(|V| + |E|); candidate periods from the distance to a label's next occurrence (the
few most common), each checked in O(|V| + |E|); the reduced graph O(|V| + |E|).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial

from shardplan.cost.classes import op_classes
from shardplan.cost.evaluate import (
    ScoreCache,
    evaluate_strategies,
    op_terms,
    output_layouts,
    param_homes,
    plan_rows,
)
from shardplan.cost.linear import memory_pieces
from shardplan.cost.presets import CostOptions
from shardplan.cost.rows import Rows
from shardplan.ir.graph import Graph, make_graph
from shardplan.ir.op import Op, Role
from shardplan.mesh import Mesh
from shardplan.search.drec.flex import (
    FlexEdge,
    FlexGraph,
    SiblingEdge,
    build_flex_graph,
    heavy_ops,
    heavy_sources,
    sibling_sources,
)
from shardplan.sharding import Layout, Strategy, check_strategies

KEPT = 4
"""Blocks the reduced graph keeps: 0, 1, 2 and the last."""
MIN_BLOCKS = 6
"""Fold only runs of at least this many blocks (fewer gain too little)."""
BEYOND = -1
"""`Fold._reduced_index` of a block a light suffix's walk reaches past the kept ones."""


@dataclass(frozen=True, slots=True)
class Fold:
    """A run of `count` identical blocks of `period` ops starting at op `start`, and the
    reduced graph (blocks 0, 1, 2 and count-1 kept)."""

    full: Graph
    reduced: Graph
    start: int
    period: int
    count: int
    labels: tuple[int, ...]
    """`op_labels` of the reduced graph."""

    def _block(self, index: int) -> int:
        """Block of full-graph op `index` (-1 outside the run)."""
        k, _ = divmod(index - self.start, self.period)
        return k if self.start <= index < self.start + self.count * self.period else -1

    def _stand_in(self, index: int) -> str:
        """Name of the reduced-graph op that decides for full-graph op `index`."""
        k = self._block(index)
        if 3 <= k <= self.count - 2:
            index -= (k - 2) * self.period
        return self.full.ops[index].name

    def _reduced_index(self, index: int, light: bool = False, suffix: bool = False) -> int | None:
        """The reduced-graph op in the place of full-graph op `index` as a neighbour of the
        last block or the suffix: blocks n-2, n-3 and n-4 are blocks 2, 1 and 0 there (the
        last block reads block 2 for n-2); None further back (the reduced graph has no such
        place: behind block 0 it keeps the prefix instead). `light` (`_light_suffix`): what
        lies further back, and block n-4 too for a neighbour of the `suffix` (whose edges to
        block 0 `local` refuses), is `BEYOND`, a walk's end the reduced graph drops."""
        k = self._block(index)
        if 3 <= k <= self.count - 2:
            if light and (k < self.count - KEPT or (suffix and k == self.count - KEPT)):
                return BEYOND
            if k < self.count - KEPT:
                return None
            index -= (self.count - KEPT) * self.period
        elif index < self.start and self.count > KEPT:
            return None  # the prefix: only reached from the kept blocks 0-2 (never mapped)
        return self.reduced.op_index[self.full.ops[index].name]

    def _light_suffix(self, heavy: frozenset[int]) -> bool:
        """Whether the ops after the run hold fewer heavy ops than one block (a final norm and
        a head, not ResNet-152's last stage of three bottlenecks). Their walks along a residual
        stream of transparent ops (a decomposed RMSNorm reads the last residual add) run many
        blocks back; such a suffix's pull on the blocks it reaches is weaker than a block's, so
        those walks stop at the kept blocks (the suffix's past n-3, the last block's past n-4)
        rather than unfold the run. Measured: Hugging Face Llama and Qwen2 imports plan
        identically folded and unfolded (tests/search/test_fold.py); a heavier suffix keeps the
        full search."""
        block = sum(1 for x in range(self.start, self.start + self.period) if x in heavy)
        after = self.start + self.count * self.period
        return sum(1 for x in heavy if x >= after) < block

    def flex_graph(self, budget: int = 16) -> FlexGraph | None:
        """The reduced graph's flex graph, or None when folding would change what an op sees.

        The reduced graph's own walks, when no flex or sibling edge joins the suffix with block
        0 or the prefix (`local`). Otherwise the walks of the last block and the suffix run
        again in the full graph (`flex.heavy_sources`, the same budget) and the ops they reach
        are put in their reduced places (`_reduced_index`): reduced walks run past the 4 kept
        blocks into the prefix where the full graph's stop inside the run (an imported GPT
        whose embedding is one op, so that the head's walk meets it). A full walk reaching
        further back than block n-4 makes it None: the reduced graph has no place for what it
        sees (a residual stream of transparent add/relu chains spanning many blocks:
        ResNet-152's last stage then decides differently), unless the suffix is lighter than a
        block (`_light_suffix`): then such walks stop at the kept blocks. O(|reduced| * budget)."""
        own = build_flex_graph(self.reduced)
        if self.local(own):
            return own
        placed = self._placed_flex_graph(budget)
        return placed if placed is not None and self.local(placed) else None

    def _placed_flex_graph(self, budget: int) -> FlexGraph | None:
        """`flex_graph` from walks in the full graph (None: one reaches past block n-4)."""
        full, reduced = self.full, self.reduced
        heavy = heavy_ops(full)
        kept = [full.op_index[op.name] for op in reduced.ops]
        late = self.start + 3 * self.period  # kept ops from here on are the last block, suffix
        after = self.start + self.count * self.period  # the suffix: the ops after the run
        light = self._light_suffix(heavy)
        last = partial(self._reduced_index, light=light)
        beyond = partial(self._reduced_index, light=light, suffix=True)
        edges: list[FlexEdge] = []
        siblings: list[SiblingEdge] = []
        for v, x in enumerate(kept):
            place = (beyond if x >= after else last) if x >= late else self._same
            op = full.ops[x]
            if x not in heavy:
                for a, a_pos, b, b_pos, pairs, a_via, b_via in sibling_sources(
                    full, heavy, x, budget
                ):
                    ra, rb = place(a), place(b)
                    if ra is None or rb is None:
                        return None
                    if ra == BEYOND or rb == BEYOND:
                        continue
                    siblings.append(SiblingEdge(ra, a_pos, rb, b_pos, pairs, a_via, b_via))
                continue
            for in_pos, tensor in enumerate(op.inputs):
                identity = {d: d for d in range(len(full.tensors[tensor].shape))}
                sources = heavy_sources(full, heavy, tensor, identity, budget)
                for u, out_pos, mapping, via in sources:
                    ru = place(u)
                    if ru is None:
                        return None
                    if ru == BEYOND:
                        continue
                    dims = tuple(sorted(mapping.items()))
                    edges.append(FlexEdge(ru, out_pos, v, in_pos, dims, via))  # via: a key only
        heavy_kept = frozenset(v for v, x in enumerate(kept) if x in heavy)
        return FlexGraph(heavy_kept, tuple(edges), tuple(siblings))

    def _same(self, index: int) -> int:
        """The reduced index of a kept full-graph op."""
        return self.reduced.op_index[self.full.ops[index].name]

    def _reduced_block(self, name: str) -> int:
        """Block (0, 1, 2 or count-1) of a reduced-graph op, -1 outside the run."""
        return self._block(self.full.op_index[name])

    def note(self) -> str:
        """What the plan's notes say about the fold (two lines of the CLI's table)."""
        return (
            f"repeated blocks folded: 4 of {self.count} identical blocks of {self.period} ops "
            f"searched (0, 1, 2, {self.count - 1}), blocks 3-{self.count - 2} took block 2's "
            f"decisions (first op {self.full.ops[self.start].name})"
        )

    def round_weights(self) -> list[float]:
        """Per reduced op: how many full-graph ops it stands for (in a round's total, and in the
        score): block 2 and its incoming edges stand for blocks 2..n-2, exactly so when blocks 1
        and 2 decide alike."""
        return [
            self.count - 3.0 if self._reduced_block(op.name) == 2 else 1.0
            for op in self.reduced.ops
        ]

    def local(self, flex: FlexGraph) -> bool:
        """Whether the ops after the run see no further back than its copies 1, 2 and the last:
        no flex or sibling edge joins the suffix with block 0 or the prefix. Walks through chains
        of transparent ops reach several blocks back (the residual stream); folded, a walk from
        the suffix that reaches block 0 or the prefix sees ops the full graph's walk would not
        (ResNet-152's last stage then decides differently), so such a run is not folded."""
        place = []  # prefix -1, blocks 0, 1, 2, the last block 3, suffix 4
        for op in self.reduced.ops:
            k = self._reduced_block(op.name)
            if k < 0:
                k = -1 if self.full.op_index[op.name] < self.start else KEPT
            elif k > 2:
                k = KEPT - 1
            place.append(k)
        pairs = [(e.producer, e.consumer) for e in flex.edges]
        pairs += [(e.a, e.b) for e in flex.siblings]
        return not any(
            max(place[u], place[v]) == KEPT and min(place[u], place[v]) <= 0 for u, v in pairs
        )

    def twins(self) -> dict[int, int]:
        """Reduced-graph op index -> its twin's, for each op of blocks 1 and 2 (both ways)."""
        ops, index = self.full.ops, self.reduced.op_index
        first = self.start + self.period
        pairs = [
            (index[ops[first + j].name], index[ops[first + self.period + j].name])
            for j in range(self.period)
        ]
        return {a: b for a, b in pairs} | {b: a for a, b in pairs}

    def uniform(self, plan: Mapping[str, Strategy]) -> bool:
        """Blocks 1 and 2 of a reduced plan decide alike (the interior's fixed point)."""
        ops = self.full.ops
        first = self.start + self.period
        return all(
            plan[ops[first + j].name] == plan[ops[first + self.period + j].name]
            for j in range(self.period)
        )

    def expand(self, plan: Mapping[str, Strategy]) -> dict[str, Strategy]:
        """The full graph's strategies from a uniform reduced plan."""
        return {op.name: plan[self._stand_in(i)] for i, op in enumerate(self.full.ops)}

    def stand_ins(self) -> list[int]:
        """Per full-graph op, the reduced-graph op whose decision and row it takes (`expand`):
        itself outside blocks 3..n-2, its block-2 copy inside. O(ops)."""
        index, ops, period = self.reduced.op_index, self.full.ops, self.period
        inner = self.start + 3 * period  # block 3's first op
        after = self.start + (self.count - 1) * period  # the last block's
        block2 = [index[ops[self.start + 2 * period + j].name] for j in range(period)]
        return [
            *(index[op.name] for op in ops[:inner]),
            *block2 * (self.count - KEPT),
            *(index[op.name] for op in ops[after:]),
        ]

    def repeats(
        self, mesh: Mesh, plan: Mapping[str, Strategy], opts: CostOptions, cache: ScoreCache
    ) -> tuple[Rows, list[int]] | None:
        """The evaluator's rows of `expand(plan)` on the full graph (`cache`, a `ScoreCache` of
        it), read off the reduced graph's (`evaluate_strategies`' `repeats`): blocks 3..n-2 see
        what block 2 sees (the fold's identity: same neighbours, readers, credits), so their rows
        are block 2's; every other op is in the reduced graph, in the same context. None for a
        plan `expand` would not give (blocks 1 and 2 not alike) or with ZeRO pricing (its
        storage collectives read the whole graph's parameters)."""
        reduced = {op.name: plan[op.name] for op in self.reduced.ops}
        if opts.zero or not self.uniform(reduced) or self.expand(reduced) != dict(plan):
            return None
        scoring = ScoreCache(self.reduced, mesh, opts, cache.table)  # its prices: the table's
        return plan_rows(self.reduced, mesh, reduced, opts, scoring), self.stand_ins()

    def total(
        self,
        mesh: Mesh,
        plan: Mapping[str, Strategy],
        opts: CostOptions,
        param_layouts: Mapping[str, Layout] | None = None,
        cache: ScoreCache | None = None,
    ) -> float:
        """The evaluator's total of `expand(plan)` with parameters stored as `param_layouts` (of
        the reduced graph's parameters; a layout depends on the shape alone, e.g. FSDP's),
        from the evaluator's rows of the reduced graph, block 2's counted n-3 times (its
        parameters' storage collectives sit on their readers' rows)."""
        rows = evaluate_strategies(self.reduced, mesh, plan, opts, param_layouts, cache).ops
        return sum(w * row.total for w, row in zip(self.round_weights(), rows, strict=True))

    def score(
        self,
        mesh: Mesh,
        plan: Mapping[str, Strategy],
        opts: CostOptions,
        memory_lambda: float = 0.0,
        cache: ScoreCache | None = None,
    ) -> float:
        """cost + lambda * memory of `expand(plan)` on the full graph, evaluated exactly on the
        reduced graph (block 2's terms and memory pieces count n-3 times); `cache`, a
        `ScoreCache` of the reduced graph, keeps prices across the plans one search scores."""
        graph, rounds = self.reduced, mesh.rounds
        cache = cache if cache is not None else ScoreCache(graph, mesh, opts)
        # every op checked, each (class, strategy) once across the plans the cache scores
        check_strategies(graph.ops, plan, rounds, cache.classes, cache.valid)
        weights = self.round_weights()
        homes = param_homes(graph, plan)
        total = 0.0
        layouts = output_layouts(graph, plan)
        terms = op_terms(graph, mesh, plan, opts, homes, layouts, cache=cache)
        for t in terms:
            total += weights[t.index] * (t.intra.total + t.compute + t.redistribution.total)
        if memory_lambda:
            param = act = peak = 0.0
            for i, op in enumerate(graph.ops):
                piece = memory_pieces(graph, i, plan[op.name], rounds, opts)
                param += weights[i] * piece.param
                act += weights[i] * piece.activation
                peak = max(peak, piece.working_set)
            total += memory_lambda * (param + (act if opts.train else peak))
        return total


def op_labels(graph: Graph) -> list[int]:
    """Per op, a small int equal for interchangeable ops: the evaluator's op classes
    (`cost.classes.op_key`: kind, signature, FLOPs, attributes, operand shapes, dtypes, roles and
    gradient status), numbered in order of first appearance."""
    return op_classes(graph, {})


def _consistent(graph: Graph, start: int, period: int, k: int) -> bool:
    """Block k (>= 2) reads as block k-1 does, shifted by one block."""
    lo = start + (k - 1) * period  # block k-1's first op: block k may read it and itself only
    ops, producer, consumers = graph.ops, graph.producer, graph.consumers
    for x in range(start + k * period, start + (k + 1) * period):
        op, twin = ops[x], ops[x - period]
        for t, u in zip(op.inputs, twin.inputs, strict=True):
            y = producer.get(t)
            if y is not None and y >= start:
                if y < lo or producer.get(u) != y - period:
                    return False
                continue
            if t == u:  # one outside tensor read by every block: constants and inputs only
                if graph.tensors[t].role in (Role.PARAMETER, Role.ACTIVATION):
                    return False  # its readers would price each other (shared grads, layouts)
                continue
            users = {i for i, _ in consumers[t]}
            twin_users = {i for i, _ in consumers[u]}
            if producer.get(u) is not None or twin_users != {i - period for i in users}:
                return False  # not a block-local parameter/constant of the same form
            if not all(lo + period <= i < lo + 2 * period for i in users):
                return False
    return True


def _closed(graph: Graph, start: int, period: int, k: int) -> bool:
    """Block k's results are read only by blocks k and k+1."""
    lo, hi = start + k * period, start + (k + 2) * period
    ops, consumers = graph.ops, graph.consumers
    for x in range(lo, lo + period):
        for t in ops[x].outputs:
            for i, _ in consumers.get(t, ()):
                if not lo <= i < hi:
                    return False
    return True


def _run(graph: Graph, labels: list[int], period: int) -> tuple[int, int]:
    """(start, blocks) of the longest run of consistent blocks of this period."""
    n = len(labels)
    best = (0, 0)
    i = 0
    while i + period < n:
        if labels[i] != labels[i + period]:
            i += 1
            continue
        a = i
        while i + period < n and labels[i] == labels[i + period]:
            i += 1
        blocks = (i - a) // period + 1  # ops a .. i+period-1 repeat with this period
        count = 1
        while count < blocks and _closed(graph, a, period, count - 1):
            if count >= 2 and not _consistent(graph, a, period, count):
                break
            count += 1
        if count > best[1]:
            best = (a, count)
    return best


def find_fold(graph: Graph, labels: Sequence[int] | None = None) -> Fold | None:
    """The longest run of >= MIN_BLOCKS identical blocks, with its reduced graph, or None.
    `labels`: the graph's `op_labels`, or any numbering of the same classes (a `ScoreCache`'s
    `classes`): only their equality is read."""
    found = repeated_blocks(graph, labels, MIN_BLOCKS)
    if found is None:
        return None
    start, period, count = found
    reduced = _reduce(graph, start, period, count)
    return Fold(graph, reduced, start, period, count, tuple(op_labels(reduced)))


def repeated_blocks(
    graph: Graph, labels: Sequence[int] | None, min_blocks: int
) -> tuple[int, int, int] | None:
    """(first op, ops per block, blocks) of the run of >= `min_blocks` identical blocks that
    saves the most ops when folded (module docstring; below `KEPT` blocks, that covers the most
    ops), or None."""
    labels = list(labels) if labels is not None else op_labels(graph)
    kept = KEPT if min_blocks >= KEPT else 0
    last: dict[int, int] = {}
    gaps: Counter[int] = Counter()
    for i, label in enumerate(labels):
        if label in last:
            gaps[i - last[label]] += 1
        last[label] = i
    best: tuple[int, int, int] | None = None  # (ops saved, start, period) ...
    for period, _ in gaps.most_common(3):
        if best is not None and len(labels) - kept * period <= best[0]:
            continue  # it saves at most the ops past its 4 kept blocks: it cannot save more
        start, count = _run(graph, labels, period)
        if count >= min_blocks and (best is None or (count - kept) * period > best[0]):
            best = ((count - kept) * period, start, period, count)  # type: ignore[assignment]
    if best is None:
        return None
    _, start, period, count = best  # type: ignore[misc]
    return start, period, count


def _reduce(graph: Graph, start: int, period: int, count: int) -> Graph:
    """Blocks 0, 1, 2 and count-1 of the run, the last reading block 2 for block count-2."""
    gone_lo, gone_hi = start + 3 * period, start + (count - 1) * period
    shift = (count - 4) * period
    ops: list[Op] = []
    for x, op in enumerate(graph.ops):
        if gone_lo <= x < gone_hi:
            continue
        if x >= gone_hi and x < gone_hi + period:  # the last block: rewire its reads of n-2
            inputs = tuple(
                graph.ops[graph.producer[t] - shift].outputs[
                    graph.ops[graph.producer[t]].outputs.index(t)
                ]
                if gone_lo <= graph.producer.get(t, -1) < gone_hi
                else t
                for t in op.inputs
            )
            op = replace(op, inputs=inputs)
        ops.append(op)
    used = {t for op in ops for t in (*op.inputs, *op.outputs)}
    tensors = {name: t for name, t in graph.tensors.items() if name in used}
    return make_graph(graph.name, tensors, tuple(ops))


def fold_weights(fold: Fold | None, graph: Graph) -> Sequence[float] | None:
    """Round weights of `graph` when it is `fold`'s reduced graph."""
    return fold.round_weights() if fold is not None and fold.reduced is graph else None
