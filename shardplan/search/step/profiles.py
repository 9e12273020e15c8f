"""Stage plans of every family and their step-model profiles, priced once per structure.

A stage (a chunk of segments, `ir.segments`) can be planned by D-Rec (one run per distinct
segment, strategies side by side), the data-parallel expert, or the Megatron expert at each
tensor degree t the stage mesh allows (products of its innermost rounds, one-axis meshes too),
each with and without sequence parallelism when it has tensor-parallel rounds; the Megatron
expert also with expert parallelism e ways (a model with expert layers) and with context
parallelism c ways when the micro-batch has fewer samples than the data-parallel ways (the
sequence fills the ways the batch cannot, c the largest that fits; with samples enough, data
parallelism moves less), e and c products of the data-parallel rounds next to tensor
parallelism, as Megatron-LM orders its ranks (`recipes.expert_parallel`,
`recipes.context_rounds`). `families.Family` names one (with the levers, `families.py`).
`StageProfiler.profile` prices a chunk under a family with `cost.step.profile_stage`; a chunk of
k > 4 periods of the model's repeated run is priced on its two-period reduction p2
(`structure.reduced_chunk`) plus (k - 2) per-period increments, the increment being q3 - q2 of
the two- and three-period reductions of the first such chunk priced (equal layers under equal
strategies add equal terms, whatever the chunk's ends), checked once per family — by the two
reductions being cut as one period repeated with the same ends (`_periodic`), else against the
four-period reduction — and per chunk against its own p3 - p2, or, when the first chunk's
reductions were so cut, by the chunk's own two reductions being cut as that same period repeated
(`_by_structure`: its p3 planned, not priced); the peaks and the stage inputs are p2's (equal
layers, the same peak); `increments.py` adds and compares the terms. Two periods, not one,
are the base: with one period no segment repeats, so full recomputation's blocks
(`cost.step.block_starts`, the most frequent structure opens each) differ from those of every
longer run. So a trillion-parameter model
costs what a few of its layers and its ends cost, and chunks of one shape share their profiles.
O(families x (distinct chunk shapes + 1) x ops of four layers).
`plan` gives a chunk's real plan and exact profile (the search's winner only).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from shardplan.cost import CostOptions
from shardplan.cost.evaluate import PriceTable, ScoreCache, evaluate_strategies
from shardplan.cost.sequence import tensor_rounds
from shardplan.cost.step import (
    StageProfile,
    profile_stage,
    stage_blocks,
)
from shardplan.errors import PlanError
from shardplan.ir.graph import Graph
from shardplan.ir.segments import Segment, subgraph
from shardplan.mesh import Mesh
from shardplan.plans import Plan
from shardplan.search import experts
from shardplan.search.step.families import (
    LEVERS,
    Family,
    choose_levers,
    data_degrees,
    expert_counts,
    heavier_than_fitted,
    lever_menu,
    stage_tensor_degrees,
)
from shardplan.search.step.increments import extrapolate, peaks, same_increment
from shardplan.search.step.recipes import context_rounds, expert_dim, expert_parallel
from shardplan.search.step.structure import (
    ChunkShape,
    LayerSplit,
    chunk_shape,
    fingerprint,
    reduced_chunk,
)
from shardplan.search.step.workers import SegmentWorkers
from shardplan.sharding import Strategy

Planner = Callable[[Graph, Mesh, CostOptions], Mapping[str, Strategy]]


class StageProfiler:
    """Profiles of chunks of one graph (the model at one micro-batch size) on one stage mesh,
    by family; D-Rec's per-segment strategies are shared by every graph and mesh through
    `drec_cache` (keyed by stage mesh and segment structure)."""

    def __init__(
        self,
        graph: Graph,
        segs: Sequence[Segment],
        prints: Sequence[int],
        split: LayerSplit,
        mesh: Mesh,
        opts: CostOptions,
        planner: Planner,
        drec_cache: dict[tuple[object, ...], tuple[Strategy, ...]],
        counter: list[int],
        micro_batches: int = 1,
        samples: int | None = None,
        experts: frozenset[int] | None = None,
        workers: SegmentWorkers | None = None,
    ) -> None:
        self.graph, self.segs, self.prints, self.split = graph, segs, prints, split
        self.samples = samples
        # each expert layer's expert count: expert parallelism must divide it
        self.experts = expert_counts(graph) if experts is None else experts
        self.mesh, self.opts, self.planner = mesh, opts, planner
        self.drec_cache, self.counter = drec_cache, counter
        self.micro_batches = micro_batches
        self.cache: dict[tuple[object, ...], StageProfile | None] = {}
        self.increments: dict[Family, tuple[StageProfile, StageProfile] | None] = {}
        self.periods: dict[Family, tuple[object, ...] | None] = {}  # the increment's (`_period`)
        self.reduced: dict[tuple[object, ...], tuple[Graph | None, list[int]]] = {}
        self.wholes: dict[tuple[int, int], Graph] = {}
        self.per_sub: dict[tuple[int, object], tuple[Graph, Any]] = {}  # `_per_sub`
        self.plans: dict[tuple[object, ...], tuple[tuple[Strategy, ...], StageProfile]] = {}
        self.prices = PriceTable(mesh, opts)  # one price per op class across the sub-graphs
        # priced as the step pays: the gradient sync once per m micro-batches
        self.weighted = replace(opts, grad_sync_weight=1.0 / micro_batches)
        self.workers = workers
        if workers is not None:  # D-Rec on the segments beside the pricing (`workers`)
            for k, seg in enumerate(segs):
                key = self._drec_key(k)
                if key not in drec_cache and key not in workers:
                    piece = subgraph(graph, seg.start, seg.stop)
                    workers.submit(key, piece, mesh, self.weighted)

    def families(self) -> list[Family]:
        """Every family this stage mesh allows (sequence-parallel variants where they apply)."""
        out = [Family("drec"), Family("drec", 1, True), Family("data-parallel")]
        for t in stage_tensor_degrees(self.mesh):
            out += [Family("megatron", t), Family("megatron", t, True)]
        for t in (1, *stage_tensor_degrees(self.mesh)):
            sps = (False, True) if t > 1 else (False,)
            data = self.mesh.size // t
            degrees = data_degrees(self.mesh, t)
            if self.experts:  # degrees that do not divide an expert count cannot split it
                fits = [d for d in degrees if all(e % d == 0 for e in self.experts)]
                out += [Family("megatron", t, sp, expert=d) for d in fits for sp in sps]
            # context parallelism: the largest degree the batch leaves idle (fewer ways idle)
            fill = [d for d in degrees if self.samples is not None and self.samples * d <= data]
            if fill:
                out += [Family("megatron", t, sp, context=fill[-1]) for sp in sps]
        return out

    def strategies(
        self, sub: Graph, family: Family, seg_range: Sequence[int]
    ) -> dict[str, Strategy]:
        """`family`'s strategies for `sub`, whose ops are those of segments `seg_range`."""
        if family.method == "data-parallel":
            return dict(self._data_walk(sub)[1])
        if family.method == "megatron":
            classes, data = self._data_walk(sub)
            t = family.tensor  # one Megatron plan for its expert and context variants
            st = self._per_sub(
                sub, ("megatron", t), lambda: experts.megatron(sub, self.mesh, t, classes, data)
            )
            cache = self._score_cache(sub)  # its ops' parameter dims, kept
            if family.expert > 1:
                dims = self._per_sub(
                    sub, "expert dims", lambda: {op.name: expert_dim(sub, op) for op in sub.ops}
                )
                st = expert_parallel(sub, self.mesh, st, family.expert, dims, cache)
            if family.context > 1:
                rounds = context_rounds(self.mesh, st, sub, family.context, cache)
                st = experts.context_parallel(sub, self.mesh, st, rounds, classes)
            return st
        out: dict[str, Strategy] = {}
        for k in seg_range:
            seg = self.segs[k]
            key = self._drec_key(k)
            cached = self.drec_cache.get(key)
            ops = self.graph.ops[seg.start : seg.stop]
            if cached is None:
                cached = self.workers.take(key, self._plan) if self.workers is not None else None
                if cached is None:  # no worker, or it failed the segment: planned here
                    piece = subgraph(self.graph, seg.start, seg.stop)
                    cached = self._plan(piece, self.mesh, self.weighted)
                self.drec_cache[key] = cached
                self.counter[0] += 1
            out.update((op.name, s) for op, s in zip(ops, cached, strict=True))
        return out

    def _plan(self, piece: Graph, mesh: Mesh, opts: CostOptions) -> tuple[Strategy, ...]:
        """The planner's strategies of a segment's sub-graph, in op order (`workers.Planner`)."""
        found = self.planner(piece, mesh, opts)
        return tuple(found[op.name] for op in piece.ops)

    def _drec_key(self, k: int) -> tuple[object, ...]:
        """Segment k's key in the D-Rec cache: stage mesh, segment structure, micro-batches."""
        return (self.mesh.shape, self.prints[k], self.micro_batches)

    def _data_walk(self, sub: Graph) -> tuple[list[int], dict[str, Strategy]]:
        """`sub`'s op classes and data-parallel plan, once per sub-graph: the data-parallel
        family's plan and the walk the Megatron expert at every degree starts from."""
        classes = self._per_sub(sub, "classes", lambda: experts.op_classes(sub))
        data = self._per_sub(sub, "data", lambda: experts.data_parallel(sub, self.mesh, classes))
        return classes, data

    def _exact(self, sub: Graph, family: Family, seg_range: Sequence[int]) -> StageProfile | None:
        plain_family = replace(family, sequence_parallel=False)  # the same strategies
        strategies = self._per_sub(
            sub, plain_family, lambda: self._strategies_or_none(sub, family, seg_range)
        )
        if strategies is None:
            return None
        sp = family.sequence_parallel
        cache = self._score_cache(sub)
        if sp and not tensor_rounds(sub, self.mesh, strategies, cache):
            return None  # nothing to split along the sequence: the family is not distinct
        plain = self._per_sub(  # the plan's own evaluation, shared by its sequence-parallel twin
            sub,
            ("plain", plain_family),
            lambda: evaluate_strategies(sub, self.mesh, strategies, self.opts, None, cache),
        )
        return profile_stage(
            sub,
            self.mesh,
            strategies,
            self.opts,
            sequence_parallel=sp,
            context_parallel=family.context > 1,
            cache=cache,
            plain=plain,
        )

    def _strategies_or_none(
        self, sub: Graph, family: Family, seg_range: Sequence[int]
    ) -> dict[str, Strategy] | None:
        try:
            st = self.strategies(sub, family, seg_range)
        except PlanError:  # experts or context that do not divide this chunk's dims
            return None
        return {op.name: st[op.name] for op in sub.ops}

    def _score_cache(self, sub: Graph) -> ScoreCache:
        """`sub`'s `ScoreCache` in the profiler's price table, one per sub-graph."""
        return self._per_sub(  # type: ignore[no-any-return]
            sub, "score", lambda: ScoreCache(sub, self.mesh, self.opts, self.prices)
        )

    def _per_sub(self, sub: Graph, key: object, make: Callable[[], Any]) -> Any:
        """`make()` once per (sub-graph, key), shared by every family that asks: its strategies,
        their plain evaluation, the `ScoreCache`, the Megatron expert's plan at each degree. Keyed
        by the sub-graph's identity; the entry holds the sub-graph, so the id is not reused."""
        found = self.per_sub.get((id(sub), key))
        if found is None or found[0] is not sub:
            found = self.per_sub[id(sub), key] = (sub, make())
        return found[1]

    def profile(self, a: int, e: int, family: Family) -> StageProfile | None:
        """The profile of chunk [a, e) (segments) under `family`; None when the family does not
        apply (sequence parallelism without tensor-parallel rounds)."""
        shape = chunk_shape(self.split, a, e)
        if shape.periods <= 4:  # its reductions would cost what the chunk costs
            return self._whole(a, e, family)
        if self.periods.get(family) is not None:  # the increment's period known op by op
            found = self._by_structure(shape, family)
            if found is not None:
                return found
        own2, own3 = (self._reduced(shape, j, family) for j in (2, 3))
        if family not in self.increments:  # the first chunk of the run priced under this family
            # a family that does not apply to this chunk (None) proves no increment either
            priced = own2 is not None and own3 is not None
            period = self._period(shape, family) if priced else None
            linear = priced and (period is not None or self._confirmed(shape, family, own2, own3))
            self.increments[family] = (own2, own3) if linear else None  # type: ignore[assignment]
            alike = priced and peaks(own2) == peaks(own3)  # type: ignore[arg-type]
            self.periods[family] = period if linear and alike else None
        step = self.increments[family]
        if own2 is None or own3 is None or peaks(own2) != peaks(own3):
            return self._whole(a, e, family)
        if step is not None and same_increment(own2, own3, *step):
            return extrapolate(own2, step[0], step[1], shape.periods)
        # another increment (a chunk cut mid-layer checkpoints other blocks): its own, when its
        # four-period reduction confirms it; else the layers do not repeat: price the chunk
        if not self._confirmed(shape, family, own2, own3):
            return self._whole(a, e, family)
        return extrapolate(own2, own2, own3, shape.periods)

    def _by_structure(self, shape: ChunkShape, family: Family) -> StageProfile | None:
        """The chunk's profile from its two-period reduction and the family's increment, its
        three-period reduction planned but not priced: when `family` cuts the chunk's two- and
        three-period reductions as one period repeated (`_period`) and that period is the
        increment's, op by op and segment by segment, the period added adds the increment's
        terms (each additive term reads an op, its operands' producers and its readers; the
        added period sits between two periods in both) and the peaks stay the two-period
        reduction's. None when that is not shown (the caller prices both reductions)."""
        own2 = self._reduced(shape, 2, family)
        if own2 is None or self._reduced_strategies(shape, 3, family) is None:
            return None
        if self._period(shape, family) != self.periods[family]:
            return None
        step = self.increments[family]
        assert step is not None  # a period is kept only with its increment
        return extrapolate(own2, step[0], step[1], shape.periods)

    def _periodic(self, shape: ChunkShape, family: Family) -> bool:
        """Whether `family` cuts the chunk's two- and three-period reductions as one period
        repeated (`_period`)."""
        return self._period(shape, family) is not None

    def _period(self, shape: ChunkShape, family: Family) -> tuple[object, ...] | None:
        """The period, when `family` cuts the chunk's two- and three-period reductions as one
        period repeated: every period alike op by op, and the ops before and after the periods
        alike in both; and full recomputation's blocks (`cost.step.stage_blocks`) those of the
        two-period reduction with one period's inserted. Every additive term reads an op, its
        operands' producers and its readers, so then each period added adds the same terms
        (one period's junction to the next is the same junction) and the four-period reduction
        `_confirmed` prices need not be built. The period as (its segments' structures, its
        cuts in op order, its blocks' offsets, and with sequence or context parallelism the
        reductions' tensor-parallel rounds, which they read graph-wide); None when not so cut."""
        plain = replace(family, sequence_parallel=False)
        cuts: list[list[Strategy]] = []
        subs: list[Graph] = []
        for j in (2, 3):
            found = self.reduced.get(self._reduced_key(shape, j)[0])
            sub = None if found is None else found[0]
            st = None if sub is None else self.per_sub.get((id(sub), plain))
            if sub is None or st is None or st[0] is not sub or st[1] is None:
                return None
            cuts.append([st[1][op.name] for op in sub.ops])
            subs.append(sub)
        segs = self.segs
        head = segs[shape.run_start].start - segs[shape.a].start
        length = segs[shape.run_start + shape.period].start - segs[shape.run_start].start
        two, three = cuts
        tail = len(two) - head - 2 * length
        if tail < 0 or len(three) != head + 3 * length + tail:
            return None
        period = three[head : head + length]
        alike = (
            all(
                cut[head + k * length : head + (k + 1) * length] == period
                for cut, k in ((two, 0), (two, 1), (three, 1), (three, 2))
            )
            and two[:head] == three[:head]
            and two[len(two) - tail :] == three[len(three) - tail :]
        )
        blocks = self._period_blocks(shape, subs[0], subs[1]) if alike else None
        if blocks is None:
            return None
        # the rounds some op splits a parameter in: sequence and context parallelism read them
        rounds: list[tuple[int, ...]] = [(), ()]
        if family.sequence_parallel or family.context > 1:
            rounds = [
                tensor_rounds(
                    sub, self.mesh, self.per_sub[id(sub), plain][1], self._score_cache(sub)
                )
                for sub in subs
            ]
        if rounds[0] != rounds[1]:
            return None
        run = range(shape.run_start, shape.run_start + shape.period)
        return (tuple(self.prints[k] for k in run), tuple(period), blocks, rounds[0])

    def _period_blocks(self, shape: ChunkShape, two: Graph, three: Graph) -> tuple[int, ...] | None:
        """The offsets of full recomputation's blocks in the period, when the three-period
        reduction's blocks are the two-period one's with the period's inserted after its first
        period (each reduction's segments those of the chunk it keeps); else None."""
        head, p = shape.run_start - shape.a, shape.period
        found = []
        for sub in (two, three):
            segs, starts, _ = stage_blocks(sub, self._score_cache(sub))
            kept = self.reduced[self._reduced_key(shape, 2 if sub is two else 3)[0]][1]
            sizes = [self.segs[k].stop - self.segs[k].start for k in kept]
            if [s.stop - s.start for s in segs] != sizes:
                return None
            found.append(starts)
        cut = head + p
        first = [k for k in found[0] if head <= k < cut]
        inserted = [k for k in found[0] if k < cut] + [k + p for k in first]
        if found[1] != inserted + [k + p for k in found[0] if k >= cut]:
            return None
        return tuple(k - head for k in first)

    def _confirmed(
        self,
        shape: ChunkShape,
        family: Family,
        own2: StageProfile | None,
        own3: StageProfile | None,
    ) -> bool:
        """Whether the four-period reduction adds what the three-period one added to the two-
        period one, with the same peaks: the increment own3 - own2 is the chunk's per period."""
        if own2 is None or own3 is None:
            return False
        own4 = self._reduced(shape, 4, family)
        return (
            own4 is not None
            and same_increment(own2, own3, own3, own4)
            and peaks(own3) == peaks(own4)
        )

    def _whole(self, a: int, e: int, family: Family) -> StageProfile | None:
        key = (family, tuple(self.prints[a:e]))
        if key not in self.cache:
            self.cache[key] = self._exact(self._whole_graph(a, e), family, range(a, e))
        return self.cache[key]

    def _whole_graph(self, a: int, e: int) -> Graph:
        """Chunk [a, e)'s sub-graph, one for every family."""
        if (a, e) not in self.wholes:
            self.wholes[a, e] = subgraph(self.graph, self.segs[a].start, self.segs[e - 1].stop)
        return self.wholes[a, e]

    def _reduced_key(self, shape: ChunkShape, j: int) -> tuple[tuple[object, ...], list[int]]:
        """The key of the chunk's j-period reduced graph (one for every family) and the
        segments it keeps."""
        keep = shape.run_start + j * shape.period + shape.rest
        kept = [*range(shape.a, keep), *range(shape.run_stop, shape.e)]
        return ("reduced", tuple(self.prints[k] for k in kept), shape.run_start - shape.a), kept

    def _reduced_graph(self, shape: ChunkShape, j: int) -> tuple[Graph | None, list[int]]:
        """The chunk's j-period reduced graph (None: not reducible) and the segments it keeps,
        made once for every family."""
        shared, kept = self._reduced_key(shape, j)
        if shared not in self.reduced:
            name = f"{self.graph.name}.reduced"
            self.reduced[shared] = (reduced_chunk(self.graph, self.segs, shape, j, name), kept)
        return self.reduced[shared]

    def _reduced(self, shape: ChunkShape, j: int, family: Family) -> StageProfile | None:
        key = (family, *self._reduced_key(shape, j)[0])
        if key not in self.cache:
            sub, its_segments = self._reduced_graph(shape, j)
            self.cache[key] = None if sub is None else self._exact(sub, family, its_segments)
        return self.cache[key]

    def _reduced_strategies(
        self, shape: ChunkShape, j: int, family: Family
    ) -> dict[str, Strategy] | None:
        """`family`'s strategies of the chunk's j-period reduction, planned, not priced (None:
        not reducible, or the family does not divide it)."""
        sub, its_segments = self._reduced_graph(shape, j)
        if sub is None:
            return None
        plain = replace(family, sequence_parallel=False)  # the strategies `_exact` keeps
        return self._per_sub(  # type: ignore[no-any-return]
            sub, plain, lambda: self._strategies_or_none(sub, family, its_segments)
        )

    def plan(self, sub: Graph, a: int, e: int, family: Family) -> tuple[Plan, StageProfile]:
        """The real plan of chunk [a, e) (its sub-graph `sub`) and its exact profile; chunks of
        one structure (`structure.fingerprint`: names aside, the same graph) are planned and
        profiled once, the others take that plan and profile op by op."""
        key = (family, tuple(self.prints[a:e]), fingerprint(sub))
        if key not in self.plans:
            st = self.strategies(sub, family, range(a, e))
            st = {op.name: st[op.name] for op in sub.ops}
            prof = profile_stage(
                sub,
                self.mesh,
                st,
                self.opts,
                sequence_parallel=family.sequence_parallel,
                context_parallel=family.context > 1,
            )
            self.plans[key] = (tuple(st[op.name] for op in sub.ops), prof)
        cuts, prof = self.plans[key]
        st = {op.name: cut for op, cut in zip(sub.ops, cuts, strict=True)}
        rows = tuple(
            replace(row, name=op.name) for op, row in zip(sub.ops, prof.breakdown.ops, strict=True)
        )
        prof = replace(prof, breakdown=replace(prof.breakdown, ops=rows))
        return Plan(sub, self.mesh, st, family.method, self.opts, cost=prof.breakdown), prof


__all__ = [
    "LEVERS",
    "Family",
    "StageProfiler",
    "choose_levers",
    "lever_menu",
    "heavier_than_fitted",
    "extrapolate",
    "fingerprint",
    "stage_tensor_degrees",
]
