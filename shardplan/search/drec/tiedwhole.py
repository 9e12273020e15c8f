"""D-Rec once more with a tied parameter's readers kept whole, where its gradient sums cost.

A parameter read by several ops (a language model's token embedding table, read by the lookup
and by the tied output head) is large and its readers decide early: every variant cut the
lookup along the batch in each round and summed the table's gradient there, then planned the
body around that. Where the optimum keeps both readers whole and parts the body freely (GPT-3,
2 layers, batch 6, on 12: tensor parallel x 4 and the batch x 3 in the body, 1.048 of the ILP
optimum with the table's gradient summed, the all-replicated plan) no polish move reaches it: it
changes every op. So when summing such a gradient whole over the mesh would cost at least
`WHOLE_GAIN` of the plan's score (`tied.whole_sum_s`: what a plan cutting its readers along the
batch pays), the variants run once more with those readers pinned whole in every round
(`variants.best_variant`'s pinned search): 1.048 -> 1.010 there. The plan is polished with
pair and run moves and kept when the evaluator scores it lower (`polish.polished_if_lower`).
Not tried when the readers' whole compute, with every other op's split evenly over the
devices, already costs what the plan found does (`_compute_floor`: GPT-2 small's tied head is
most of its compute). Never worse than the plan found; one more set of variant searches, and
only on graphs whose tied parameters' gradients cost that much.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shardplan.cost.evaluate import ScoreCache
from shardplan.cost.presets import CostOptions
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.search.drec.polish import plan_score, polished_if_lower
from shardplan.search.drec.tied import tied_parameters, whole_sum_s
from shardplan.sharding import Strategy

WHOLE_GAIN = 0.05
"""The search with a tied parameter's readers whole runs only where summing its whole gradient
over the mesh would cost at least this share of the plan's score: it is a second set of variant
searches, which a gain of a percent or two does not pay for (the tied moves, one polish per
try, are tried from `tied.GAIN`)."""


def with_tied_whole(
    search: Callable[..., dict[str, Strategy] | None],
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    memory_lambda: float,
    fold: Any,
    flex: Any,
    plan: dict[str, Strategy],
    cache: ScoreCache,
) -> dict[str, Strategy]:
    """`plan` (the search's, pair-polished), or `search`'s plan with the readers of the tied
    parameters whose gradient sums cost `WHOLE_GAIN` of its score pinned whole, when it scores lower
    once polished (module docstring). `search`: `variants.best_variant` with its classes."""
    if not opts.train or opts.preset.symbolic:
        return plan
    tied = tied_parameters(graph)
    if not tied:
        return plan
    score = plan_score(graph, mesh, opts, memory_lambda, fold, cache, plan)
    whole = (None,) * len(mesh.rounds)
    pinned: dict[int, Strategy] = {}
    for name, readers in tied.items():
        if whole_sum_s(graph, mesh, name) >= WHOLE_GAIN * score:
            pinned.update(dict.fromkeys(readers, whole))
    if not pinned or _compute_floor(graph, mesh, fold, cache, pinned) >= score:
        return plan  # the readers' whole compute alone costs what the plan found does
    found = search(graph, mesh, opts, memory_lambda, fold, flex, pinned, cache=cache)
    if found is None:
        return plan  # it broke the fold's uniform interior
    return polished_if_lower(
        graph, mesh, opts, memory_lambda, fold, cache, plan, score, found, pairs=True
    )


def _compute_floor(
    graph: Graph, mesh: Mesh, fold: Any, cache: ScoreCache, pinned: dict[int, Strategy]
) -> float:
    """A floor of any plan's cost with the `pinned` ops whole: their whole compute, and every
    other op's split evenly over the devices (rows weighted as `fold` scores them)."""
    whole = (None,) * len(mesh.rounds)
    weights = fold.round_weights() if fold is not None else [1.0] * len(graph.ops)
    floor = 0.0
    for i, (op, cid) in enumerate(zip(graph.ops, cache.classes, strict=True)):
        compute = cache.compute(op, cid, whole)
        floor += weights[i] * (compute if i in pinned else compute / mesh.size)
    return floor


__all__ = ["WHOLE_GAIN", "with_tied_whole"]
