"""Training plans: SPMD stage plans + micro-batches, recomputation, ZeRO and 1F1B pipeline stages.

A `TrainingPlan` is a frozen value: the model's ops cut into S contiguous stages over the
outermost mesh axis (S divides it), each stage an ordinary `Plan` of its sub-graph at the
micro-batch size (global batch / m) on the stage's devices, with its `Levers`. `evaluate_training`
(the one scorer of such plans) builds the step model's inputs from the stage plans — p2p bytes of
each boundary activation, parameters shared by several stages — and returns the `StepCost`
(cost/step.py). JSON: `shardplan.exporters.training_json`. O(stages * evaluator).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from shardplan import units
from shardplan.checks import MAX_SIZE
from shardplan.cost.pipeline import Pipeline, boundary_bytes, cut_terms, shared_sync_s
from shardplan.cost.presets import CostOptions
from shardplan.cost.step import (
    Levers,
    StageProfile,
    StepCost,
    profile_stage,
    step_cost,
)
from shardplan.errors import PlanError
from shardplan.hardware import peak_flops
from shardplan.ir.graph import Graph
from shardplan.ir.op import Role
from shardplan.mesh import Mesh
from shardplan.plans import Plan
from shardplan.problem import Problem


@dataclass(frozen=True, slots=True)
class Stage:
    """One pipeline stage: its SPMD plan (sub-graph at the micro-batch size, stage mesh)."""

    plan: Plan
    levers: Levers = Levers()


@dataclass(frozen=True, slots=True)
class TrainingPlan:
    """A whole training step's plan on `mesh` (see the module docstring).

    Attributes:
        model: the model's name; batch: the global batch (samples per step).
        micro_batches: m; each stage runs m micro-batches of batch / m samples.
        stages: the S stages in order; S = 1 is a plain SPMD plan with levers.
        axes: the per-axis summary, e.g. ("node axis: pipeline x8", "gpu axis: tensor x8").
    """

    model: str
    mesh: Mesh
    batch: int
    micro_batches: int
    stages: tuple[Stage, ...]
    method: str
    tokens_per_sample: int = 1
    axes: tuple[str, ...] = ()
    search_seconds: float = 0.0
    notes: tuple[str, ...] = ()
    step: StepCost | None = field(default=None, compare=False)
    virtual_stages: int = 1
    """v, model chunks per device (interleaved 1F1B): `stages` are then the S x v chunks in
    model order, device group d running chunks d, d + S, ..."""
    problem: Problem | None = field(default=None, compare=False, repr=False)
    """The Problem the plan was solved for (budget, machine, dtype, batch, ...)."""
    step_floor_s: float | None = field(default=None, compare=False)
    """A proven lower bound on the step of any plan of the layouts the step search considered
    (`search/step/search.py`: FLOPs and bytes at the roofline over the pipeline's slots); the
    plan's step over it is the gap to a certificate. None for plans not found by that search."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))
        _check_fields(self)
        v = self.virtual_stages
        if isinstance(v, bool) or not isinstance(v, int) or v < 1 or len(self.stages) % v:
            raise PlanError(
                f"virtual_stages {v!r} must be a positive integer dividing the "
                f"{len(self.stages)} model chunks"
            )
        n = len(self.stages) // v
        if n < 1 or self.mesh.shape[0] % n:
            raise PlanError(
                f"{n} pipeline stages must divide the outermost mesh axis {self.mesh.shape[0]}"
            )
        if self.batch % self.micro_batches:
            raise PlanError(
                f"batch {self.batch} is not divisible into {self.micro_batches} micro-batches"
            )
        _check_stages(self.stages, self.mesh, n)
        if self.step is None:
            object.__setattr__(self, "step", evaluate_training(self))

    @property
    def pipeline_stages(self) -> int:
        """S, the device groups of the pipeline (`stages` holds S x virtual_stages chunks)."""
        return len(self.stages) // self.virtual_stages

    @property
    def sequence_parallel(self) -> bool:
        """Does every stage run Megatron-LM sequence parallelism?"""
        return all(s.levers.sequence_parallel for s in self.stages)

    @property
    def context_parallel(self) -> bool:
        """Does every stage split the sequence with context parallelism's ring exchange?"""
        return all(s.levers.context_parallel for s in self.stages)

    @property
    def distributed_optimizer(self) -> bool:
        """Megatron-LM's distributed optimizer: ZeRO-1 over the data-parallel group everywhere."""
        return all(s.levers.zero == 1 for s in self.stages)

    def __repr__(self) -> str:
        """One line (the stage plans are fields, not something to print whole)."""
        step = "" if self.step is None else f", step {units.seconds(self.step.step_s)}"
        return (
            f"TrainingPlan({self.model!r} on mesh {self.mesh.text()}, {self.pipeline_stages} "
            f"stage(s), {self.micro_batches} micro-batch(es) of "
            f"{self.batch // self.micro_batches}{step})"
        )

    def summary(self) -> str:
        """A few lines a person reads: the axes, each stage's ops, levers and memory, the step
        time, throughput and notes. O(stages)."""
        step = self.step
        assert step is not None
        lines = [
            f"{self.model} on mesh {self.mesh.text()}: {self.pipeline_stages} stage(s), "
            f"{self.micro_batches} micro-batch(es) of {self.batch // self.micro_batches}"
        ]
        lines += [f"  {a}" for a in self.axes]
        for s, (stage, cost) in enumerate(zip(self.stages, step.stages, strict=True)):
            g = stage.plan.graph
            lines.append(
                f"  stage {s}: {len(g.ops)} ops ({g.ops[0].name} .. {g.ops[-1].name}), "
                f"recompute {stage.levers.recompute.value}, ZeRO {stage.levers.zero}, "
                f"{units.nbytes(cost.memory_bytes)}/device"
            )
        lines.append(
            f"  step {units.seconds(step.step_s)} (bubble {units.seconds(step.bubble_s)}), "
            f"{units.rate(step.tokens_per_s, 'tokens')}, "
            f"{units.nbytes(step.memory_per_device)}/device at most"
        )
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])


def _whole(value: object, field_name: str, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_SIZE:
        raise PlanError(
            f"training plan field {field_name} must be a whole number in [{low}, 2**48], "
            f"got {value!r}"
        )
    return value


def _check_fields(tp: TrainingPlan) -> None:
    """Types and ranges of the scalar fields (no coercion: 1.5 or "2" micro-batches fail)."""
    for name in ("model", "method"):
        if not isinstance(getattr(tp, name), str):
            raise PlanError(f"training plan field {name} must be text, got {getattr(tp, name)!r}")
    if not isinstance(tp.mesh, Mesh):
        raise PlanError(f"training plan mesh must be a Mesh, got {tp.mesh!r}")
    _whole(tp.batch, "batch")
    _whole(tp.micro_batches, "micro_batches")
    _whole(tp.tokens_per_sample, "tokens_per_sample")
    t = tp.search_seconds
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t >= 0):
        raise PlanError(f"training plan search_seconds must be finite and >= 0, got {t!r}")
    if not all(isinstance(s, Stage) and isinstance(s.plan, Plan) for s in tp.stages):
        raise PlanError("training plan stages must be Stage values, each holding a Plan")


def _check_stages(stages: Sequence[Stage], mesh: Mesh, groups: int) -> None:
    """Stages agree with each other and the mesh: each runs on its share of the outer axis,
    no op is in two stages, no stage reads what a later stage produces, and an incoming
    activation needs a gradient exactly when the stage producing it computes one."""
    want = replace(mesh, shape=(mesh.shape[0] // groups, *mesh.shape[1:]))
    produced: dict[str, int] = {}
    for s, st in enumerate(stages):
        if not st.plan.graph.ops:
            raise PlanError(f"stage {s} holds no op: every pipeline stage needs at least one")
        if st.plan.mesh != want:
            raise PlanError(
                f"stage {s} runs on mesh {st.plan.mesh.text()} ({st.plan.mesh.machine}) but "
                f"{groups} stages of mesh {mesh.text()} ({mesh.machine}) run on "
                f"{want.text()} each with its links; regenerate the training plan"
            )
        for op in st.plan.graph.ops:
            for t in op.outputs:
                if t in produced:
                    raise PlanError(
                        f"tensor {t!r} is produced by stage {produced[t]} and again by stage "
                        f"{s} (op {op.name!r}); regenerate the training plan"
                    )
                produced[t] = s
    for s, st in enumerate(stages):
        g = st.plan.graph
        for name, t in g.tensors.items():
            src = produced.get(name)
            if src is None or src == s or t.role is not Role.INPUT:
                continue
            if src > s:
                raise PlanError(
                    f"stage {s} reads {name!r}, which the later stage {src} produces: the "
                    "stages are out of order; regenerate the training plan"
                )
            if (name in stages[src].plan.graph.requires_grad) != (name in g.requires_grad):
                raise PlanError(
                    f"stage {s}'s incoming activation {name!r} and stage {src}, which produces "
                    "it, disagree on whether it needs a gradient; regenerate the training plan"
                )


def pipeline_of(
    stages: Sequence[Plan], mesh: Mesh, batch: int, tokens_per_sample: int, virtual_stages: int = 1
) -> Pipeline:
    """The step model's non-stage inputs, read off the stage (chunk) plans and priced by
    `cost.pipeline`."""
    graphs = [p.graph for p in stages]
    opts = [p.options for p in stages]
    return pipeline_for(graphs, opts, mesh, batch, tokens_per_sample, virtual_stages)


def pipeline_for(
    graphs: Sequence[Graph],
    opts: Sequence[CostOptions],
    mesh: Mesh,
    batch: int,
    tokens_per_sample: int,
    virtual_stages: int = 1,
) -> Pipeline:
    """`pipeline_of` from the chunk graphs and their options (before any plan exists)."""
    devices = mesh.size
    per_stage = devices // (len(graphs) // virtual_stages)
    bw = mesh.bandwidth_bytes_per_s[0]
    peak = at_precision(mesh, opts[0]).flops_per_s
    return Pipeline(
        boundary_bytes(graphs, opts, per_stage),
        bw,
        shared_sync_s(graphs, opts, per_stage, bw),
        devices,
        batch,
        tokens_per_sample,
        peak,
        opts[0].preset.training_flops_factor,
        virtual_stages,
    )


def pipeline_cut(
    graph: Graph,
    bounds: Sequence[int],
    opts: CostOptions,
    mesh: Mesh,
    batch: int,
    tokens_per_sample: int,
    virtual_stages: int = 1,
) -> Pipeline:
    """`pipeline_for` of the chunks ops[bounds[c]:bounds[c + 1]] of one graph, without building
    them (`cost.pipeline.cut_terms`)."""
    per_stage = mesh.size // ((len(bounds) - 1) // virtual_stages)
    bw = mesh.bandwidth_bytes_per_s[0]
    p2p, shared = cut_terms(graph, bounds, opts, per_stage, bw)
    return Pipeline(
        p2p,
        bw,
        shared,
        mesh.size,
        batch,
        tokens_per_sample,
        at_precision(mesh, opts).flops_per_s,
        opts.preset.training_flops_factor,
        virtual_stages,
    )


def at_precision(mesh: Mesh, opts: CostOptions) -> Mesh:
    """`mesh` at its machine's FLOP rate for the compute dtype of `opts`' precision (as it is
    without one)."""
    if opts.precision is None:
        return mesh
    return replace(mesh, flops_per_s=peak_flops(mesh.hardware, opts.precision.name))


def assemble(
    model: str,
    mesh: Mesh,
    batch: int,
    stages: Sequence[tuple[Plan, StageProfile, Levers]],
    micro_batches: int,
    method: str,
    tokens_per_sample: int,
    virtual_stages: int = 1,
) -> TrainingPlan:
    """A TrainingPlan of already profiled stage plans, its step priced from those profiles
    (the search and the recipes build their plans through here)."""
    plans = [p for p, _, _ in stages]
    levers = [lv for _, _, lv in stages]
    step = step_cost(
        [prof for _, prof, _ in stages],
        levers,
        micro_batches,
        pipeline_of(plans, mesh, batch, tokens_per_sample, virtual_stages),
    )
    return TrainingPlan(
        model,
        mesh,
        batch,
        micro_batches,
        tuple(Stage(p, lv) for p, lv in zip(plans, levers, strict=True)),
        method,
        tokens_per_sample,
        step=step,
        virtual_stages=virtual_stages,
    )


def evaluate_training(tp: TrainingPlan) -> StepCost:
    """The step cost of `tp` (cost/step.py), from its stage plans and levers."""
    profiles = [
        profile_stage(
            s.plan.graph,
            s.plan.mesh,
            s.plan.strategies,
            s.plan.options,
            s.plan.param_layouts,
            s.levers.sequence_parallel,
            s.levers.context_parallel,
        )
        for s in tp.stages
    ]
    plans = [s.plan for s in tp.stages]
    return step_cost(
        profiles,
        [s.levers for s in tp.stages],
        tp.micro_batches,
        pipeline_of(plans, tp.mesh, tp.batch, tp.tokens_per_sample, tp.virtual_stages),
    )
