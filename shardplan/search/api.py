"""The front door of the search: `plan(graph, mesh, method=...)` -> Plan.

`plan` canonicalises its arguments once into a `Problem` (`shardplan.problem`) and `solve`
dispatches it through the solver registry (`search.solvers`: typed options per method). Methods:
"drec" (default), "ilp", "dp", and the expert plans "data-parallel", "megatron", "fsdp".
Whatever the method, the returned Plan is scored by the one evaluator. With a memory
budget (bytes per device) a plan that exceeds it is never returned: D-Rec reacts by re-running
with a growing penalty on bytes left replicated (lambda_k = 4^k * cost / budget, k = 0..7), and
prices ZeRO stages (`cost/zero.py`) 1, 2 and 3 on the unpenalised plan (and, when no penalised
plan fits, on the leanest one): the cheapest plan that fits wins (ties: stage 0, then the lower
stage), with a note naming the stage and what the lower stages needed (the training-step
planner, `search/scale.py`, chooses ZeRO per pipeline stage with micro-batches and
recomputation). `zero=N` forces stage N: the search still prices stage 0, the stage re-prices
its result (and the baselines). D-Rec's
plan is then compared, by the one evaluator, with "all replicated" and every expert plan
(baselines.py): the cheapest that fits is returned, with a note when a baseline won; if nothing
fits it raises InfeasibleError saying by how much. Other methods raise InfeasibleError when
over budget.
"""

from __future__ import annotations

import math
import time
from typing import Any

from shardplan.errors import InfeasibleError
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.plans import Plan, with_status, with_zero
from shardplan.problem import Problem
from shardplan.search import experts
from shardplan.search.solvers import METHODS, get_solver, solver_options

__all__ = ["METHODS", "plan", "solve", "unused_devices_note"]


def plan(
    graph: Graph,
    mesh: Mesh | str | int,
    method: str = "drec",
    train: bool = True,
    memory: float | str | None = None,
    preset: str = "shardplan",
    optimizer: str = "adam",
    machine: str | None = None,
    zero: int | None = None,
    **options: Any,
) -> Plan:
    """Plan `graph` on `mesh` with `method`; raise InfeasibleError rather than exceed `memory`.

    Args:
        graph: a verified Graph (zoo.build, from_torch, from_onnx, from_jaxpr).
        mesh: a Mesh or mesh text ("8", "2x8", "4x8").
        method: one of METHODS (`search.solvers.SOLVERS`).
        train: model the backward pass and optimizer state (default) or inference.
        memory: per-device budget in bytes or text ("80GB"); None: unchecked (still reported).
        preset: cost preset, "shardplan" or "mindspore".
        optimizer: optimizer state counted in memory: "adam", "sgd-momentum", "none".
        machine: the hardware preset mesh text is bound to (`shardplan.hardware.MACHINES`);
            None: `hardware.DEFAULT_MACHINE` ("a100"). A Mesh keeps its own machine.
        zero: the ZeRO stage (0-3) the plan must use (`cost/zero.py`); None: drec adds one only
            when the memory budget needs it, other methods return stage 0.
        options: the method's typed options (`search.solvers`: ilp/dp `time_limit` seconds, ...);
            an unknown one is a SolverError. drec and ilp take `fixed`: op name -> strategy (one
            loop dim or None per round) the plan must keep, the other ops planned around them.
    """
    problem = Problem.make(
        graph,
        mesh,
        machine=machine,
        train=train,
        memory=memory,
        preset=preset,
        optimizer=optimizer,
        zero=zero,
    )
    return solve(problem, method, **options)


def solve(problem: Problem, method: str = "drec", **options: Any) -> Plan:
    """Run `method` on a canonical Problem (the registry's typed options; see `plan`)."""
    solver = get_solver(method)
    typed = solver_options(method, options)
    start = time.perf_counter()
    result = solver.run(problem, typed, start)
    if problem.zero is not None and result.zero != problem.zero:  # searches price stage 0
        result = with_zero(result, problem.zero)
    budget, graph, mesh = problem.budget, problem.graph, problem.mesh
    if budget is not None and result.cost is not None and result.cost.memory_per_device > budget:
        raise InfeasibleError(
            f"{method} plan of {graph.name!r} on mesh {mesh.text()} needs "
            f"{result.cost.memory_per_device / 1e9:.3g} GB per device, over the "
            f"{budget / 1e9:.3g} GB budget by {(result.cost.memory_per_device - budget) / 1e9:.3g}"
            " GB; use more devices, a smaller batch, method 'drec'/'fsdp', a ZeRO stage (--zero), "
            "or plan the training step with --dtype bf16 (micro-batches, recomputation, ZeRO, "
            "pipeline stages)"
        )
    unused = unused_devices_note(result)
    return with_status(result, result.status, (unused,)) if unused else result


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
