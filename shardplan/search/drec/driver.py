"""D-Rec's driver: D-Rec under the memory budget, then the cheapest of it and the baselines.

`drec_within(problem)` runs D-Rec (`search.drec.search`); with a memory budget (bytes per
device) a plan that exceeds it is never returned: D-Rec re-runs with a growing penalty on bytes
left replicated (lambda_k = 4^k * cost / budget, k = 0..7), and prices ZeRO stages
(`cost/zero.py`) 1, 2 and 3 on the unpenalised plan (and, when no penalised plan fits, on the
leanest one): the cheapest plan that fits wins (ties: stage 0, then the lower stage), with a note
naming the stage and what the lower stages needed. `zero=N` forces stage N: the search still
prices stage 0, the stage re-prices its result (and the baselines). D-Rec's plan is then compared,
by the one evaluator, with "all replicated" and every expert plan (`baselines.py`): the cheapest
that fits is returned, with a note when a baseline won; if nothing fits it raises
InfeasibleError saying by how much. At most 9 D-Rec runs and 3 x 2 ZeRO re-pricings.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import replace

from shardplan import units
from shardplan.cost import CostOptions, ScoreCache
from shardplan.cost.zero import WHAT, zero_layouts
from shardplan.errors import InfeasibleError
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.plans import Plan, scored_plan, with_zero
from shardplan.problem import Problem
from shardplan.search.drec.baselines import baseline_plans, cheapest
from shardplan.search.drec.fold import Fold
from shardplan.search.drec.search import drec_folded, without_gc_pauses
from shardplan.sharding import Strategy, check_fixed

__all__ = ["drec_within"]


def drec_within(
    problem: Problem, start: float, fixed: Mapping[str, Strategy] | None = None
) -> Plan:
    """D-Rec under the budget, then the cheapest of it and the baselines that fit (baselines.py).
    With `fixed` ops the baselines (which would not keep them) are not compared; the plan is
    D-Rec around the fixed ops or, when cheaper, the free plan with them swapped in."""
    with without_gc_pauses():  # the baselines and scores too
        return _drec_within(problem, start, fixed)


def _drec_within(
    problem: Problem, start: float, fixed: Mapping[str, Strategy] | None = None
) -> Plan:
    """`drec_within` with the garbage collector paused (`search.without_gc_pauses`)."""
    graph, mesh, opts, budget = problem.graph, problem.mesh, problem.options, problem.budget
    # stages 1-2 split training state: inference and the symbolic preset try stage 3's storage
    free = (1, 2, 3) if opts.train and not opts.preset.symbolic else (3,)
    stages = free if problem.zero is None else (problem.zero,) if problem.zero else ()
    if fixed:
        pinned = check_fixed(graph, mesh, fixed)
        forced = _drec_search(graph, mesh, opts, budget, start, pinned, stages=stages)[0]
        return _no_worse_than_swap(forced, graph, mesh, opts, budget, start, pinned, stages)
    cache = ScoreCache(graph, mesh, opts)  # repeated layers priced once across every plan scored
    fold: Fold | None = None  # D-Rec's fold of repeated blocks: the baselines use it too
    try:
        found: Plan | None
        found, fold = _drec_search(graph, mesh, opts, budget, start, cache=cache, stages=stages)
        failure: InfeasibleError | None = None
    except InfeasibleError as e:
        found, failure = None, e
    if found is not None and problem.zero is not None and found.zero != problem.zero:
        found = with_zero(found, problem.zero)
    beat = found.cost.total if found is not None and found.cost is not None else None
    exact = problem.zero is None or problem.zero == 0  # baselines compared at stage 0
    # D-Rec's own plan among the baselines is not scored again (at stage 0, stored as read)
    own = found.strategies if found is not None and not found.param_layouts else None
    own = own if own is not None and found.zero == 0 and not problem.zero else None
    baselines = baseline_plans(graph, mesh, opts, cache, beat, fold if exact else None, own)
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
    free = _drec_search(graph, mesh, opts, budget, start, stages=stages)[0]
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
) -> tuple[Plan, Fold | None]:
    """D-Rec, then (over budget) the memory penalty, then the ZeRO `stages` (module docstring);
    and the fold of repeated blocks D-Rec searched (None: the full graph)."""
    cache = cache if cache is not None else ScoreCache(graph, mesh, opts)
    strategies, folded = drec_folded(graph, mesh, opts, fixed=fixed, cache=cache)
    notes: list[str] = [folded.note()] if folded is not None else []
    rows = folded.repeats(mesh, strategies, opts, cache) if folded is not None else None
    best = replace(
        scored_plan(graph, mesh, strategies, "drec", opts, cache, None, rows),
        search_seconds=time.perf_counter() - start,
        notes=tuple(notes),
    )
    assert best.cost is not None
    if budget is None or best.cost.memory_per_device <= budget:
        return best, folded
    notes.append(
        f"unconstrained D-Rec plan needs {units.nbytes(best.cost.memory_per_device)}"
        f" > {units.nbytes(budget)} budget"
    )
    base = max(best.cost.total, 1e-30)
    leanest = best
    for k in range(8):
        lam = base / budget * 4.0**k
        strategies, fold = drec_folded(graph, mesh, opts, lam, fixed=fixed, cache=cache)
        rows = fold.repeats(mesh, strategies, opts, cache) if fold is not None else None
        candidate = scored_plan(graph, mesh, strategies, "drec", opts, cache, None, rows)
        assert candidate.cost is not None and leanest.cost is not None
        if candidate.cost.memory_per_device < leanest.cost.memory_per_device:
            leanest = candidate
        if candidate.cost.memory_per_device <= budget:
            notes.append(f"memory penalty lambda=4^{k}*cost/budget made it fit")
            fit = replace(candidate, notes=tuple(notes))  # scored already
            return _zero_fit(best, best, budget, start, notes, stages, fit), folded
    return _zero_fit(best, leanest, budget, start, notes, stages), folded


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
