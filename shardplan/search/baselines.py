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
Cost: one expert pass O(|V| + |E|) per round and one evaluation per baseline.
"""

from __future__ import annotations

from shardplan.cost import CostOptions
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.plans import Plan
from shardplan.search import experts


def baseline_plans(graph: Graph, mesh: Mesh, opts: CostOptions) -> list[Plan]:
    """All-replicated, data-parallel, megatron and fsdp plans of `graph`, each scored."""
    rounds = len(mesh.rounds)
    replicated = {op.name: (None,) * rounds for op in graph.ops}
    dp = experts.data_parallel(graph, mesh)
    return [
        Plan(graph, mesh, replicated, "all-replicated", opts),
        Plan(graph, mesh, dp, "data-parallel", opts),
        Plan(graph, mesh, experts.megatron(graph, mesh), "megatron", opts),
        Plan(graph, mesh, dp, "fsdp", opts, 0.0, experts.fsdp_param_layouts(graph, mesh)),
    ]


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
        why = f"D-Rec's own plan scores {found.cost.total:.6g}"
    note = (
        f"the {best.method} plan (cost {best.cost.total:.6g}) is returned: {why}, and D-Rec "
        "never returns a plan costlier than all-replicated or an expert plan"
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
