"""The front door of the search: `plan(model, mesh, method=...)` -> Plan or TrainingPlan.

`plan` canonicalises its arguments once into a `Problem` (`shardplan.problem`) and `solve`
dispatches it through the solver registry (`search.solvers`: typed options per method). SPMD
methods ("drec" default, "ilp", "dp", the expert plans "data-parallel", "megatron", "fsdp")
return a Plan scored by the one evaluator; the training-step methods ("step", "megatron-recipe")
return a TrainingPlan scored by the step model. Whatever the method, a plan over the Problem's
memory budget is never returned (InfeasibleError saying by how much): D-Rec's memory driver
(`search.drec.driver`) penalises, adds a ZeRO stage and compares baselines; the step search
chooses levers per stage; the other methods refuse. Every returned plan carries its Problem.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

from shardplan.errors import InfeasibleError
from shardplan.mesh import Mesh
from shardplan.plans import Plan, with_status, with_zero
from shardplan.problem import Problem
from shardplan.search import experts
from shardplan.search.solvers import METHODS, get_solver, solver_options
from shardplan.training import TrainingPlan

__all__ = ["METHODS", "plan", "solve", "unused_devices_note"]


def plan(
    model: Any,
    mesh: Mesh | str | int,
    method: str = "drec",
    train: bool = True,
    memory: float | str | None = None,
    preset: str = "shardplan",
    optimizer: str = "adam",
    machine: Any = None,
    zero: int | None = None,
    dtype: str | None = None,
    batch: int | None = None,
    **options: Any,
) -> Any:
    """Plan `model` on `mesh` with `method`; raise InfeasibleError rather than exceed `memory`.

    Args:
        model: a verified Graph (zoo.build, from_torch, from_onnx, from_jaxpr), or for the
            training-step methods a builder `batch -> Graph` (rebuilt at each micro-batch size).
        mesh: a Mesh or mesh text ("8", "2x8", "4x8").
        method: one of METHODS (`search.solvers.SOLVERS`).
        train: model the backward pass and optimizer state (default) or inference.
        memory: per-device budget in bytes or text ("80GB"); None: unchecked (still reported).
        preset: cost preset, "shardplan" or "mindspore".
        optimizer: optimizer state counted in memory: "adam", "sgd-momentum", "none".
        machine: the hardware mesh text is bound to: a preset name
            (`shardplan.hardware.MACHINES`) or a `Machine`; None: "a100". A Mesh keeps its own.
        zero: the ZeRO stage (0-3) the plan must use (`cost/zero.py`); None: drec adds one only
            when the memory budget needs it, other methods return stage 0.
        dtype: compute precision "bf16", "fp16" (mixed, fp32 master weights) or "fp32"; None:
            the graph's own element widths.
        batch: the global batch (needed with a builder; else read off the graph's input).
        options: the method's typed options (`search.solvers`: ilp/dp `time_limit` seconds,
            drec/ilp `fixed` op -> strategy, step `stages`/`progress`, megatron-recipe
            `tensor`, `pipeline`, `micro_batch_size`, `recompute`, ...); an unknown one is a
            SolverError.
    Returns:
        a Plan, or for "step" and "megatron-recipe" a TrainingPlan; `result.problem` is the
        Problem it was solved for.
    """
    problem = Problem.make(
        model,
        mesh,
        machine=machine,
        train=train,
        memory=memory,
        preset=preset,
        optimizer=optimizer,
        zero=zero,
        dtype=dtype,
        batch=batch,
    )
    return solve(problem, method, **options)


def solve(problem: Problem, method: str = "drec", **options: Any) -> Any:
    """Run `method` on a canonical Problem (the registry's typed options; see `plan`)."""
    solver = get_solver(method)
    typed = solver_options(method, options)
    start = time.perf_counter()
    result = solver.run(problem, typed, start)
    if isinstance(result, TrainingPlan):
        _check_budget(problem, method, result.step.memory_per_device if result.step else 0.0)
        return replace(result, problem=problem, step=result.step)
    if problem.zero is not None and result.zero != problem.zero:  # searches price stage 0
        result = with_zero(result, problem.zero)
    if result.cost is not None:
        _check_budget(problem, method, result.cost.memory_per_device)
    unused = unused_devices_note(result)
    if unused:
        result = with_status(result, result.status, (unused,))
    return replace(result, problem=problem)


def _check_budget(problem: Problem, method: str, need: float) -> None:
    """InfeasibleError when a plan needs more than the Problem's budget."""
    budget, graph, mesh = problem.budget, problem.graph, problem.mesh
    if budget is None or need <= budget:
        return
    raise InfeasibleError(
        f"{method} plan of {graph.name!r} on mesh {mesh.text()} needs "
        f"{need / 1e9:.3g} GB per device, over the "
        f"{budget / 1e9:.3g} GB budget by {(need - budget) / 1e9:.3g}"
        " GB; use more devices, a smaller batch, method 'drec'/'fsdp', a ZeRO stage (--zero), "
        "or plan the training step with --dtype bf16 (micro-batches, recomputation, ZeRO, "
        "pipeline stages)"
    )


def unused_devices_note(p: Plan) -> str | None:
    """Say so when a plan leaves rounds of the mesh unused (every op replicated across them), and
    why: an expert plan's recipe has nothing left to split, no loop dim of any op divides by the
    round's q there, or (otherwise) the planner found that spreading the work over those links
    costs more than it saves."""
    from shardplan.sharding import cut_problem, local_extents

    rounds = p.mesh.rounds
    idle = [r for r in range(len(rounds)) if all(s[r] is None for s in p.strategies.values())]
    if not idle:
        return None
    parts = []
    for axis, name in enumerate(p.mesh.names):
        ways = math.prod(rounds[r].q for r in idle if rounds[r].mesh_axis == axis)
        size = p.mesh.shape[axis]
        if ways == size:
            parts.append(f"mesh axis {name!r} ({size}-way)")
        elif ways > 1:
            parts.append(f"{ways} of the {size} ways of mesh axis {name!r}")
    if p.method in experts.EXPERTS:
        return (
            f"{' and '.join(parts)} left unused: the {p.method} plan splits only the dims its "
            "recipe names (the batch for data parallelism, hidden dims for Megatron) and they "
            "do not divide further; every op is replicated across it"
        )
    divisible = any(
        cut_problem(
            op, d.name, local_extents(op, p.strategies[op.name], rounds, r)[d.name], rounds[r].q
        )
        is None
        for r in idle
        for op in p.graph.ops
        for d in op.signature.loop_dims
        if d.splittable
    )
    if not divisible:
        qs = sorted({rounds[r].q for r in idle})
        return (
            f"{' and '.join(parts)} left unused: no dim of any op divides by "
            f"{', '.join(map(str, qs))} there, so every op is replicated across it; use a mesh "
            "whose sizes divide the model's dims (batch, hidden, heads)"
        )
    return (
        f"{' and '.join(parts)} left unused: every op is replicated across it, because "
        "splitting this model and batch over those links costs more time than it saves; a "
        "larger batch would use it (or plan on fewer devices)"
    )
