"""The first round decided again, last, with every other round's cuts fixed.

D-Rec decides round 0 on whole tensors: each cut's collectives are priced at the sizes before
any later round shrinks them, and the later rounds then build on it. A cut whose collectives
shrink with the later rounds' cuts while its alternative's do not is under-rated there: tensor
or expert parallelism all-reduces activations, which the later rounds' batch cuts shrink, while
a batch cut all-reduces whole weight gradients, which they do not. An MoE layer (batch 36,
sequence 160) on mesh 18 (rounds of 2, 3, 3) split the batch in every round (1.086 of the ILP
optimum), where the optimum splits heads, hidden units and experts over the round of 2 and the
batch over the rounds of 3; decided last, on the shapes the rounds of 3 leave, the round of 2
finds that plan (1.000).

So round 0 is searched once more, as the last round of a copy of the mesh whose rounds are
reordered (`roundorder.reordered`), every op pinned to the plan's cuts in the other rounds
(`search._PinnedSearch` with its free round): its greedy pass prices every cut on what the other
rounds leave. The plan found is mapped back and polished with pair and run moves; when the
mesh's evaluator scores it lower (`polish.polished_if_lower`), both plans get the search's later
moves (a tied parameter's readers kept whole, column moves, block copies) and the lower one is
kept: never worse than the plan without it (the later moves may reach a lower plan from either
start, so only one of them would lose some: BERT-base on 28, 1.023). Only where round 0
is unlike the last round (another axis or another number of ways): when they are alike, the last
round already was decided on what every other round leaves. Not with pinned ops nor by the
symbolic preset. O(1 linear search + 1 polish), and the later moves twice when it wins.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from shardplan.cost.evaluate import ScoreCache
from shardplan.cost.presets import CostOptions
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.search.drec.flex import FlexGraph
from shardplan.search.drec.fold import Fold, op_labels
from shardplan.search.drec.polish import plan_score, polished_if_lower
from shardplan.search.drec.roundorder import reordered, restored
from shardplan.search.drec.tables import SearchTables
from shardplan.sharding import Strategy


def redecided_round(mesh: Mesh) -> int | None:
    """The round to decide again (round 0), or None when it is like the last round."""
    rounds = mesh.rounds
    if len(rounds) < 2:  # a mesh of one device or one round: nothing else to decide on
        return None
    first, last = rounds[0], rounds[-1]
    return None if (first.mesh_axis, first.q) == (last.mesh_axis, last.q) else 0


def with_round_redecided(
    search_class: Callable[..., Any],
    finish: Callable[[dict[str, Strategy]], dict[str, Strategy]],
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    memory_lambda: float,
    fold: Fold | None,
    flex: FlexGraph,
    cache: ScoreCache,
    plan: dict[str, Strategy],
) -> dict[str, Strategy]:
    """`finish(plan)` (the search's later moves), or `finish` of the plan with
    `redecided_round` searched again last (module docstring) when that plan, polished, scores
    lower than `plan` and stays lower once finished: each local optimum gets the later moves.
    `search_class`: the search taking pinned ops and a free round (`search._PinnedSearch`);
    `cache`: a `ScoreCache` of `graph` on `mesh`."""
    other = _redecided(search_class, graph, mesh, opts, memory_lambda, fold, flex, cache, plan)
    done = finish(plan)
    if other is None:
        return done
    theirs = finish(other)
    score = partial(plan_score, graph, mesh, opts, memory_lambda, fold, cache)
    return theirs if score(theirs) < score(done) * (1 - 1e-12) else done


def _redecided(
    search_class: Callable[..., Any],
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    memory_lambda: float,
    fold: Fold | None,
    flex: FlexGraph,
    cache: ScoreCache,
    plan: dict[str, Strategy],
) -> dict[str, Strategy] | None:
    """The plan with `redecided_round` searched again last, polished with pair and run moves,
    when it scores lower than `plan`; else None."""
    free = redecided_round(mesh)
    if free is None or opts.preset.symbolic:
        return None
    order = [r for r in range(len(mesh.rounds)) if r != free] + [free]
    pinned = {graph.op_index[name]: tuple(cuts[i] for i in order) for name, cuts in plan.items()}
    weights = fold.round_weights() if fold is not None else None
    labels = fold.labels if fold is not None else op_labels(graph)
    search = search_class(
        graph,
        reordered(mesh, order),
        opts,
        memory_lambda,
        0,
        False,
        flex,
        weights,
        labels,
        tables=SearchTables.of(graph, flex),
        fixed=pinned,
        free_round=len(order) - 1,
    )
    candidate = restored(search.run(), order)
    if candidate == plan:
        return None
    score = plan_score(graph, mesh, opts, memory_lambda, fold, cache, plan)
    args = (graph, mesh, opts, memory_lambda, fold, cache, plan, score, candidate)
    found = polished_if_lower(*args, pairs=True)
    return None if found is plan else found


__all__ = ["redecided_round", "with_round_redecided"]
