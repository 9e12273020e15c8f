"""The plans D-Rec must never lose to: "all replicated" and every expert plan, as candidates.

D-Rec decides round by round; whatever that greedy returns, the front door (`search.api.plan`)
scores these baselines with the one evaluator alongside it and returns the cheapest plan that meets
the memory budget, with a note when a baseline won. So "D-Rec <= min(all replicated, every expert
plan)" holds by construction, not by hope. Two root causes made D-Rec lose before (issue 16):
  * the whole-round alternative "round left unused" was skipped whenever the heavy ops' cuts
    equalled D-Rec's (e.g. one heavy op already replicated) even though the light ops between
    them had been given cuts whose redistributions cost more than the round saves (a reshape ->
    neg -> reshape chain before a layer norm: 960 vs 0); `drec.py` now compares every op's cut;
  * the round-by-round greedy is myopic across rounds: in round 0 "no cut" is locally cheapest,
    but cutting the batch would have shrunk an unavoidable cost of a later round (a linear with a
    6-wide output on mesh 6 = 2 x 3: 11,984 vs 2,997 for data parallel); with the symbolic
    MindSpore preset only one variant of the search runs, so no whole-plan alternative caught it.
Cost: one expert pass O(|V| + |E|) per round and one evaluation per baseline that could win.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from shardplan import units
from shardplan.cost import CostOptions, ScoreCache
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.plans import Plan, scored_plan
from shardplan.search import experts
from shardplan.search.drec.fold import Fold
from shardplan.sharding import Strategy


def baseline_plans(
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    cache: ScoreCache | None = None,
    below: float | None = None,
    fold: Fold | None = None,
    found: Mapping[str, Strategy] | None = None,
) -> list[Plan]:
    """All-replicated, data-parallel, megatron and fsdp plans of `graph`, each scored (sharing
    `cache` with the search's own scoring when given). With `below` (the cost a baseline must
    beat), one whose compute alone reaches it is left out unscored: every other term of a plan
    is >= 0 (a share credit only returns part of its own op's terms), so it cannot win.
    With `fold` (repeated blocks of `graph`, `fold.py`) the expert plans are propagated on its
    reduced graph and expanded — exact when blocks 1 and 2 decide alike: the experts are
    forward passes, so every later block then sees what block 2 saw — and, with `below`, one
    whose exact total on the reduced graph (`Fold.total`) reaches it is left out unscored.
    `found` (the strategies of the plan that scored `below`, stored as its first readers read
    them): a baseline with exactly those strategies and no storage layouts of its own is that
    plan, so it costs `below` and cannot beat it: it is left out unscored too."""
    cache = cache if cache is not None else ScoreCache(graph, mesh, opts)
    rounds = len(mesh.rounds)
    reduced_cache = (  # its prices in the table the search's scoring filled
        ScoreCache(fold.reduced, mesh, opts, cache.table)
        if fold is not None and below is not None
        else None
    )
    folded = _folded_experts(fold, mesh, reduced_cache) if fold is not None else {}
    full: dict[str, Callable[[], dict[str, Strategy]]] = {
        "all-replicated": lambda: {op.name: (None,) * rounds for op in graph.ops},
        "data-parallel": lambda: experts.data_parallel(graph, mesh, cache.classes),
        "megatron": lambda: experts.megatron(graph, mesh, classes=cache.classes),
    }
    candidates = [
        ("all-replicated", None),
        ("data-parallel", None),
        ("megatron", None),
        ("fsdp", experts.fsdp_param_layouts),
    ]
    plans = []
    made: dict[str, dict[str, Strategy]] = {}  # each expert's full plan, built when first needed
    for method, layouts in candidates:
        base = "data-parallel" if method == "fsdp" else method  # fsdp: dp's cuts
        if reduced_cache is not None and base in folded:
            assert fold is not None and below is not None
            reach = below * (1 + 1e-9) + 1e-30  # the evaluator's total up to rounding
            if _folded_compute(fold, folded[base], reduced_cache) >= reach:
                continue  # its compute alone (a lower bound of its total) cannot win
            params = layouts(fold.reduced, mesh) if layouts is not None else None
            if fold.total(mesh, folded[base], opts, params, reduced_cache) >= reach:
                continue
        if base not in made:  # the reduced plan expanded (exact: see above), else the full one
            made[base] = fold.expand(folded[base]) if base in folded else full[base]()  # type: ignore[union-attr]
        strategies = made[base]
        if below is not None and layouts is None and strategies == found:
            continue  # D-Rec's own plan: the same cost
        if below is not None and _compute(graph, strategies, cache) >= below:
            continue
        params = layouts(graph, mesh) if layouts is not None else None
        rows = None  # an expanded plan's rows read off the reduced graph (`Fold.repeats`)
        if base in folded and params is None:
            rows = fold.repeats(mesh, strategies, opts, cache)  # type: ignore[union-attr]
        plans.append(scored_plan(graph, mesh, strategies, method, opts, cache, params, rows))
    return plans


def _folded_experts(
    fold: Fold, mesh: Mesh, cache: ScoreCache | None = None
) -> dict[str, dict[str, Strategy]]:
    """Expert plan -> its strategies of the reduced graph, for each expert whose blocks 1 and 2
    decide alike there (the others: computed on the full graph); `fold.expand` gives the full
    plan. `cache`: a `ScoreCache` of the reduced graph, whose classes refine the experts'."""
    reduced = fold.reduced
    rounds = len(mesh.rounds)
    classes = cache.classes if cache is not None else None
    data = experts.data_parallel(reduced, mesh, classes)
    plans = {
        "all-replicated": {op.name: (None,) * rounds for op in reduced.ops},
        "data-parallel": data,
        "megatron": experts.megatron(reduced, mesh, classes=classes, data=data),  # one dp walk
    }
    return {name: plan for name, plan in plans.items() if fold.uniform(plan)}


def _folded_compute(fold: Fold, strategies: dict[str, Strategy], cache: ScoreCache) -> float:
    """The compute term of the expanded plan (a lower bound of its total, as `_compute`), from
    the reduced graph's (`cache`) with block 2's counted n-3 times (`Fold.round_weights`)."""
    reduced = fold.reduced
    return sum(
        w * cache.unary(op, cid, strategies[op.name])[1]
        for w, op, cid in zip(fold.round_weights(), reduced.ops, cache.classes, strict=True)
    )


def _compute(graph: Graph, strategies: dict[str, Strategy], cache: ScoreCache) -> float:
    """The compute term of a plan (a lower bound of its cost), from the cache's unary prices."""
    return sum(
        cache.unary(op, cid, strategies[op.name])[1]
        for op, cid in zip(graph.ops, cache.classes, strict=True)
    )


def cheapest(
    found: Plan | None, baselines: list[Plan], budget: float | None, seconds: float
) -> Plan | None:
    """The cheapest of `found` (D-Rec's plan, or None when none fits) and the baselines that fit
    `budget`; a baseline wins only when strictly cheaper, and then says so in a note."""

    def fits(p: Plan) -> bool:
        assert p.cost is not None
        return budget is None or p.cost.memory_per_device <= budget

    best = found
    for b in baselines:
        assert b.cost is not None
        if fits(b) and (best is None or b.cost.total < best.cost.total):  # type: ignore[union-attr]
            best = b
    if best is None or best is found:
        return best
    assert best.cost is not None
    if found is None:
        why = "no D-Rec plan fits the memory budget"
    else:
        assert found.cost is not None
        why = f"D-Rec's own plan scores {units.cost(found.cost.total, found.cost.units)}"
    note = (
        f"the {best.method} plan (cost {units.cost(best.cost.total, best.cost.units)}) is "
        f"returned: {why}, and D-Rec never returns a plan costlier than all-replicated or "
        "an expert plan"
    )
    return Plan(
        graph=best.graph,
        mesh=best.mesh,
        strategies=best.strategies,
        method="drec",
        options=best.options,
        search_seconds=seconds,
        param_layouts=best.param_layouts,
        notes=(*(found.notes if found is not None else ()), note),
    )
