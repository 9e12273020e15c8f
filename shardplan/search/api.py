"""The front door of the search: `plan(graph, mesh, method=...)` -> Plan, with the memory driver.

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

import difflib
import math
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from shardplan import units
from shardplan.cost import CostOptions, ScoreCache
from shardplan.cost.zero import WHAT, zero_layouts
from shardplan.errors import InfeasibleError, NothingSplitWarning, PlanError
from shardplan.ir.graph import Graph
from shardplan.ir.op import Role
from shardplan.mesh import Mesh
from shardplan.plans import Plan, scored_plan, with_status, with_zero
from shardplan.problem import Problem
from shardplan.search import experts
from shardplan.search.baselines import baseline_plans, cheapest
from shardplan.search.drec import drec
from shardplan.search.solvers import METHODS, get_solver, solver_options
from shardplan.sharding import Strategy, check_strategy

__all__ = ["METHODS", "check_fixed", "drec_within", "plan", "solve", "unused_devices_note"]


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
            f"{units.nbytes(result.cost.memory_per_device)} per device, over the "
            f"{units.nbytes(budget)} budget by "
            f"{units.nbytes(result.cost.memory_per_device - budget)}; use more devices, a "
            "smaller batch, method 'drec'/'fsdp', a ZeRO stage (--zero), or plan the training "
            "step with --dtype bf16 (micro-batches, recomputation, ZeRO, pipeline stages)"
        )
    unused = unused_devices_note(result)
    return with_status(result, result.status, (unused,)) if unused else result


ADVICE = (
    "to get a split, give a per-device memory budget (memory= / --memory), name a method "
    "(method='megatron', 'fsdp' or 'data-parallel' / --method), or plan a larger batch"
)
"""How to get a split, said wherever a plan splits nothing (API warning, CLI, verify)."""


TRIVIAL_SHARE = 0.01
"""An axis whose split ops carry under this share of the model's FLOPs is reported as (nearly)
unused: splitting a few cheap ops (an embedding, a bias) is not using the devices. A reporting
threshold for the warning only; no plan depends on it."""


def split_warning(p: Plan) -> str | None:
    """One line when `p` leaves a mesh axis of size > 1 unused (no op, or only ops carrying
    under `TRIVIAL_SHARE` of the FLOPs, split across it) or shards no parameter (the devices
    hold copies of the model), saying what, why and how to get a split (`ADVICE`); None when
    every axis splits real work and some parameter is sharded. O(ops x rounds + parameters)."""
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
    if params and not sharded and mesh.size > 1 and p.method != "data-parallel":
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


def check_fixed(graph: Graph, mesh: Mesh, fixed: Mapping[str, Strategy]) -> dict[str, Strategy]:
    """The user-fixed strategies, checked: known op, one entry per round, valid cuts."""
    out: dict[str, Strategy] = {}
    for name, strategy in fixed.items():
        if name not in graph.op_index:
            near = difflib.get_close_matches(name, list(graph.op_index), n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise PlanError(f"fixed strategy for op {name!r}: no such op in {graph.name}{hint}")
        strategy = tuple(strategy)
        if len(strategy) != len(mesh.rounds):
            raise PlanError(
                f"fixed strategy {strategy} for op {name!r}: give one cut per round "
                f"({len(mesh.rounds)} rounds on mesh {mesh.text()}; '-' for none)"
            )
        check_strategy(graph.op(name), strategy, mesh.rounds)
        out[name] = strategy
    return out


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


def drec_within(
    problem: Problem, start: float, fixed: Mapping[str, Strategy] | None = None
) -> Plan:
    """D-Rec under the budget, then the cheapest of it and the baselines that fit (baselines.py).
    With `fixed` ops the baselines (which would not keep them) are not compared; the plan is
    D-Rec around the fixed ops or, when cheaper, the free plan with them swapped in."""
    graph, mesh, opts, budget = problem.graph, problem.mesh, problem.options, problem.budget
    # stages 1-2 split training state: inference and the symbolic preset try stage 3's storage
    free = (1, 2, 3) if opts.train and not opts.preset.symbolic else (3,)
    stages = free if problem.zero is None else (problem.zero,) if problem.zero else ()
    if fixed:
        pinned = check_fixed(graph, mesh, fixed)
        forced = _drec_search(graph, mesh, opts, budget, start, pinned, stages=stages)
        return _no_worse_than_swap(forced, graph, mesh, opts, budget, start, pinned, stages)
    cache = ScoreCache(graph, mesh, opts)  # repeated layers priced once across every plan scored
    try:
        found: Plan | None = _drec_search(
            graph, mesh, opts, budget, start, cache=cache, stages=stages
        )
        failure: InfeasibleError | None = None
    except InfeasibleError as e:
        found, failure = None, e
    if found is not None and problem.zero is not None and found.zero != problem.zero:
        found = with_zero(found, problem.zero)
    beat = found.cost.total if found is not None and found.cost is not None else None
    baselines = baseline_plans(graph, mesh, opts, cache, below=beat)
    if problem.zero:  # compared at the stage asked for
        baselines = [with_zero(b, problem.zero) for b in baselines]
    best = cheapest(found, baselines, budget, time.perf_counter() - start)
    if best is None:
        assert failure is not None
        raise failure
    return replace(best, search_seconds=time.perf_counter() - start)  # baselines included


def _no_worse_than_swap(
    forced: Plan,
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    budget: float | None,
    start: float,
    fixed: Mapping[str, Strategy],
    stages: tuple[int, ...] = (1, 2, 3),
) -> Plan:
    """D-Rec around fixed ops is greedy too: keep the free D-Rec plan with the fixed strategies
    swapped in when that is cheaper (and fits), saying so."""
    free = _drec_search(graph, mesh, opts, budget, start, stages=stages)
    strategies = {**free.strategies, **fixed}
    if free.zero:  # the free plan needed a ZeRO stage: compare at that stage
        swapped = with_zero(Plan(graph, mesh, strategies, "drec", opts), free.zero)
    else:
        swapped = Plan(graph, mesh, strategies, "drec", opts, param_layouts=free.param_layouts)
    assert swapped.cost is not None and forced.cost is not None
    fits = budget is None or swapped.cost.memory_per_device <= budget
    if not fits or swapped.cost.total >= forced.cost.total:
        return replace(forced, search_seconds=time.perf_counter() - start)
    return Plan(
        graph,
        mesh,
        swapped.strategies,
        "drec",
        swapped.options,
        time.perf_counter() - start,
        swapped.param_layouts,
        notes=(
            "the unforced plan with the forced strategies swapped in was cheaper than "
            "re-planning around them",
        ),
    )


def _drec_search(
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    budget: float | None,
    start: float,
    fixed: Mapping[str, Strategy] | None = None,
    cache: ScoreCache | None = None,
    stages: tuple[int, ...] = (1, 2, 3),
) -> Plan:
    """D-Rec, then (over budget) the memory penalty, then the ZeRO `stages` (module docstring)."""
    strategies = drec(graph, mesh, opts, fixed=fixed)
    cache = cache if cache is not None else ScoreCache(graph, mesh, opts)
    best = replace(
        scored_plan(graph, mesh, strategies, "drec", opts, cache),
        search_seconds=time.perf_counter() - start,
    )
    assert best.cost is not None
    if budget is None or best.cost.memory_per_device <= budget:
        return best
    notes: list[str] = [
        f"unconstrained D-Rec plan needs {units.nbytes(best.cost.memory_per_device)}"
        f" > {units.nbytes(budget)} budget"
    ]
    base = max(best.cost.total, 1e-30)
    leanest = best
    for k in range(8):
        lam = base / budget * 4.0**k
        candidate = Plan(graph, mesh, drec(graph, mesh, opts, lam, fixed=fixed), "drec", opts)
        assert candidate.cost is not None and leanest.cost is not None
        if candidate.cost.memory_per_device < leanest.cost.memory_per_device:
            leanest = candidate
        if candidate.cost.memory_per_device <= budget:
            notes.append(f"memory penalty lambda=4^{k}*cost/budget made it fit")
            fit = Plan(graph, mesh, candidate.strategies, "drec", opts, notes=tuple(notes))
            return _zero_fit(best, best, budget, start, notes, stages, fit)
    return _zero_fit(best, leanest, budget, start, notes, stages)


def _zero_fit(
    best: Plan,
    leanest: Plan,
    budget: float,
    start: float,
    notes: list[str],
    stages: tuple[int, ...],
    penalised: Plan | None = None,
) -> Plan:
    """The cheapest plan that fits `budget` among `penalised` (a stage-0 plan that fits, if
    any) and `best` (unpenalised) and `leanest` at each ZeRO stage of `stages`; ties: stage 0,
    then the lower stage, then `best`. InfeasibleError if none fits. The highest stage is
    priced first: a base it does not fit cannot fit a lower stage (it needs more memory)."""
    graph, mesh = best.graph, best.mesh
    bases = [("unpenalised", best)] + ([("leanest", leanest)] if leanest is not best else [])
    tried: list[tuple[int, str, Plan]] = []
    for z in sorted(stages, reverse=True):
        at = [(z, which, _at_stage(base, z)) for which, base in bases]
        if not tried:
            bases = [(w, b) for (w, b), t in zip(bases, at, strict=True) if _memory(t[2]) <= budget]
        tried += at
    tried.sort(key=lambda t: t[0])
    fitting = [t for t in tried if _memory(t[2]) <= budget]
    if penalised is not None:
        fitting.insert(0, (0, "penalised", penalised))
    if fitting:
        z, which, chosen = min(fitting, key=lambda t: (_total(t[2]), t[0], t[1] == "leanest"))
        if chosen is penalised:
            return replace(chosen, search_seconds=time.perf_counter() - start)
        why = "".join(
            f"; stage {lz} needs {units.nbytes(_memory(lp))}"
            for lz, lw, lp in tried
            if lz < z and lw == which
        )
        if penalised is not None:
            why += f"; the penalised stage-0 plan that fits costs {_cost_text(penalised)}"
        if chosen.zero != z:  # the symbolic preset: stage 3's storage, priced as edges
            notes.append(
                f"parameters the {which} D-Rec plan replicates are stored split over the rounds "
                "that replicate them and all-gathered where read (ZeRO stages are priced in the "
                f"'shardplan' preset only){why}"
            )
        else:
            notes.append(
                f"ZeRO stage {z} on the {which} D-Rec plan makes it fit "
                f"({units.nbytes(_memory(chosen))} per device, cost {_cost_text(chosen)}): "
                f"{WHAT[z]}{why}"
            )
        return replace(chosen, search_seconds=time.perf_counter() - start, notes=tuple(notes))
    last = min((t[2] for t in tried), key=_memory, default=leanest)
    stage = f" even at ZeRO stage {last.zero}" if last.zero else ""
    raise InfeasibleError(
        f"no D-Rec plan of {graph.name!r} fits {units.nbytes(budget)} per device on mesh "
        f"{mesh.text()}: the leanest needs {units.nbytes(_memory(last))}{stage} "
        f"(over by {units.nbytes(_memory(last) - budget)}); use more devices, "
        "a smaller batch, a larger --memory, or plan the training step with --dtype bf16 "
        "(micro-batches, recomputation, ZeRO, pipeline stages)"
    )


def _cost_text(p: Plan) -> str:
    assert p.cost is not None
    return units.cost(p.cost.total, p.cost.units)


def _memory(p: Plan) -> float:
    assert p.cost is not None
    return p.cost.memory_per_device


def _total(p: Plan) -> float:
    assert p.cost is not None
    return p.cost.total


def _at_stage(p: Plan, zero: int) -> Plan:
    """`p` at ZeRO stage `zero`; under the symbolic preset (no ZeRO prices) stage 3's storage
    as stage-0 parameter layouts, the edges from them priced by the preset's formulas."""
    if not p.options.preset.symbolic:
        return with_zero(p, zero)
    layouts = zero_layouts(p.graph, p.mesh.rounds, p.strategies)
    return Plan(p.graph, p.mesh, p.strategies, p.method, p.options, param_layouts=layouts)
