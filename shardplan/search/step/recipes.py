"""Hand-made training recipes as ordinary TrainingPlans, scored by the same step model.

megatron_recipe — Megatron-LM as Narayanan et al. (SC'21) run it: tensor parallelism on the
innermost mesh ways (within a node), pipeline parallelism over the outermost axis (nodes), data
parallelism on the remaining ways; layers split evenly over the stages (the same FLOP-balanced
DP over segments the search uses); 1F1B with m = batch / (data-parallel ways x micro-batch
size) micro-batches; full activation recomputation on every stage (the paper's FLOP count
assumes it); no ZeRO. One expert pass per stage: O(stages * (|V| + |E|) * rounds).
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


def megatron_recipe(
    build: Callable[[int], Graph | None],
    batch: int,
    mesh: Mesh,
    opts: CostOptions,
    tensor: int,
    pipeline: int,
    micro_batch_size: int = 1,
    recompute: Recompute = Recompute.FULL,
) -> TrainingPlan:
    """The Megatron-LM plan with `tensor` x `pipeline` model parallelism on `mesh`."""
    mesh = at_precision(mesh, opts)
    if mesh.shape[0] % pipeline:
        raise PlanError(
            f"pipeline degree {pipeline} does not divide the outermost mesh axis {mesh.shape[0]}"
        )
    data = mesh.size // (tensor * pipeline)
    if data < 1 or mesh.size % (tensor * pipeline):
        raise PlanError(
            f"tensor {tensor} x pipeline {pipeline} does not divide {mesh.size} devices"
        )
    per_step = data * micro_batch_size
    if batch % per_step:
        raise PlanError(
            f"batch {batch} is not a multiple of data-parallel ways {data} x micro-batch size "
            f"{micro_batch_size}"
        )
    m = batch // per_step
    probe = build(batch)
    graph = build(per_step)
    if probe is None or graph is None:
        raise PlanError("the Megatron recipe needs the model at the micro-batch size (zoo models)")
    smesh = stage_mesh(mesh, pipeline)
    plans, profiles = [], []
    for sub in stage_graphs(graph, stage_starts(probe, pipeline)):
        strategies = megatron(sub, smesh, tensor)
        prof = profile_stage(sub, smesh, strategies, opts)
        plans.append(Plan(sub, smesh, strategies, "megatron", opts, cost=prof.breakdown))
        profiles.append(prof)
    tp = assemble(
        probe.name,
        mesh,
        batch,
        [(p, prof, Levers(recompute, 0)) for p, prof in zip(plans, profiles, strict=True)],
        m,
        "megatron-recipe",
        tokens_per_sample(probe, batch),
    )
    return replace(
        tp,
        axes=axis_summary(tp),
        notes=(
            f"Megatron-LM recipe: tensor x{tensor}, pipeline x{pipeline}, data x{data}, "
            f"micro-batch size {micro_batch_size} ({m} micro-batches), {recompute.value} "
            "recomputation, no ZeRO",
        ),
        step=tp.step,
    )
