"""Hand-made training recipes as ordinary TrainingPlans, scored by the same step model.

megatron_recipe — Megatron-LM as Narayanan et al. (SC'21) and Korthikanti et al. (MLSys'23) run
it: tensor parallelism on the innermost mesh ways (within a node), pipeline parallelism over the
outermost axis (nodes), data parallelism on the remaining ways; the model cut into pipeline x v
FLOP-balanced chunks over whole layers (the same DP over segments the search uses), device group
d holding chunks d, d + S, ... (interleaved 1F1B when v > 1); m = batch / (data-parallel ways x
micro-batch size) micro-batches. Knobs as published: recomputation (full, the SC'21 setting;
selective; none), sequence parallelism (`cost.sequence`), v model chunks per device, the
distributed optimizer (ZeRO-1 over the data-parallel group, `cost.zero`). Context and expert
parallelism are not in the step model yet: context or expert > 1 is a PlanError saying so, never
silently dropped. One expert pass per chunk: O(S v (|V| + |E|) rounds).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from shardplan.cost import CostOptions
from shardplan.cost.step import Levers, Recompute, profile_stage
from shardplan.errors import PlanError
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.plans import Plan
from shardplan.search.experts import megatron
from shardplan.search.step.notes import axis_summary
from shardplan.search.step.stages import (
    stage_graphs,
    stage_mesh,
    stage_starts,
    tokens_per_sample,
)
from shardplan.training import TrainingPlan, assemble, at_precision

KNOBS = (
    "micro_batch_size",
    "recompute",
    "sequence_parallel",
    "virtual_stages",
    "context",
    "distributed_optimizer",
    "expert",
)
"""The recipe's keyword knobs after (build, batch, mesh, opts, tensor, pipeline)."""


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"megatron-recipe: {name} must be a positive integer, got {value!r}")
    return value


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise PlanError(f"megatron-recipe: {name} must be True or False, got {value!r}")
    return value


def _recompute(value: object) -> Recompute:
    if isinstance(value, Recompute):
        return value
    try:
        return Recompute(value)
    except ValueError:
        raise PlanError(
            f"megatron-recipe: recompute must be one of {[r.value for r in Recompute]}, "
            f"got {value!r}"
        ) from None


def _check_knobs(
    mesh: Mesh, batch: int, tensor: int, pipeline: int, mbs: int, v: int, context: int, expert: int
) -> tuple[int, int]:
    """(data-parallel ways, micro-batches) of the knobs on `mesh`, or a PlanError naming the
    knob that does not fit."""
    for name, value in (("tensor", tensor), ("pipeline", pipeline), ("batch", batch)):
        _positive(name, value)
    _positive("micro_batch_size", mbs)
    _positive("virtual_stages", v)
    if _positive("context", context) != 1:
        raise PlanError(
            f"megatron-recipe: context={context}: context parallelism is not in the step model "
            "yet; use context=1"
        )
    if _positive("expert", expert) != 1:
        raise PlanError(
            f"megatron-recipe: expert={expert}: expert parallelism is not in the training step "
            "model yet; use expert=1 (the SPMD planners place MoE experts, docs/moe.md)"
        )
    if mesh.shape[0] % pipeline:
        raise PlanError(
            f"pipeline degree {pipeline} does not divide the outermost mesh axis {mesh.shape[0]}"
        )
    if mesh.size % (tensor * pipeline):
        raise PlanError(
            f"tensor {tensor} x pipeline {pipeline} does not divide {mesh.size} devices"
        )
    if v > 1 and pipeline == 1:
        raise PlanError(
            f"megatron-recipe: virtual_stages={v} interleaves model chunks over pipeline stages; "
            "it needs pipeline > 1"
        )
    data = mesh.size // (tensor * pipeline)
    per_step = data * mbs
    if batch % per_step:
        raise PlanError(
            f"batch {batch} is not a multiple of data-parallel ways {data} x micro-batch size {mbs}"
        )
    m = batch // per_step
    if v > 1 and m % pipeline:
        raise PlanError(
            f"megatron-recipe: the interleaved schedule needs the {m} micro-batches to be a "
            f"multiple of pipeline {pipeline} (as Megatron-LM requires)"
        )
    return data, m


def megatron_recipe(
    build: Callable[[int], Graph | None],
    batch: int,
    mesh: Mesh,
    opts: CostOptions,
    tensor: int,
    pipeline: int,
    micro_batch_size: int = 1,
    recompute: Recompute | str = Recompute.FULL,
    *,
    sequence_parallel: bool = False,
    virtual_stages: int = 1,
    context: int = 1,
    distributed_optimizer: bool = False,
    expert: int = 1,
) -> TrainingPlan:
    """The Megatron-LM plan with `tensor` x `pipeline` model parallelism on `mesh` and the
    published knobs (module docstring); PlanError for a knob that is unknown or does not fit."""
    mesh = at_precision(mesh, opts)
    rec = _recompute(recompute)
    sp_on = _flag("sequence_parallel", sequence_parallel)
    zero = 1 if _flag("distributed_optimizer", distributed_optimizer) else 0
    v = virtual_stages
    data, m = _check_knobs(mesh, batch, tensor, pipeline, micro_batch_size, v, context, expert)
    if sp_on and tensor == 1:
        raise PlanError(
            "megatron-recipe: sequence_parallel splits the tensor-parallel group's replicated "
            "regions; it needs tensor > 1"
        )
    probe = build(batch)
    graph = build(data * micro_batch_size)
    if probe is None or graph is None:
        raise PlanError("the Megatron recipe needs the model at the micro-batch size (zoo models)")
    smesh = stage_mesh(mesh, pipeline)
    stages = []
    for sub in stage_graphs(graph, stage_starts(probe, pipeline * v)):
        strategies = megatron(sub, smesh, tensor)
        prof = profile_stage(sub, smesh, strategies, opts, sequence_parallel=sp_on)
        plan = Plan(sub, smesh, strategies, "megatron", opts, cost=prof.breakdown)
        stages.append((plan, prof, Levers(rec, zero, sp_on)))
    tp = assemble(
        probe.name, mesh, batch, stages, m, "megatron-recipe", tokens_per_sample(probe, batch), v
    )
    schedule = f" (interleaved 1F1B, {v} chunks per device)" if v > 1 else ""
    return replace(
        tp,
        axes=axis_summary(tp),
        notes=(
            f"Megatron-LM recipe: tensor x{tensor}, pipeline x{pipeline}{schedule}, data "
            f"x{data}, micro-batch size {micro_batch_size} ({m} micro-batches), {rec.value} "
            "recomputation, "
            + ("sequence parallel, " if sp_on else "")
            + ("distributed optimizer (ZeRO-1)" if zero else "no ZeRO"),
        ),
        step=tp.step,
    )
