"""Engine menus: the training plans torchtitan, Megatron-LM and DeepSpeed can express, searched.

An engine's `Menu` (search/step/engine_menus.py) says what its configuration can express. Every
engine configures one layout for the whole run: a tensor-parallel degree t (the innermost rounds of
the mesh, Megatron-style cuts, `experts.megatron`), a pipeline degree S over the outermost axis with
v model chunks per stage (interleaved 1F1B where the engine can say it) of an equal number of
transformer layers (the embedding on the first chunk, the head on the last), data parallelism on the
remaining ways, m micro-batches, sequence parallelism on or off where the engine can say it, context
or expert parallelism over data-parallel rounds where it can say them (`_candidates`), and one
recomputation mode and ZeRO stage on every stage. `plan_for_menu` searches exactly that space with
the step model (cost/step.py): for each S dividing the outer axis and the layer count (or, where the
engine can say uneven stages, any S up to the layer count, the first and last stage apart from an
even middle, each stage's layers in v equal chunks: `uneven.first_last_layers`), each allowed t,
each per-rank micro-batch size in MICRO_BATCH_SIZES that divides the batch, each v with S x v
dividing the layers and m a multiple of S (Megatron-LM's rule), the chunks are priced by the step
search's `StageProfiler` under the expert (chunks of one structure once, long runs of layers
extrapolated from two), and the allowed lever with the shortest step that fits the budget is kept;
layouts run in order of the training search's lower bound (m + (S - 1)/v slots of the heaviest
device's roofline compute, search/step/layouts.py) and the search stops when the bound reaches the
best step found; the winner is then built and priced whole (`layout_plan`, also used to score a
user's config; context and expert parallelism there too). Layers are the longest periodic run of
segment fingerprints (`layer_split`), so no op name is read. Each engine's levers carry what it
overlaps by default (`Menu.engine_levers`, `cost.overlap`): torchtitan its DDP / FSDP2 gradient sync
and FSDP2 prefetch, DeepSpeed ZeRO-3's `overlap_comm` and prefetch, Megatron-LM its interleaved
schedule's sends. The user's own overlap flags replace those defaults where the engine's
configuration has the switch (`Menu.with_overlaps`). Cost: O(layouts reached x chunks) step-model
sums plus O((S, t, micro-batch size) x distinct chunk structures x ops of four layers) chunk
pricing.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from shardplan import units
from shardplan.cost import CostOptions
from shardplan.cost.step import (
    Levers,
    StageProfile,
    StepCost,
    profile_stage,
    step_cost,
)
from shardplan.cost.work import ideal_compute, whole_op_bytes
from shardplan.errors import ArgumentError, InfeasibleError, PlanError, SolverError
from shardplan.ir.graph import Graph
from shardplan.ir.segments import Segment, segments, subgraph
from shardplan.mesh import Mesh
from shardplan.plans import Plan
from shardplan.search import experts
from shardplan.search.step.engine_menus import MENUS, Menu, get_menu, tensor_degrees
from shardplan.search.step.notes import axis_summary, steps_note
from shardplan.search.step.profiles import (
    Family,
    StageProfiler,
    data_degrees,
    expert_counts,
)
from shardplan.search.step.recipes import context_rounds, expert_parallel
from shardplan.search.step.stages import (
    segment_flops,
    stage_mesh,
    tokens_per_sample,
)
from shardplan.search.step.structure import (
    LayerSplit,
    graph_layers,
    layer_split,
    segment_prints,
)
from shardplan.search.step.uneven import chunk_layers, chunk_starts, first_last_layers
from shardplan.sharding import Strategy
from shardplan.training import Stage, TrainingPlan, at_precision, pipeline_cut

Progress = Callable[[str], None]

MICRO_BATCH_SIZES = (1, 2, 4, 8)
"""Per-rank micro-batch sizes tried (powers of two, as the engines' example configs use)."""


@dataclass(frozen=True, slots=True)
class Layout:
    """One engine layout: tensor degree, pipeline stages, micro-batches, levers; model chunks per
    pipeline stage (`virtual`, interleaved 1F1B), context- and expert-parallel degrees."""

    tensor: int
    pipeline: int
    micro_batches: int
    levers: Levers = Levers()
    virtual: int = 1
    context: int = 1
    expert: int = 1
    stage_layers: tuple[int, ...] = ()
    """Transformer layers per model chunk in model order when not even (Megatron-LM's
    `--decoder-first/last-pipeline-num-layers`, a torchtitan module list per stage); (): even."""


class _Stages:
    """Expert stage plans and their profiles, cached by (stage mesh, t, SP, c, e, structure):
    a chunk's structure is its segments' prints (`structure.segment_prints`, numbered alike
    across the graphs of every micro-batch size), so a chunk already priced costs no
    sub-graph."""

    def __init__(self, opts: CostOptions) -> None:
        self.opts = opts
        self.cache: dict[tuple[object, ...], tuple[str, tuple[Strategy, ...], StageProfile]] = {}
        self.ids: dict[tuple[object, ...], int] = {}
        self.cuts: dict[tuple[object, ...], tuple[Strategy, ...]] = {}
        self.graphs: dict[int, tuple[Graph, tuple[Segment, ...], list[int]]] = {}
        self.profilers: dict[tuple[int, tuple[int, ...]], tuple[Graph, StageProfiler]] = {}

    def profiler(self, graph: Graph, mesh: Mesh, micro_batches: int) -> StageProfiler:
        """The step search's `StageProfiler` of `graph` on stage mesh `mesh`, once per pair: its
        chunk profiles extrapolate long runs of layers from two (`profiles`), for the search."""
        hit = self.profilers.get((id(graph), mesh.shape))
        if hit is None or hit[0] is not graph:
            segs, prints = self.structure(graph)
            prof = StageProfiler(
                graph,
                segs,
                prints,
                layer_split(prints),
                mesh,
                self.opts,
                _no_drec,
                {},
                [0],
                micro_batches,
                None,
                expert_counts(graph),
            )
            hit = self.profilers[id(graph), mesh.shape] = (graph, prof)
        return hit[1]

    def structure(self, graph: Graph) -> tuple[tuple[Segment, ...], list[int]]:
        """`graph`'s segments and their prints, once per graph."""
        hit = self.graphs.get(id(graph))
        if hit is None or hit[0] is not graph:  # the entry holds the graph: its id stays its
            segs = segments(graph)
            hit = self.graphs[id(graph)] = (graph, segs, segment_prints(graph, segs, self.ids))
        return hit[1], hit[2]

    def priced(
        self, graph: Graph, a: int, e: int, mesh: Mesh, layout: Layout, sp: bool
    ) -> tuple[str, tuple[Strategy, ...], StageProfile]:
        """The method, cuts and profile of segments [a, e) of `graph` under `layout`'s expert."""
        segs, prints = self.structure(graph)
        t, c, x = layout.tensor, layout.context, layout.expert
        key = (mesh.shape, t, sp, c, x, tuple(prints[a:e]))
        hit = self.cache.get(key)
        if hit is None:
            sub = subgraph(graph, segs[a].start, segs[e - 1].stop, f"{graph.name}.chunk")
            plain = key[:2] + key[3:]  # one expert plan for the SP twins
            if plain not in self.cuts:
                self.cuts[plain] = self._cuts(sub, mesh, t, c, x)
            cuts = self.cuts[plain]
            st = {op.name: cut for op, cut in zip(sub.ops, cuts, strict=True)}
            prof = profile_stage(
                sub, mesh, st, self.opts, sequence_parallel=sp, context_parallel=c > 1
            )
            hit = self.cache[key] = ("data-parallel" if t == 1 else "megatron", cuts, prof)
        return hit

    @staticmethod
    def _cuts(sub: Graph, mesh: Mesh, t: int, c: int, x: int) -> tuple[Strategy, ...]:
        """The expert's strategies of `sub` at tensor t, context c, expert x ways."""
        if t == 1 and c == x == 1:
            st = experts.data_parallel(sub, mesh)
        else:  # as the Megatron recipe places expert and context ways (recipes.py)
            st = expert_parallel(sub, mesh, experts.megatron(sub, mesh, t), x)
            if c > 1:
                st = experts.context_parallel(sub, mesh, st, context_rounds(mesh, st, sub, c))
        return tuple(st[op.name] for op in sub.ops)


def _no_drec(graph: Graph, mesh: Mesh, opts: CostOptions) -> Mapping[str, Strategy]:
    raise SolverError("an engine layout plans its stages with the experts, never D-Rec")


def layout_plan(
    graph: Graph,
    batch: int,
    mesh: Mesh,
    opts: CostOptions,
    layout: Layout,
    menu: Menu | None = None,
    budget: float | None = None,
    cache: _Stages | None = None,
    split: LayerSplit | None = None,
) -> TrainingPlan | None:
    """The plan of `layout` with `graph` built at the micro-batch size; with `menu`, the
    allowed lever with the shortest step fitting `budget` replaces `layout.levers` (None when
    none fits). `split`: the graph's layers when known (the same at every batch size).
    Raises PlanError when the layout does not divide the mesh, batch or layers."""
    stages = cache or _Stages(opts)
    found = layout_step(graph, batch, mesh, opts, layout, menu, budget, stages, split)
    if found is None:
        return None
    step, lv, starts = found
    mesh = at_precision(mesh, opts)
    smesh = stage_mesh(mesh, layout.pipeline)
    segs, _ = stages.structure(graph)
    ends = [*starts[1:], len(segs)]
    plans = []
    for s, (a, e) in enumerate(zip(starts, ends, strict=True)):
        method, cuts, prof = stages.priced(graph, a, e, smesh, layout, lv.sequence_parallel)
        sub = subgraph(graph, segs[a].start, segs[e - 1].stop, f"{graph.name}.stage{s}")
        mapped = {op.name: cut for op, cut in zip(sub.ops, cuts, strict=True)}
        rows = tuple(
            replace(row, name=op.name) for op, row in zip(sub.ops, prof.breakdown.ops, strict=True)
        )
        cost = replace(prof.breakdown, ops=rows)
        plans.append(Plan(sub, smesh, mapped, method, opts, cost=cost))
    m, v = layout.micro_batches, layout.virtual
    tokens = tokens_per_sample(graph, batch // m) if batch // m else 1
    tp = TrainingPlan(
        graph.name,
        mesh,
        batch,
        m,
        tuple(Stage(p, lv) for p in plans),
        "engine-layout",
        tokens,
        step=step,
        virtual_stages=v,
    )
    return replace(tp, axes=axis_summary(tp), step=step)


def layout_step(
    graph: Graph,
    batch: int,
    mesh: Mesh,
    opts: CostOptions,
    layout: Layout,
    menu: Menu | None,
    budget: float | None,
    stages: _Stages,
    split: LayerSplit | None = None,
    extrapolate: bool = False,
) -> tuple[StepCost, Levers, list[int]] | None:
    """`layout_plan`'s step, levers and chunk starts (segments), without the stage plans;
    `extrapolate`: chunk profiles by the step search's `StageProfiler` (long runs of layers
    from two and three, to rounding; the search's), else each chunk priced whole (exact)."""
    mesh = at_precision(mesh, opts)
    t, n, m, v = layout.tensor, layout.pipeline, layout.micro_batches, layout.virtual
    c = layout.context
    data = _layout_data(mesh, batch, layout)
    split = split or graph_layers(graph)
    segs, _ = stages.structure(graph)
    starts = chunk_starts(split, n * v, layout.stage_layers)
    ends = [*starts[1:], len(segs)]
    smesh = stage_mesh(mesh, n)
    sp = layout.levers.sequence_parallel or (menu is not None and menu.sequence_parallel_at(t))
    chunks = list(zip(starts, ends, strict=True))
    fast: list[StageProfile | None] = [None] * len(chunks)
    if extrapolate:
        family = (
            Family("data-parallel")
            if t == c == layout.expert == 1
            else Family("megatron", t, sp, c, layout.expert)
        )
        fast = [stages.profiler(graph, smesh, m).profile(a, e, family) for a, e in chunks]
    # None: not extrapolated, or SP where the expert splits nothing along the sequence
    profiles = [
        p if p is not None else stages.priced(graph, a, e, smesh, layout, sp)[2]
        for p, (a, e) in zip(fast, chunks, strict=True)
    ]
    tokens = tokens_per_sample(graph, batch // m) if batch // m else 1
    bounds = [*(segs[k].start for k in starts), len(graph.ops)]
    pipe = pipeline_cut(graph, bounds, opts, mesh, batch, tokens, v)
    cp = replace(layout.levers, sequence_parallel=sp, context_parallel=c > 1)
    if menu is None:
        choices: tuple[Levers, ...] = (cp,)
    else:  # the engine's levers, with the sequence parallelism its tensor layout runs
        width = gradient_width(graph, opts)
        choices = tuple(
            menu.engine_levers(
                replace(lv, sequence_parallel=sp, context_parallel=c > 1), width, v, data
            )
            for lv in menu.levers(n, c > 1 or layout.expert > 1)
        )
    best = None
    for lv in choices:
        step = step_cost(profiles, [lv] * len(profiles), m, pipe)
        if budget is not None and step.memory_per_device > budget:
            continue
        if best is None or step.step_s < best[0].step_s * (1 - 1e-9):
            best = (step, lv)
    return None if best is None else (best[0], best[1], starts)


def gradient_width(graph: Graph, opts: CostOptions) -> int:
    """Bytes per gradient element (the first parameter's): what sizes an engine's buckets."""
    params = graph.parameters
    return opts.element_bytes(params[0]) if params else 4


def _layout_data(mesh: Mesh, batch: int, layout: Layout) -> int:
    """The data-parallel ways of `layout` on `mesh` (tensor x pipeline x context aside), or a
    PlanError naming what does not divide."""
    t, n, m, v = layout.tensor, layout.pipeline, layout.micro_batches, layout.virtual
    c, e = layout.context, layout.expert
    if mesh.shape[0] % n or mesh.size % (t * n * c):
        raise PlanError(
            f"tensor {t} x pipeline {n}{f' x context {c}' if c > 1 else ''} does not divide mesh "
            f"{mesh.text()} (pipeline stages split the outermost axis)"
        )
    data = mesh.size // (t * n * c)
    if batch % m or (batch // m) % data:
        raise PlanError(
            f"batch {batch} is not {m} micro-batches of a multiple of the {data} data-parallel ways"
        )
    if data % e:
        raise PlanError(f"expert parallelism {e} must divide the {data} data-parallel ways")
    if v > 1 and n == 1:
        raise PlanError(f"{v} chunks per pipeline stage (interleaved 1F1B) need pipeline > 1")
    if v > 1 and m % n:
        raise PlanError(
            f"{v} chunks per pipeline stage (interleaved 1F1B): the {m} micro-batches must be a "
            f"multiple of the {n} pipeline stages (as Megatron-LM requires)"
        )
    return data


def plan_for_menu(
    build: Callable[[int], Graph | None],
    batch: int,
    mesh: Mesh,
    opts: CostOptions,
    budget: float | None,
    menu: Menu,
    progress: Progress | None = None,
) -> TrainingPlan:
    """The fastest plan `menu`'s engine can express that fits `budget` (module docstring)."""
    say = progress or (lambda _msg: None)
    start = time.perf_counter()
    if opts.precision is not None and opts.precision.name not in menu.precisions:
        raise ArgumentError(
            f"{menu.engine} trains in {', '.join(menu.precisions)}, not {opts.precision.name}; "
            "pick another --dtype"
        )
    probe = build(batch)
    if probe is None:
        raise SolverError(f"the model builder returned no graph at the global batch {batch}")
    split = graph_layers(probe)
    candidates = _candidates(probe, split, batch, at_precision(mesh, opts), opts, menu)
    best: tuple[float, Layout, Graph] | None = None
    cache = _Stages(opts)
    built: dict[int, Graph | None] = {batch: probe}
    tried = 0
    # in order of the bound; stop at the first that cannot beat the best found
    for bound, n, t, m, v, sp, e, c, layers in candidates:
        if best is not None and bound >= best[0]:
            say(f"  the remaining {menu.engine} layouts cannot beat {best[0]:.4g} s")
            break
        b = batch // m
        if b not in built:
            built[b] = build(b)
        graph = built[b]
        if graph is None:
            continue
        tried += 1
        layout = Layout(t, n, m, Levers(sequence_parallel=sp), v, c, e, layers)
        data = mesh.size // (n * t * c)
        label = (
            f"pipeline {n}{f' x {v} chunks' if v > 1 else ''}"
            f"{f' (layers {list(layers)})' if layers else ''} x tensor {t}{' (SP)' if sp else ''}"
            f"{f' x context {c}' if c > 1 else ''} x data {data}"
            f"{f' (expert {e})' if e > 1 else ''}, micro-batch {b // data} (m={m})"
        )
        try:
            found = layout_step(graph, batch, mesh, opts, layout, menu, budget, cache, split, True)
        except PlanError as err:  # context ways that do not divide the sequence
            say(f"  {menu.engine}: {label}: {err}")
            continue
        if found is None:
            say(f"  {menu.engine}: {label}: does not fit")
            continue
        say(f"  {menu.engine}: {label}: step {found[0].step_s:.4g} s")
        if best is None or found[0].step_s < best[0] * (1 - 1e-9):
            best = (found[0].step_s, layout, graph)
    if best is None:
        raise _nothing(probe, split, batch, mesh, budget, menu, tried if candidates else None)
    _, layout, graph = best
    plan = layout_plan(graph, batch, mesh, opts, layout, menu, budget, cache, split)
    assert plan is not None  # it fitted in `layout_step`
    return replace(
        plan,
        method=f"target-{menu.engine}",
        search_seconds=time.perf_counter() - start,
        notes=(_menu_note(plan, menu, layout),),
        step=plan.step,
    )


def _nothing(
    probe: Graph,
    split: LayerSplit,
    batch: int,
    mesh: Mesh,
    budget: float | None,
    menu: Menu,
    tried: int | None,
) -> InfeasibleError:
    """Why `menu` has no plan: no layout at all (`tried` None), or none of `tried` fits."""
    if tried is None:
        return InfeasibleError(
            f"{menu.engine} has no layout of {probe.name!r} on mesh {mesh.text()} at batch "
            f"{batch}: its pipeline stages must divide the outermost axis and "
            f"{'be at most' if menu.stage_layers != 'even' else 'divide'} the "
            f"{split.layers} layers, and the batch must split over the data-parallel ways in "
            f"micro-batches of {', '.join(map(str, MICRO_BATCH_SIZES))}; try another --batch or "
            "--mesh, or drop --target"
        )
    room = f"fits {units.nbytes(budget)} per device" if budget is not None else "fits"
    return InfeasibleError(
        f"no {menu.engine} layout of {probe.name!r} {room} on mesh {mesh.text()} ({tried} "
        f"layouts of tensor x pipeline x chunks x data x micro-batch size with "
        f"{menu.engine}'s recomputation and ZeRO); use more devices, a larger --memory, or "
        "drop --target"
    )


def _menu_note(plan: TrainingPlan, menu: Menu, layout: Layout) -> str:
    lv = plan.stages[0].levers
    sp_text = " (sequence parallel)" if lv.sequence_parallel else ""
    sp_text += f", context x{layout.context}" if layout.context > 1 else ""
    sp_text += f", expert x{layout.expert}" if layout.expert > 1 else ""
    v = plan.virtual_stages
    v_text = f" with {v} chunks per stage (interleaved 1F1B)" if v > 1 else ""
    hidden = [
        what
        for what, on in (
            ("gradient sync", lv.overlap_grad_reduce),
            ("pipeline sends", lv.overlap_p2p),
            ("ZeRO-3 gathers", lv.prefetch and lv.zero == 3),
            ("sequence-parallel collectives", lv.tp_comm_overlap),
        )
        if on
    ]
    return (
        f"{menu.engine} layout: tensor x{layout.tensor}{sp_text}, "
        f"pipeline x{plan.pipeline_stages}{v_text}, "
        f"{plan.micro_batches} micro-batches, {lv.recompute.value} recomputation, ZeRO-{lv.zero} "
        f"on every stage; overlapped: {', '.join(hidden) or 'nothing'}; {steps_note(plan)}"
    )


def _candidates(
    probe: Graph, split: LayerSplit, batch: int, mesh: Mesh, opts: CostOptions, menu: Menu
) -> list[tuple[float, int, int, int, int, bool, int, int, tuple[int, ...]]]:
    """(lower bound of the step, S, t, m, v, sequence parallel, expert ways, context ways, layers
    per chunk when uneven) of every layout, by bound (then S, t, m, v, SP off first, e, c, even
    first): m + (S - 1)/v
    slots of the heaviest device's compute with every op split ideally over m x the stage's
    devices (the training search's bound, search/step/layouts.py), chunks as `layout_plan` cuts
    them. Even layers per chunk where S x v divides them; where the engine can say uneven stages,
    also Megatron-LM's first / last cut for each v (`uneven.first_last_layers`: each stage's
    layers in v equal chunks), so a model whose layers S does not divide still runs S stages,
    interleaved too. v > 1 where the engine can say interleaving and m is a multiple of S
    (Megatron-LM's rule); SP on and off
    where the engine can say it (always on where its tensor parallelism needs it); expert
    parallelism e > 1 where it can say it and the model has expert layers, e a product of the
    data-parallel rounds next to tensor parallelism dividing every expert count
    (`profiles.data_degrees`, as the step search tries it); context parallelism where it can
    say it and the batch cannot put a sample on each data-parallel rank: the fewest c (such a
    product too) that can, with one sample per rank (as the step search tries it; with samples
    enough data parallelism moves less), without expert parallelism."""
    segs = segments(probe)
    flops = segment_flops(probe, segs) if menu.stage_layers != "even" else []  # once per search
    experts = expert_counts(probe) if menu.expert else frozenset()
    sizes = [(op.flops, whole_op_bytes(probe, op, opts)) for op in probe.ops]
    out = []
    outer = mesh.shape[0]
    for n in (s for s in range(1, min(outer, split.layers) + 1) if outer % s == 0):
        smesh = stage_mesh(mesh, n)
        chunkings = [
            (v, (), [*(segs[k].start for k in chunk_starts(split, n * v)), len(probe.ops)])
            for v in range(1, split.layers // n + 1)
            if split.layers % (n * v) == 0 and (v == 1 or (menu.virtual and n > 1))
        ]
        for v in range(1, split.layers // n + 1) if menu.stage_layers != "even" else ():
            if v > 1 and not menu.virtual:
                break
            uneven = _uneven_layers(split, n, v, flops)
            if uneven:  # first and last stages apart, each stage's layers in v equal chunks
                starts = chunk_starts(split, n * v, uneven)
                chunkings.append((v, uneven, [*(segs[k].start for k in starts), len(probe.ops)]))
        for t in menu.tensor_degrees(smesh):
            es = [1] + [
                d for d in data_degrees(smesh, t) if experts and all(x % d == 0 for x in experts)
            ]
            sps = [menu.sequence_parallel_at(t)]
            if menu.sequence_parallel and t > 1 and not sps[0]:
                sps.append(True)
            # context ways c: the fewest letting one sample per rank fill the data ways
            cs = [1, *_context_fill(batch, smesh.size // t, smesh, t, menu)]
            for c, mbs in [(1, mbs) for mbs in MICRO_BATCH_SIZES] + [(c, 1) for c in cs[1:]]:
                data = smesh.size // (t * c)
                if batch % (data * mbs):
                    continue
                m = batch // (data * mbs)
                k = m * smesh.size
                ops = [ideal_compute(f, b, k, opts, smesh) for f, b in sizes]
                upto = [0.0, *itertools.accumulate(ops)]  # each chunk's sum in O(1)
                for v, layers, bounds in chunkings:
                    if v > 1 and m % n:
                        continue
                    chunk = [upto[e] - upto[a] for a, e in zip(bounds, bounds[1:], strict=False)]
                    slot = max(sum(chunk[d::n]) for d in range(n))
                    bound = (m + (n - 1) / v) * slot
                    out += [
                        (bound, n, t, m, v, sp, e, c, layers)
                        for sp in sps
                        for e in (es if c == 1 else [1])
                    ]
    return sorted(out)


def _context_fill(batch: int, data: int, smesh: Mesh, tensor: int, menu: Menu) -> list[int]:
    """[c]: the fewest context ways (`profiles.data_degrees`) letting one sample per rank fill
    the `data` ways a stage leaves at tensor degree `tensor` when the batch cannot; [] when it
    can, when no degree helps, or the engine cannot say context parallelism."""
    if not menu.context or batch % data == 0:
        return []
    return [c for c in data_degrees(smesh, tensor) if batch % (data // c) == 0][:1]


def _uneven_layers(
    split: LayerSplit, stages: int, virtual: int, segment_cost: list[float]
) -> tuple[int, ...]:
    """Layers per model chunk of `first_last_layers` on `stages` stages with `virtual` chunks
    each (Megatron-LM's first / last counts, torchtitan's module lists); () where no such cut
    beats the even one."""
    counts = first_last_layers(split, stages, segment_cost, virtual)
    return chunk_layers(counts, virtual) if counts else ()


__all__ = [
    "MENUS",
    "MICRO_BATCH_SIZES",
    "Layout",
    "LayerSplit",
    "Menu",
    "get_menu",
    "gradient_width",
    "graph_layers",
    "layer_split",
    "layout_plan",
    "layout_step",
    "plan_for_menu",
    "tensor_degrees",
]
