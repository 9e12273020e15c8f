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

from shardplan import units
from shardplan.errors import InfeasibleError, NothingSplitWarning
from shardplan.ir.op import Role
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
    links = node_crossing_note(problem.mesh)
    progress = getattr(typed, "progress", None)
    if links and progress is not None:  # before a search this mesh may make slow
        progress(f"  note: {links}")
    result = solver.run(problem, typed, start)
    if isinstance(result, TrainingPlan):
        _check_budget(problem, method, result.step.memory_per_device if result.step else 0.0)
        notes = (*result.notes, links) if links else result.notes
        return replace(result, problem=problem, step=result.step, notes=notes)
    if problem.zero is not None and result.zero != problem.zero:  # searches price stage 0
        result = with_zero(result, problem.zero)
    if result.cost is not None:
        _check_budget(problem, method, result.cost.memory_per_device)
    said = tuple(n for n in (unused_devices_note(result), links) if n)
    if said:
        result = with_status(result, result.status, said)
    return replace(result, problem=problem)


def node_crossing_note(mesh: Mesh) -> str | None:
    """Say so when a mesh axis spans nodes although its innermost ways fit in one: every
    collective on it is priced at the inter-node link (row-major layout,
    `Machine.link_bandwidths`), and splitting it as nodes x GPUs per node would price the ways
    inside a node at the node's link. None for a mesh with bandwidths other than the machine's."""
    hw = mesh.hardware
    if hw is None or mesh.bandwidth_bytes_per_s != hw.link_bandwidths(mesh.shape):
        return None
    if hw.intra_node_bytes_per_s <= hw.inter_node_bytes_per_s:
        return None
    for axis, size in enumerate(mesh.shape):
        inner = math.prod(mesh.shape[axis + 1 :])
        crossing = mesh.bandwidth_bytes_per_s[axis] <= hw.inter_node_bytes_per_s
        if not crossing or hw.devices_per_node % inner:
            continue
        ways = hw.devices_per_node // inner  # of this axis inside one node
        if ways > 1 and size > ways and size % ways == 0:
            split = (*mesh.shape[:axis], size // ways, ways, *mesh.shape[axis + 1 :])
            return (
                f"mesh axis {mesh.names[axis]!r} ({size} ways) crosses nodes of "
                f"{hw.devices_per_node} devices ({hw.name}), so all its collectives are priced "
                f"at the inter-node {units.bandwidth(hw.inter_node_bytes_per_s)}, none at the "
                f"node's {units.bandwidth(hw.intra_node_bytes_per_s)}; plan on mesh "
                f"{'x'.join(map(str, split))} (a node's {ways} devices as an axis of their own) "
                "to price the ways inside a node at the node's link"
            )
    return None


def _check_budget(problem: Problem, method: str, need: float) -> None:
    """InfeasibleError when a plan needs more than the Problem's budget."""
    budget, graph, mesh = problem.budget, problem.graph, problem.mesh
    if budget is None or need <= budget:
        return
    raise InfeasibleError(
        f"{method} plan of {graph.name!r} on mesh {mesh.text()} needs "
        f"{units.nbytes(need)} per device, over the {units.nbytes(budget)} budget by "
        f"{units.nbytes(need - budget)}; use more devices, a smaller batch, method "
        "'drec'/'fsdp', a ZeRO stage (--zero), or plan the training step with --dtype bf16 "
        "(micro-batches, recomputation, ZeRO, pipeline stages)"
    )


ADVICE = (
    "to get a split, give a per-device memory budget (memory= / --memory), name a method "
    "(method='megatron', 'fsdp' or 'data-parallel' / --method), or plan a larger batch"
)
"""How to get a split, said wherever a plan splits nothing (API warning, CLI, verify)."""


TRIVIAL_SHARE = 0.01
"""An axis whose split ops carry under this share of the model's FLOPs is reported as (nearly)
unused: splitting a few cheap ops (an embedding, a bias) is not using the devices. A reporting
threshold for the warning only; no plan depends on it."""


def split_warning(p: Plan, state_sharded: bool = False) -> str | None:
    """One line when `p` leaves a mesh axis of size > 1 unused (no op, or only ops carrying
    under `TRIVIAL_SHARE` of the FLOPs, split across it) or shards no parameter (the devices
    hold copies of the model; not said when `state_sharded`: ZeRO splits the state of a
    training stage), saying what, why and how to get a split (`ADVICE`); None when every axis
    splits real work and some parameter is sharded. O(ops x rounds + parameters)."""
    mesh, rounds = p.mesh, p.mesh.rounds
    used = {r for r in range(len(rounds)) if any(s[r] is not None for s in p.strategies.values())}
    total = sum(op.flops for op in p.graph.ops) or 1.0
    idle, trivial = [], False
    for axis, (name, size) in enumerate(zip(mesh.names, mesh.shape, strict=True)):
        mine = [r.index for r in rounds if r.mesh_axis == axis]
        share = sum(
            op.flops
            for op in p.graph.ops
            if any(p.strategies[op.name][r] is not None for r in mine)
        )
        if size > 1 and share < TRIVIAL_SHARE * total:
            idle.append(f"{name!r} ({size}-way)")
            trivial = trivial or any(r in used for r in mine)
    layouts = p.tensor_layouts()
    params = [t.name for t in p.graph.tensors.values() if t.role is Role.PARAMETER]
    sharded = sum(any(x >= 0 for x in layouts.get(n, ())) for n in params)
    idle_rounds = [r for r in range(len(rounds)) if r not in used]
    why = f" because {idle_reason(p, idle_rounds)}" if idle and idle_rounds else ""
    every = len(idle) == sum(size > 1 for size in mesh.shape)
    if idle and every:
        what = "almost nothing was split" if trivial else "nothing was split"
        return (
            f"{what}: the {p.method} plan of {p.graph.name!r} replicates every op "
            + (f"carrying {TRIVIAL_SHARE:.0%} or more of the FLOPs " if trivial else "")
            + f"on all {mesh.size} devices of mesh {mesh.text()}{why}; {ADVICE}"
        )
    if idle:
        return (
            f"mesh axis {' and '.join(idle)} {'nearly ' if trivial else ''}unused: the "
            f"{p.method} plan of {p.graph.name!r} replicates "
            f"{'almost ' if trivial else ''}every op across it{why}; {ADVICE}"
        )
    whole = params and not sharded and not state_sharded
    if whole and mesh.size > 1 and p.method != "data-parallel":
        return (
            f"no parameter is sharded: the {p.method} plan of {p.graph.name!r} keeps all "
            f"{len(params)} parameters whole on each of the {mesh.size} devices (data "
            "parallelism); to shard them, give a memory budget (memory= / --memory) or name "
            "method 'megatron' or 'fsdp'"
        )
    return None


def warn_if_nothing_split(p: Plan, where: str) -> None:
    """`split_warning(p)` as a NothingSplitWarning from `where` (`parallelize`, `shard`), pointing
    at the caller's caller."""
    import warnings

    message = split_warning(p)
    if message:
        warnings.warn(f"{where}: {message}", NothingSplitWarning, stacklevel=3)




def unused_devices_note(p: Plan) -> str | None:
    """Say so when a plan leaves rounds of the mesh unused (every op replicated across them), and
    why (`idle_reason`)."""
    rounds = p.mesh.rounds
    idle = [r for r in range(len(rounds)) if all(s[r] is None for s in p.strategies.values())]
    parts = []
    for axis, name in enumerate(p.mesh.names):
        ways = math.prod(rounds[r].q for r in idle if rounds[r].mesh_axis == axis)
        size = p.mesh.shape[axis]
        if ways == size > 1:  # a size-1 axis has nothing to split
            parts.append(f"mesh axis {name!r} ({size}-way)")
        elif ways > 1:
            parts.append(f"{ways} of the {size} ways of mesh axis {name!r}")
    if not parts:
        return None
    return (
        f"{' and '.join(parts)} left unused: every op is replicated across it because "
        f"{idle_reason(p, idle)}"
    )


def idle_reason(p: Plan, idle: list[int]) -> str:
    """Why rounds `idle` of plan `p` split nothing: an expert plan's recipe has nothing left to
    split, no loop dim of any op divides by the round's q there, or (otherwise) the planner
    found that spreading the work over those links costs more than it saves."""
    from shardplan.sharding import cut_problem, local_extents

    rounds = p.mesh.rounds
    if p.method in experts.EXPERTS:
        return (
            f"the {p.method} plan splits only the dims its recipe names (the batch for data "
            "parallelism, hidden dims for Megatron) and they do not divide further"
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
            f"no dim of any op divides by {', '.join(map(str, qs))} there (use a mesh whose "
            "sizes divide the model's dims: batch, hidden, heads)"
        )
    return "splitting this model and batch over those links costs more time than it saves"
