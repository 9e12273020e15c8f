"""Engine menus: the training plans torchtitan, Megatron-LM and DeepSpeed can express, searched.

A `Menu` is data: the recomputation modes and ZeRO stages an engine's configuration can say
(with and without pipeline stages), the precisions, whether its tensor parallelism always runs
the sequence-parallel lever (torchtitan: t > 1 layouts are searched and priced with it on), and
which of sequence / context / expert parallelism and interleaving its configuration can say
(what `exporters.engine_layout` accepts; the search below keeps to tensor x pipeline x data).
Every engine configures one layout for
the whole run: a tensor-parallel degree t (the innermost rounds of the mesh, Megatron-style cuts,
`experts.megatron`), a pipeline degree S over the outermost axis with an equal number of
transformer layers per stage (the embedding on the first stage, the head on the last), data
parallelism on the remaining ways, m micro-batches, and one recomputation mode and ZeRO stage on
every stage. `plan_for_menu` searches exactly that space with the step model (cost/step.py):
for each S dividing the outer axis and the layer count, each allowed t and each per-rank
micro-batch size in MICRO_BATCH_SIZES that divides the batch, the stages are planned by the
expert (stages of one structure once), and the allowed lever with the shortest step that fits
the budget is kept; layouts run in order of the training search's lower bound
(search/step/search.py) and the search stops when the bound reaches the best step found.
`layout_plan` builds one such plan (also used to score a user's config).
Layers are the longest periodic run of segment fingerprints (`layer_split`), so no op name is
read. Each engine's levers carry what it overlaps by default (`Menu.engine_levers`,
`cost.overlap`): torchtitan its DDP / FSDP2 gradient sync and FSDP2 prefetch, DeepSpeed ZeRO-3's
`overlap_comm` and prefetch, Megatron-LM nothing beyond tensor parallelism (its p2p overlap needs
the interleaved schedule). Cost: O(S-options x t-options x sizes x distinct stages x evaluator).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from shardplan import units
from shardplan.cost import CostOptions
from shardplan.cost.overlap import (
    DDP_BUCKET_BYTES,
    DEEPSPEED_REDUCE_BUCKET,
    MEGATRON_BUCKET_FLOOR,
    MEGATRON_BUCKET_PER_RANK,
)
from shardplan.cost.step import Levers, Recompute, StageProfile, profile_stage, step_cost
from shardplan.cost.work import ideal_compute, whole_op_bytes
from shardplan.errors import ArgumentError, InfeasibleError, PlanError, SolverError
from shardplan.ir.graph import Graph
from shardplan.ir.segments import segments, subgraph
from shardplan.mesh import Mesh
from shardplan.plans import Plan
from shardplan.search import experts
from shardplan.search.step.notes import axis_summary, steps_note
from shardplan.search.step.profiles import LEVERS, stage_tensor_degrees
from shardplan.search.step.recipes import context_rounds, expert_parallel
from shardplan.search.step.stages import aligned_starts, stage_mesh, tokens_per_sample
from shardplan.search.step.structure import LayerSplit, graph_layers, layer_split
from shardplan.search.step.structure import fingerprint as _fingerprint
from shardplan.training import Stage, TrainingPlan, at_precision, pipeline_of

Progress = Callable[[str], None]

MICRO_BATCH_SIZES = (1, 2, 4, 8)
"""Per-rank micro-batch sizes tried (powers of two, as the engines' example configs use)."""


@dataclass(frozen=True, slots=True)
class Menu:
    """What one engine's configuration can express (see the module docstring)."""

    engine: str
    recompute: tuple[Recompute, ...]
    zero: tuple[int, ...]
    zero_with_pipeline: tuple[int, ...]
    precisions: tuple[str, ...]
    stage_layers: str = "even"
    """How layers may split over pipeline stages: "even", "first-last" (first and last stage
    apart from an even middle), "any" (a module list per stage)."""
    tensor_needs_sequence_parallel: bool = False
    """The engine's tensor parallelism always shards the norms over the sequence (torchtitan):
    tensor degree t > 1 only with the sequence-parallel lever on."""
    sequence_parallel: bool = False
    """The configuration can say Megatron-style sequence parallelism."""
    context: bool = False
    """... context parallelism (the sequence split next to tensor parallelism)."""
    expert: bool = False
    """... expert parallelism inside the data-parallel group."""
    virtual: bool = False
    """... several model chunks per pipeline stage (interleaved 1F1B)."""
    instead: str = ""
    """Where a construct this menu lacks can be said instead (in refusals)."""
    overlap_grad_reduce: tuple[int, ...] = ()
    """ZeRO stages at which the engine overlaps the gradient sync with the backward by default
    (`cost.overlap`)."""
    bucket_bytes: int = 0
    """... its gradient bucket at ZeRO 0-2, in bytes (PyTorch DDP), or in elements:"""
    bucket_elements: int = 0
    bucket_per_rank: int = 0
    """... max(bucket_elements, bucket_per_rank x data ways) (megatron-core); all 0: one bucket
    (ZeRO-3 reduces unit by unit whatever these are)."""
    prefetch: tuple[int, ...] = ()
    """ZeRO stages at which it prefetches the next unit's parameters (ZeRO-3)."""
    overlap_p2p: bool = False
    """Its interleaved schedule sends under compute by default (plain 1F1B: never)."""
    tp_comm_overlap: bool = False
    """The configuration can say `Levers.tp_comm_overlap` (sequence parallelism's collectives
    under their GEMMs: Megatron-LM `--tp-comm-overlap`, torchtitan `enable_async_tensor_parallel`
    with torch.compile); off by default in every engine, and never on in this engine's levers
    when it cannot say it."""

    def engine_levers(
        self,
        levers: Levers,
        width: int,
        virtual: int = 1,
        data: int = 1,
        grad_reduce: bool | None = None,
    ) -> Levers:
        """`levers` with what this engine overlaps by default at their ZeRO stage (`grad_reduce`:
        a configuration's own choice for the gradient sync); `width`: the gradient's bytes per
        element, `virtual`: chunks per device, `data`: data-parallel ways (the bucket's size).
        `levers.tp_comm_overlap` is kept only where the engine can say it (`tp_comm_overlap`)
        and the levers run sequence parallelism."""
        grad = levers.zero in self.overlap_grad_reduce if grad_reduce is None else grad_reduce
        bucket = max(self.bucket_bytes // width, self.bucket_elements, self.bucket_per_rank * data)
        bucket = bucket if grad and levers.zero < 3 else 0
        return replace(
            levers,
            overlap_grad_reduce=grad,
            prefetch=levers.zero in self.prefetch,
            overlap_p2p=self.overlap_p2p and virtual > 1,
            bucket_elements=bucket,
            tp_comm_overlap=(
                levers.tp_comm_overlap and self.tp_comm_overlap and levers.sequence_parallel
            ),
        )

    def levers(self, stages: int) -> tuple[Levers, ...]:
        """The allowed levers for a plan of `stages` pipeline stages, least intrusive first."""
        zs = self.zero if stages == 1 else self.zero_with_pipeline
        return tuple(lv for lv in LEVERS if lv.recompute in self.recompute and lv.zero in zs)

    def tensor_degrees(self, mesh: Mesh) -> tuple[int, ...]:
        """The tensor degrees this engine can run on `mesh` (`tensor_degrees`)."""
        return tensor_degrees(mesh)

    def sequence_parallel_at(self, tensor: int) -> bool:
        """Whether the layout of tensor degree `tensor` runs the sequence-parallel lever."""
        return self.tensor_needs_sequence_parallel and tensor > 1


def tensor_degrees(mesh: Mesh) -> tuple[int, ...]:
    """Tensor-parallel degrees on `mesh`: products of its innermost rounds (1 first); a
    one-axis mesh has only 1 (its axis is also the pipeline's)."""
    return (1, *stage_tensor_degrees(mesh)) if len(mesh.shape) > 1 else (1,)


_N, _S, _F = Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL

MENUS: Mapping[str, Menu] = {
    # torchtitan 0.2 (docs/engines.md): activation_checkpoint.mode none/full (its "selective"
    # keeps matmul outputs, not the step model's selective set); DDP (ZeRO-0) or FSDP (ZeRO-3);
    # its tensor parallelism always shards norms over the sequence (SequenceParallel)
    # (`parallelism.tensor_parallel_degree`); context_parallel_degree, expert_parallel_degree
    # and the Interleaved1F1B schedule over a module list per chunk
    # (torchtitan/config/job_config.py)
    "torchtitan": Menu(
        "torchtitan",
        (_N, _F),
        (0, 3),
        (0, 3),
        ("bf16", "fp32"),
        "any",
        True,
        True,
        True,
        True,
        True,
        # DDP (`replicate`) all-reduces 25 MiB buckets from autograd hooks, FSDP2 reduce-
        # scatters and prefetches unit by unit (each TransformerBlock is `fully_shard`ed);
        # torch.distributed.pipelining's 1F1B waits each send with the next receive
        # (schedules.py, Schedule1F1B._step_microbatches): no p2p overlap
        overlap_grad_reduce=(0, 3),
        bucket_bytes=DDP_BUCKET_BYTES,
        prefetch=(3,),
        # `parallelism.enable_async_tensor_parallel` with `[compile] enable` and "model" in
        # `compile.components` (torchtitan/distributed/tensor_parallel.py, maybe_enable_async_tp)
        tp_comm_overlap=True,
    ),
    # Megatron-LM: --recompute-granularity selective/full, --use-distributed-optimizer (ZeRO-1)
    # --sequence-parallel, --context-parallel-size, --expert-model-parallel-size,
    # --num-virtual-stages-per-pipeline-rank
    "megatron": Menu(
        "megatron",
        (_N, _S, _F),
        (0, 1),
        (0, 1),
        ("bf16", "fp16", "fp32"),
        "first-last",
        False,
        True,
        True,
        True,
        True,
        # --overlap-grad-reduce is off by default (buckets max(4e7, 1e6 x dp) when on); p2p
        # overlap is on for the interleaved schedule, which this menu's layouts do not use
        bucket_elements=MEGATRON_BUCKET_FLOOR,
        bucket_per_rank=MEGATRON_BUCKET_PER_RANK,
        overlap_p2p=True,
        # --tp-comm-overlap (megatron-core TransformerConfig.tp_comm_overlap; Megatron-LM asserts
        # --sequence-parallel with it and needs Transformer Engine's userbuffers)
        tp_comm_overlap=True,
    ),
    # DeepSpeed: zero_optimization.stage 0-3, but its PipelineEngine refuses ZeRO-2/3 with
    # pipeline parallelism (deepspeed/runtime/pipe/engine.py); Megatron-DeepSpeed's
    # --checkpoint-activations is full recomputation
    # its config JSON has no sequence, context or expert parallelism and its PipelineEngine no
    # interleaving: such plans go to Megatron-LM / Megatron-DeepSpeed's own flags
    "deepspeed": Menu(
        "deepspeed",
        (_N, _F),
        (0, 1, 2, 3),
        (0, 1),
        ("bf16", "fp16", "fp32"),
        instead="the DeepSpeed config JSON has no such key; export with `--to megatron`, or run "
        "Megatron-DeepSpeed with Megatron-LM's flags for it",
        # zero_optimization.overlap_comm defaults to true at stage 3 only, with the stage-3
        # prefetch (deepspeed/runtime/zero/config.py); the pipeline engine's sends block
        overlap_grad_reduce=(3,),
        bucket_elements=DEEPSPEED_REDUCE_BUCKET,
        prefetch=(3,),
        # no tensor-parallel communication overlap in its config (tp_comm_overlap stays off)
        tp_comm_overlap=False,
    ),
}


def get_menu(engine: str) -> Menu:
    if engine not in MENUS:
        raise ArgumentError(f"unknown engine {engine!r}; pick one of {', '.join(sorted(MENUS))}")
    return MENUS[engine]


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


class _Stages:
    """Expert stage plans and their profiles, cached by (structure, stage mesh, t)."""

    def __init__(self, opts: CostOptions) -> None:
        self.opts = opts
        self.cache: dict[tuple[object, ...], tuple[str, tuple[object, ...], StageProfile]] = {}

    def plan(
        self,
        sub: Graph,
        mesh: Mesh,
        tensor: int,
        sp: bool = False,
        context: int = 1,
        expert: int = 1,
    ) -> tuple[Plan, StageProfile]:
        key = (mesh.shape, tensor, sp, context, expert, _fingerprint(sub))
        hit = self.cache.get(key)
        if hit is None:
            method = "data-parallel" if tensor == 1 else "megatron"
            if tensor == 1 and context == expert == 1:
                st = experts.data_parallel(sub, mesh)
            else:  # as the Megatron recipe places expert and context ways (recipes.py)
                st = expert_parallel(sub, mesh, experts.megatron(sub, mesh, tensor), expert)
                if context > 1:
                    rounds = context_rounds(mesh, st, sub, context)
                    st = experts.context_parallel(sub, mesh, st, rounds)
            prof = profile_stage(
                sub, mesh, st, self.opts, sequence_parallel=sp, context_parallel=context > 1
            )
            hit = self.cache[key] = (method, tuple(st[op.name] for op in sub.ops), prof)
        method, cuts, prof = hit
        mapped = {op.name: s for op, s in zip(sub.ops, cuts, strict=True)}  # type: ignore[misc]
        return Plan(sub, mesh, mapped, method, self.opts, cost=prof.breakdown), prof


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
    mesh = at_precision(mesh, opts)
    t, n, m, v = layout.tensor, layout.pipeline, layout.micro_batches, layout.virtual
    c, e = layout.context, layout.expert
    data = _layout_data(mesh, batch, layout)
    split = split or graph_layers(graph)
    if split.layers % (n * v):
        chunks = f"{n} pipeline stages" + (f" x {v} chunks" if v > 1 else "")
        raise PlanError(f"{split.layers} layers do not split evenly over {chunks}")
    segs = segments(graph)
    bounds = [*(segs[k].start for k in aligned_starts(split, n * v) or [0]), len(graph.ops)]
    smesh = stage_mesh(mesh, n)
    stages = cache or _Stages(opts)
    sp = layout.levers.sequence_parallel or (menu is not None and menu.sequence_parallel_at(t))
    plans, profiles = [], []
    for s in range(n * v):
        sub = subgraph(graph, bounds[s], bounds[s + 1], f"{graph.name}.stage{s}")
        plan, prof = stages.plan(sub, smesh, t, sp, c, e)
        plans.append(plan)
        profiles.append(prof)
    tokens = tokens_per_sample(graph, batch // m) if batch // m else 1
    pipe = pipeline_of(plans, mesh, batch, tokens, v)
    cp = replace(layout.levers, sequence_parallel=sp, context_parallel=c > 1)
    if menu is None:
        choices: tuple[Levers, ...] = (cp,)
    else:  # the engine's levers, with the sequence parallelism its tensor layout runs
        params = graph.parameters  # the gradient's element width sizes the buckets
        width = opts.element_bytes(params[0]) if params else 4
        choices = tuple(
            menu.engine_levers(
                replace(lv, sequence_parallel=sp, context_parallel=c > 1), width, v, data
            )
            for lv in menu.levers(n)
        )
    best = None
    for lv in choices:
        step = step_cost(profiles, [lv] * len(profiles), m, pipe)
        if budget is not None and step.memory_per_device > budget:
            continue
        if best is None or step.step_s < best[0].step_s * (1 - 1e-9):
            best = (step, lv)
    if best is None:
        return None
    step, lv = best
    name = graph.name
    tp = TrainingPlan(
        name,
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
    if v > 1 and (n == 1 or m % n):
        raise PlanError(
            f"{v} chunks per pipeline stage (interleaved 1F1B) need pipeline > 1 and micro-"
            f"batches ({m}) a multiple of the {n} stages"
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
    best: tuple[TrainingPlan, int] | None = None
    cache = _Stages(opts)
    built: dict[int, Graph | None] = {batch: probe}
    tried = 0
    # in order of the bound; stop at the first that cannot beat the best found
    for bound, n, t, m in candidates:
        if best is not None and best[0].step is not None and bound >= best[0].step.step_s:
            say(f"  the remaining {menu.engine} layouts cannot beat {best[0].step.step_s:.4g} s")
            break
        b = batch // m
        if b not in built:
            built[b] = build(b)
        graph = built[b]
        if graph is None:
            continue
        tried += 1
        tp = layout_plan(graph, batch, mesh, opts, Layout(t, n, m), menu, budget, cache, split)
        data = mesh.size // (n * t)
        label = f"pipeline {n} x tensor {t} x data {data}, micro-batch {b // data} (m={m})"
        if tp is None or tp.step is None:
            say(f"  {menu.engine}: {label}: does not fit")
            continue
        say(f"  {menu.engine}: {label}: step {tp.step.step_s:.4g} s")
        if best is None or _faster(tp, best[0]):
            best = (tp, t)
    if best is None and not candidates:
        raise InfeasibleError(
            f"{menu.engine} has no layout of {probe.name!r} on mesh {mesh.text()} at batch "
            f"{batch}: its pipeline stages must divide the outermost axis and the "
            f"{split.layers} layers, and the batch must split over the data-parallel ways in "
            f"micro-batches of {', '.join(map(str, MICRO_BATCH_SIZES))}; try another --batch or "
            "--mesh, or drop --target"
        )
    if best is None:
        room = f"fits {units.nbytes(budget)} per device" if budget is not None else "fits"
        raise InfeasibleError(
            f"no {menu.engine} layout of {probe.name!r} {room} on mesh {mesh.text()} ({tried} "
            f"layouts of tensor x pipeline x data x micro-batch size with {menu.engine}'s "
            "recomputation and ZeRO); use more devices, a larger --memory, or drop --target"
        )
    plan, t = best
    lv = plan.stages[0].levers
    sp_text = " (sequence parallel)" if lv.sequence_parallel else ""
    note = (
        f"{menu.engine} layout: tensor x{t}{sp_text}, pipeline x{plan.pipeline_stages}, "
        f"{plan.micro_batches} micro-batches, {lv.recompute.value} recomputation, ZeRO-{lv.zero} "
        f"on every stage; {steps_note(plan)}"
    )
    return replace(
        plan,
        method=f"target-{menu.engine}",
        search_seconds=time.perf_counter() - start,
        notes=(note,),
        step=plan.step,
    )


def _candidates(
    probe: Graph, split: LayerSplit, batch: int, mesh: Mesh, opts: CostOptions, menu: Menu
) -> list[tuple[float, int, int, int]]:
    """(lower bound of the step, S, t, m) of every layout, by bound: m + S - 1 slots of the
    heaviest stage's compute with every op split ideally over m x the stage's devices (the
    training search's bound, search/scale.py), stages of even layers as `layout_plan` cuts."""
    segs = segments(probe)
    sizes = [(op.flops, whole_op_bytes(probe, op, opts)) for op in probe.ops]
    out = []
    outer = mesh.shape[0]
    for n in (s for s in range(1, outer + 1) if outer % s == 0 and split.layers % s == 0):
        smesh = stage_mesh(mesh, n)
        bounds = [*(segs[k].start for k in aligned_starts(split, n) or [0]), len(probe.ops)]
        for t in menu.tensor_degrees(smesh):
            data = smesh.size // t
            for mbs in MICRO_BATCH_SIZES:
                if batch % (data * mbs):
                    continue
                m = batch // (data * mbs)
                k = m * smesh.size
                slot = max(
                    sum(ideal_compute(f, b, k, opts, smesh) for f, b in sizes[a:e])
                    for a, e in zip(bounds, bounds[1:], strict=False)
                )
                out.append(((m + n - 1) * slot, n, t, m))
    return sorted(out)


def _faster(a: TrainingPlan, b: TrainingPlan) -> bool:
    assert a.step is not None and b.step is not None
    return a.step.step_s < b.step.step_s * (1 - 1e-9)


__all__ = [
    "MENUS",
    "MICRO_BATCH_SIZES",
    "Layout",
    "LayerSplit",
    "Menu",
    "get_menu",
    "graph_layers",
    "layer_split",
    "layout_plan",
    "plan_for_menu",
    "tensor_degrees",
]
