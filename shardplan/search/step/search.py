"""The training-step search: the step model's whole menu, chosen jointly, pruned by a bound.

A candidate layout is (S pipeline stages on the outermost axis, v model chunks per device,
b samples per micro-batch, m = batch / b micro-batches, the chunk cut; `layouts`). Per layout,
every chunk (the model cut into S x v FLOP-balanced runs of whole segments,
`stages.stage_starts`, and also, when that differs, into equal whole layers as Megatron-LM cuts
it, `stages.aligned_starts`; chunk c on device group c mod S) is planned by every family of
`profiles.Family` — D-Rec's free per-op cuts, the data-parallel expert, the Megatron expert at
each tensor degree, each with and without sequence parallelism — and priced per micro-batch by
the step model (`cost.step`, chunks of one shape once, long runs of layers extrapolated from
two). Then the levers (recomputation none/selective/full x ZeRO 0-3):
  - uniform: one family and one lever on every chunk (what an engine configures: every Megatron
    recipe with tensor t, pipeline S, v chunks, micro-batch size b / data ways is one of these);
  - per stage (v = 1): each stage's family and lever with its shortest (m + S - 1) slot + sync
    within the budget (D-Rec where its plan is faster, an expert where not);
and `cost.step.step_cost` scores each assignment exactly; the fastest that fits wins, ties going
to the simpler layout. Because every recipe is a uniform assignment of some layout, the result
is never slower than a Megatron recipe that fits the same budget under the same model.
Layouts: S divides the outer axis (at most one stage per segment); v > 1 when the layer count is
a multiple of S x v (as Megatron-LM requires) and m a multiple of S; b a multiple of the data
ways of each tensor degree (every micro-batch size per rank) or one of `micro_batch_options`.
Bound (proven, `layouts`): per micro-batch a device runs a piece of each op of its chunks, which
takes at least the op's launch floor and its FLOPs and bytes at the global batch / (m n) at the
roofline, forward and its own backward each (`cost.terms.compute_cost`: a piece of a split op
moves and computes at least that much), plus the exposed sends of its widest boundary, and the
step is at least (m + (S - 1) / v) such slots. Layouts of one (S, m, cut) form a group (v
aside); groups run in order of their least layout bound (an interleaved one's bubble is the
smaller), each sharpened when first reached by the full recomputation its memory forces
(`bounds`: kept bytes no plan can split below) and put back in line if that moved it; within
a group every layout whose own bound is below the best step is tried, larger v filtered by
the group's first result (`_worth_interleaving`, not a bound); the search stops when the next
group's bound reaches the best step. The graph at a micro-batch size is made only when a
layout needs it (`sizes`). Deterministic. Progress goes to `progress`.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from shardplan import checks, units
from shardplan.cost import CostOptions
from shardplan.cost.step import Levers, StageProfile, step_cost
from shardplan.errors import InfeasibleError, SolverError
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.problem import Problem
from shardplan.search.drec.gates import without_gc_pauses
from shardplan.search.drec.search import drec
from shardplan.search.step.bounds import (
    ChunkFloors,
    FloorItems,
    chunk_floors,
    floor_items,
    forced_floor,
)
from shardplan.search.step.layouts import (
    Layout,
    boundary_items,
    ideal_seconds,
    layouts,
    micro_batch_options,
    sample_options,
)
from shardplan.search.step.notes import axis_summary, lever_notes
from shardplan.search.step.profiles import (
    LEVERS,
    Family,
    Planner,
    StageProfiler,
    choose_levers,
    expert_counts,
    heavier_than_fitted,
    lever_menu,
)
from shardplan.search.step.sizes import Built, ModelSizes
from shardplan.search.step.stages import (
    megatron_starts,
    stage_graphs,
    stage_mesh,
    stage_starts,
    tokens_per_sample,
)
from shardplan.search.step.workers import MIN_OPS, SLOW_LAYOUT, SegmentWorkers
from shardplan.sharding import Strategy
from shardplan.training import TrainingPlan, assemble, at_precision, pipeline_cut

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Choice:
    """A layout's best assignment: per chunk (family, levers), its step and memory."""

    layout: Layout
    assignment: tuple[tuple[Family, Levers], ...]
    step_s: float
    memory: float
    uniform: bool
    bubble_s: float = 0.0
    p2p_s: float = 0.0


def plan_training(
    build: Callable[[int], Graph | None],
    batch: int,
    mesh: Mesh,
    opts: CostOptions,
    budget: float | None,
    progress: Progress | None = None,
    planner: Planner | None = None,
    stages: Sequence[int] | None = None,
    overlap: Levers | None = None,
) -> TrainingPlan:
    """The pre-issue-22 entry point, kept for scripts: `search_step` on the Problem of these
    arguments (`sp.plan(build, mesh, method="step", batch=..., ...)` is the front door)."""
    probe = build(batch)
    if probe is None:
        raise SolverError(f"the model builder returned no graph at the global batch {batch}")
    problem = Problem(probe, mesh, opts, budget, None, batch, build)
    return search_step(problem, progress, planner, stages, overlap)


def search_step(
    problem: Problem,
    progress: Progress | None = None,
    planner: Planner | None = None,
    stages: Sequence[int] | None = None,
    overlap: Levers | None = None,
) -> TrainingPlan:
    """Search the layouts, families and levers (module docstring) for `problem` (its builder
    gives the model at each micro-batch size). InfeasibleError naming the leanest candidate
    when nothing fits the budget. `overlap`: the overlap fields every lever carries
    (`cost.levers.with_overlap`; None: nothing overlapped beyond tensor / context parallelism)."""
    with without_gc_pauses():  # millions of short-lived objects, no cycle to free early
        return _search_step(problem, progress, planner, stages, overlap)


def _search_step(
    problem: Problem,
    progress: Progress | None,
    planner: Planner | None,
    stages: Sequence[int] | None,
    overlap: Levers | None,
) -> TrainingPlan:
    opts, budget, batch = problem.options, problem.budget, problem.global_batch
    if budget is not None:
        checks.memory_bytes(budget, "training memory budget")  # NaN, inf, <= 0: MeshError
    mesh = at_precision(problem.mesh, opts)
    say = progress or (lambda _msg: None)
    start = time.perf_counter()
    search = _Search(problem, mesh, planner or _drec_planner, overlap)
    try:
        return _searched(search, problem, batch, stages, start, say)
    finally:
        search.workers.close()


def _searched(
    search: _Search,
    problem: Problem,
    batch: int,
    stages: Sequence[int] | None,
    start: float,
    say: Progress,
) -> TrainingPlan:
    """`search_step`'s loop over the layouts (module docstring), then the winner's plan."""
    budget = problem.budget
    found = search.layouts(batch, stages)
    say(f"  {len(found)} layouts (stages x chunks x micro-batch size), in order of their bound")
    best: Choice | None = None
    tried = 0
    first: dict[tuple[int, int, bool], tuple[int, Choice]] = {}  # a group's first fit, its v
    reached: dict[tuple[int, int, bool], float] = {}  # a group's least sharpened bound
    groups: dict[tuple[int, int, bool], list[Layout]] = {}  # (S, m, cut) -> layouts, v ascending
    for c in found:
        groups.setdefault(c.key(), []).append(c)
    # groups by their least layout bound (an interleaved bubble is smaller than the v = 1
    # twin's); sharpened (memory, `bounds`) when first reached
    heap = [(min(c.bound for c in g), key, False) for key, g in groups.items()]
    heapq.heapify(heap)
    while heap:
        bound, key, refined = heapq.heappop(heap)
        if best is not None and bound >= best.step_s:
            break
        if not refined:  # the least of its layouts' own sharpened bounds (each v its bubble)
            sharper = min(search.refined_bound(c) for c in groups[key])
            reached[key] = sharper
            if sharper > bound:  # back in line behind the groups it no longer precedes
                heapq.heappush(heap, (sharper, key, True))
                continue
        if search.workers.active:  # this group's D-Rec segments queued, then the next's
            search.warm(groups[key][0], _next_group(heap, groups, best))
        for layout in groups[key]:
            if best is not None and layout.bound >= best.step_s:
                continue  # each v its own bound: an interleaved one's bubble is smaller
            ref = first.get(key)
            if ref is not None and not _worth_interleaving(layout, ref[0], ref[1], best):
                continue
            tried += 1
            began = time.perf_counter()
            choice = search.evaluate(layout, say)
            if tried == 1 and time.perf_counter() - began >= SLOW_LAYOUT:
                search.start_worker()  # the other layouts will take seconds: D-Rec beside them
            if ref is None and choice is not None:
                first[key] = (layout.virtual, choice)
            elapsed = time.perf_counter() - start
            if choice is None:
                say(f"  {layout.text()}: does not fit ({elapsed:.1f} s)")
                continue
            say(
                f"  {layout.text()}: step {units.seconds(choice.step_s)}, "
                f"{units.nbytes(choice.memory)}/device, {search.drec_runs[0]} D-Rec runs so "
                f"far ({elapsed:.1f} s)"
            )
            if best is None or _better(choice, best):
                best = choice
    if best is not None:
        say(f"  the remaining layouts cannot beat {units.seconds(best.step_s)} (bound)")
    if best is None:
        raise search.infeasible(tried)
    # no plan of any layout beats its bound: the least bound known, sharpened where reached
    floor = min(reached.get(key, min(c.bound for c in g)) for key, g in groups.items())
    floor = min(floor, best.step_s)
    tp = search.materialize(best)
    notes = (*lever_notes(tp, budget), _search_note(best, tried, len(found), floor))
    return replace(
        tp,
        axes=axis_summary(tp),
        search_seconds=time.perf_counter() - start,
        notes=notes,
        step=tp.step,
        step_floor_s=floor,
    )


def _next_group(
    heap: list[tuple[float, tuple[int, int, bool], bool]],
    groups: Mapping[tuple[int, int, bool], list[Layout]],
    best: Choice | None,
) -> Layout | None:
    """The first layout of the group next in line, unless its bound already reaches the best
    step (a guess: the group evaluated now may lower the best below it)."""
    if not heap or (best is not None and heap[0][0] >= best.step_s):
        return None
    return groups[heap[0][1]][0]


def _worth_interleaving(layout: Layout, v0: int, ref: Choice, best: Choice | None) -> bool:
    """Interleaving shrinks the bubble ((S - 1)/v slots) and sends v times per slot: try v
    chunks when the group's first evaluated layout (`ref`, at v0 chunks), its bubble so shrunk
    and its sends so multiplied, reaches the best (a filter on the reference's terms)."""
    if best is None or ref is best:
        return True
    v, n, m = layout.virtual, layout.stages, layout.micro_batches
    sends = ref.p2p_s * ((m + (n - 1) / v) * v / ((m + (n - 1) / v0) * v0) - 1)
    return ref.step_s - ref.bubble_s * (1 - v0 / v) + sends < best.step_s


def _drec_planner(graph: Graph, mesh: Mesh, opts: CostOptions) -> Mapping[str, Strategy]:
    return drec(graph, mesh, opts)


def _search_note(best: Choice, tried: int, total: int, floor: float) -> str:
    families: dict[str, list[int]] = {}
    for c, (family, _) in enumerate(best.assignment):
        families.setdefault(family.text(), []).append(c)
    won = "; ".join(
        f"{f} on {'chunks' if len(v) > 1 else 'chunk'} {_span(v)}" for f, v in families.items()
    )
    how = (
        "one plan and lever on every stage, as an engine configures"
        if best.uniform
        else "each stage its own fastest plan and lever"
    )
    return (
        f"stage plans: {won} ({how}); D-Rec, data-parallel and Megatron at every tensor degree "
        "(with expert parallelism on expert layers, context parallelism where the micro-batch "
        f"cannot fill the data-parallel ways) were priced on every stage under the step model; "
        f"{tried} of {total} layouts evaluated, the rest bounded out; no plan of these layouts "
        f"steps faster than {units.seconds(floor)} (the proven bound: FLOPs and bytes at the "
        f"roofline over the pipeline's slots), {_gap(best.step_s, floor)}"
    )


def _gap(step: float, floor: float) -> str:
    if floor <= 0.0 or step <= floor:
        return "the step found is at that bound"
    return f"the step found is {100.0 * (step / floor - 1.0):.1f} % above it"


def _span(xs: list[int]) -> str:
    if len(xs) > 1 and xs[-1] - xs[0] == len(xs) - 1:
        return f"{xs[0]}-{xs[-1]}"
    return ", ".join(map(str, xs))


class _Search:
    """Evaluates layouts; caches the graphs per micro-batch size (`sizes`: built or derived),
    the profilers per (micro-batch size, stage mesh) and D-Rec's per-segment strategies."""

    def __init__(
        self, problem: Problem, mesh: Mesh, planner: Planner, overlap: Levers | None = None
    ) -> None:
        self.problem, self.mesh, self.planner = problem, mesh, planner
        self.overlap = overlap or Levers()  # nothing overlapped beyond TP / CP
        self.sizes = ModelSizes(problem.builder(), problem.graph, problem.global_batch)
        self.profilers: dict[tuple[int, tuple[int, ...]], StageProfiler] = {}
        self.experts: dict[int, frozenset[int]] = {}  # per micro-batch size
        self.drec_cache: dict[tuple[object, ...], tuple[Strategy, ...]] = {}
        self.drec_runs = [0]
        self.starts: dict[tuple[int, bool], list[int]] = {}
        self.leanest: tuple[float, str] | None = None
        probe = problem.graph
        self.ideal = ideal_seconds(probe, mesh, problem.options)
        self.floors: dict[tuple[int, int, bool], list[ChunkFloors]] = {}
        self.floor_items: dict[int, FloorItems] = {}  # per micro-batch size
        self.probe_split = self.sizes.probe[3]
        self.menus: dict[tuple[bool, bool], tuple[Levers, ...]] = {}
        # D-Rec on the stage segments beside the pricing, for a model that takes seconds
        # (`workers`; a caller's own planner runs in process)
        self.own_planner = planner is _drec_planner
        self.workers = SegmentWorkers(len(probe.ops) >= MIN_OPS and self.own_planner)

    def start_worker(self) -> None:
        """Start the D-Rec worker late (a smaller model whose layouts prove slow): profilers
        made from now on queue their segments for it (a caller's own planner runs in process)."""
        if self.own_planner:
            self.workers.start()

    def menu(self, sequence_parallel: bool, context_parallel: bool) -> tuple[Levers, ...]:
        """`profiles.lever_menu` under the search's overlap, made once per flag pair."""
        key = (sequence_parallel, context_parallel)
        if key not in self.menus:
            self.menus[key] = lever_menu(sequence_parallel, context_parallel, self.overlap)
        return self.menus[key]

    def graph(self, b: int) -> Built | None:
        return self.sizes(b)

    def layouts(self, batch: int, stages: Sequence[int] | None) -> list[Layout]:
        """`layouts.layouts` of the problem, its bounds counting the pipeline sends unless the
        engine overlaps them."""
        p = self.problem
        sends = None if self.overlap.overlap_p2p else boundary_items(p.graph, p.options)
        return layouts(
            p.graph, self.probe_split, self.mesh, batch, stages, self.chunk_cuts, self.ideal, sends
        )

    def refined_bound(self, layout: Layout) -> float:
        """`layout`'s bound with the full recomputation its memory forces (`bounds`)."""
        built, budget = self.graph(layout.sample), self.problem.budget
        probe_segs = self.sizes.probe[1]
        if built is None or budget is None or len(built[1]) != len(probe_segs):
            return layout.bound
        graph, segs = built[0], built[1]
        n, m, v = layout.stages, layout.micro_batches, layout.virtual
        starts = self.chunk_starts(n * v, layout.aligned)
        key = (layout.sample, n * v, layout.aligned)
        if key not in self.floors:
            opts = self.problem.options
            if layout.sample not in self.floor_items:
                self.floor_items[layout.sample] = floor_items(graph, segs, opts)
            items = self.floor_items[layout.sample]
            self.floors[key] = chunk_floors(graph, segs, starts, opts, items)
        devices = stage_mesh(self.mesh, n).size
        ideal, floor, bwd_ideal, bwd_floor = self.ideal
        forward = np.maximum(floor, ideal / (m * devices))
        piece = forward + np.maximum(bwd_floor, bwd_ideal / (m * devices))
        ends = [*starts[1:], len(probe_segs)]
        ranges = [
            (probe_segs[a].start, probe_segs[e - 1].stop) for a, e in zip(starts, ends, strict=True)
        ]
        forced = forced_floor(self.floors[key], forward, ranges, n, v, m, devices, budget)
        heaviest = max(
            sum(float(piece[a:e].sum()) for a, e in ranges[d::n]) + forced[d] for d in range(n)
        )
        return max(layout.bound, (m + (n - 1) / v) * (heaviest + layout.sends))

    def chunk_starts(self, chunks: int, aligned: bool = False) -> list[int]:
        """The first segment of each chunk: FLOP-balanced, or `aligned` (Megatron-LM's cut)."""
        if (chunks, aligned) not in self.starts:
            probe, segs = self.sizes.probe[0], self.sizes.probe[1]
            self.starts[chunks, aligned] = (
                megatron_starts(probe, chunks, segs, self.probe_split)
                if aligned
                else stage_starts(probe, chunks, segs)
            )
        return self.starts[chunks, aligned]

    def chunk_cuts(self, chunks: int) -> list[tuple[bool, list[int]]]:
        """The cuts tried: FLOP-balanced, and Megatron-LM's equal layers when that differs (so
        every recipe's layout is a candidate, `recipes.megatron_recipe`)."""
        balanced, aligned = self.chunk_starts(chunks), self.chunk_starts(chunks, True)
        return [(False, balanced)] + ([(True, aligned)] if aligned != balanced else [])

    def profiler(self, b: int, smesh: Mesh) -> StageProfiler | None:
        key = (b, smesh.shape)
        if key not in self.profilers:
            built = self.graph(b)
            if built is None:
                return None
            g, segs, prints, split = built
            if b not in self.experts:  # once per graph, shared by its stage meshes
                self.experts[b] = expert_counts(g)
            self.profilers[key] = StageProfiler(
                g,
                segs,
                prints,
                split,
                smesh,
                self.problem.options,
                self.planner,
                self.drec_cache,
                self.drec_runs,
                self.problem.global_batch // b,
                b,
                self.experts[b],
                self.workers,
            )
        return self.profilers[key]

    def warm(self, layout: Layout, upcoming: Layout | None) -> None:
        """Make the profilers of `layout` and of `upcoming` (their D-Rec segments queued for
        the worker in that order), so the worker plans the next group's segments while this
        process prices the current one's (`workers`): no result depends on it."""
        for c in (layout, upcoming):
            if c is not None:
                self.profiler(c.sample, stage_mesh(self.mesh, c.stages))

    def evaluate(self, layout: Layout, say: Progress) -> Choice | None:
        """The layout's fastest assignment that fits (module docstring), or None."""
        n, v, m, b = layout.stages, layout.virtual, layout.micro_batches, layout.sample
        smesh = stage_mesh(self.mesh, n)
        prof = self.profiler(b, smesh)
        if prof is None:
            say(f"  {layout.text()}: the model cannot be rebuilt at micro-batch {b}; skipped")
            return None
        starts = self.chunk_starts(n * v, layout.aligned)
        ranges = list(zip(starts, [*starts[1:], len(prof.segs)], strict=True))
        bounds = [prof.segs[a].start for a in starts] + [len(prof.graph.ops)]
        batch = self.problem.global_batch
        tokens = tokens_per_sample(self.problem.graph, batch)
        pipe = pipeline_cut(prof.graph, bounds, self.problem.options, self.mesh, batch, tokens, v)
        families = prof.families()
        # the experts first: D-Rec's segment plans may still be on their way (`workers`)
        priced = {
            f: [prof.profile(a, e, f) for a, e in ranges]
            for f in sorted(families, key=lambda f: f.method == "drec")
        }
        table = {f: priced[f] for f in families}
        budget = self.problem.budget
        best: Choice | None = None
        if v == 1:
            best = self._per_stage(layout, table, pipe, budget)
        for family, profiles in table.items():
            if any(p is None for p in profiles):
                continue
            ps = [p for p in profiles if p is not None]
            fitted: set[int] = set()  # ZeRO stages a lighter recomputation already fits
            for lv in self.menu(family.sequence_parallel, family.context > 1):
                if heavier_than_fitted(lv, fitted, self.overlap):
                    continue
                step = step_cost(ps, [lv] * len(ps), m, pipe)
                mem = step.memory_per_device
                if budget is not None and mem > budget:
                    if self.leanest is None or mem < self.leanest[0]:
                        self.leanest = (mem, f"{layout.text()} {family.text()}")
                    continue
                fitted.add(lv.zero)
                choice = Choice(
                    layout,
                    tuple((family, lv) for _ in ps),
                    step.step_s,
                    mem,
                    True,
                    step.bubble_s,
                    step.p2p_s,
                )
                if best is None or choice.step_s < best.step_s * (1 - 1e-9):
                    best = choice
        return best

    def _per_stage(
        self,
        layout: Layout,
        table: Mapping[Family, Sequence[StageProfile | None]],
        pipe: object,
        budget: float | None,
    ) -> Choice | None:
        n, m = layout.stages, layout.micro_batches
        picks: list[tuple[Family, Levers]] = []
        profiles: list[StageProfile] = []
        for c in range(n):
            options = []
            for family, row in table.items():
                p = row[c]
                fit = (
                    None
                    if p is None
                    else choose_levers(
                        p,
                        m,
                        min(n - c, m),
                        m + n - 1,
                        budget,
                        self.overlap,
                        self.menu(p.sequence_parallel, p.context_parallel),
                    )
                )
                if fit is not None and p is not None:
                    options.append((fit[0], len(options), family, fit[1], p))
            if not options:
                return None
            _, _, family, lv, p = min(options, key=lambda o: (o[0], o[1]))
            picks.append((family, lv))
            profiles.append(p)
        step = step_cost(profiles, [lv for _, lv in picks], m, pipe)  # type: ignore[arg-type]
        if budget is not None and step.memory_per_device > budget:
            return None
        return Choice(
            layout,
            tuple(picks),
            step.step_s,
            step.memory_per_device,
            False,
            step.bubble_s,
            step.p2p_s,
        )

    def materialize(self, choice: Choice) -> TrainingPlan:
        """The winner's real stage plans, exactly profiled, as a TrainingPlan."""
        layout = choice.layout
        smesh = stage_mesh(self.mesh, layout.stages)
        prof = self.profiler(layout.sample, smesh)
        assert prof is not None
        starts = self.chunk_starts(layout.stages * layout.virtual, layout.aligned)
        ends = [*starts[1:], len(prof.segs)]
        chosen = []
        for sub, a, e, (family, lv) in zip(
            stage_graphs(prof.graph, starts), starts, ends, choice.assignment, strict=True
        ):
            plan, exact = prof.plan(sub, a, e, family)
            chosen.append((plan, exact, lv))
        probe = self.problem.graph
        batch = self.problem.global_batch
        return assemble(
            probe.name,
            self.mesh,
            batch,
            chosen,
            layout.micro_batches,
            "drec",
            tokens_per_sample(probe, batch),
            layout.virtual,
        )

    def infeasible(self, tried: int) -> InfeasibleError:
        leanest, budget = self.leanest, self.problem.budget
        detail = f"; the leanest ({leanest[1]}) needs {units.nbytes(leanest[0])}" if leanest else ""
        return InfeasibleError(
            f"no training plan of {self.problem.graph.name!r} fits "
            f"{units.nbytes(budget or 0)} per device on mesh {self.mesh.text()} with any of "
            f"{tried} (stages, micro-batches) candidates, recomputation and ZeRO{detail}; use "
            "more devices or a larger --memory"
        )


def _better(a: Choice, b: Choice) -> bool:
    """Faster wins; on a tie, fewer stages, then fewer chunks, then fewer micro-batches, then
    the FLOP-balanced cut."""
    if a.step_s < b.step_s * (1 - 1e-9):
        return True
    tie = a.step_s <= b.step_s * (1 + 1e-9)
    key = lambda c: (c.layout.stages, c.layout.virtual, c.layout.micro_batches, c.layout.aligned)  # noqa: E731
    return tie and key(a) < key(b)


__all__ = [
    "LEVERS",
    "Layout",
    "micro_batch_options",
    "plan_training",
    "sample_options",
    "search_step",
]
