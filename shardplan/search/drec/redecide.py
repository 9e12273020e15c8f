"""Rounds decided again, last, with every other round's cuts fixed.

D-Rec decides round 0 on whole tensors: each cut's collectives are priced at the sizes before
any later round shrinks them, and the later rounds then build on it. A cut whose collectives
shrink with the later rounds' cuts while its alternative's do not is under-rated there: tensor
or expert parallelism all-reduces activations, which the later rounds' batch cuts shrink, while
a batch cut all-reduces whole weight gradients, which they do not. An MoE layer (batch 36,
sequence 160) on mesh 18 (rounds of 2, 3, 3) split the batch in every round (1.086 of the ILP
optimum), where the optimum splits heads, hidden units and experts over the round of 2 and the
batch over the rounds of 3; decided last, on the shapes the rounds of 3 leave, the round of 2
finds that plan (1.000).

So a round is searched once more as the last round of a copy of the mesh whose rounds are
reordered (`roundorder.reordered`), every op pinned to the plan's cuts in the other rounds
(`search._PinnedSearch` with its free round): its greedy pass prices every cut on what the other
rounds leave. The plan found is mapped back and polished with pair and run moves, and replaces
the plan when the mesh's evaluator scores it lower (`polish.polished_if_lower`). Rounds alike
(one mesh axis, one number of ways) are exchangeable, and the last round already was decided on
what every other round leaves: so the rounds decided again are the first of each other class,
in round order (`redecided_rounds`: none on 8 or 1024, round 0 on 18, 12 or 4x8, rounds 0 and 1
on 2x2x3). When that changed the plan, both plans get the search's later moves (a tied
parameter's readers kept whole, column moves, block copies) and the lower one is kept: never
worse than the plan without it (the later moves may reach a lower plan from either start, so
keeping only one would lose some: BERT-base, one layer, batch 56, on 28 would).

When replication beat every search (the plan cuts nothing), each round alone may lose to it
while two together win: GPT-3, 3 layers, batch 10, on 2x5 stayed replicated (1.081 of the ILP
optimum): data parallelism over the 5 all-reduces every weight's whole gradient, tensor
parallelism over the 2 all-reduces whole activations. So each class of rounds is seeded with
the data-parallel expert's cuts in its rounds alone, every other round is then searched again
on them in turn, and the plan is polished, also from its tied parameters' readers kept whole
(frozen, then free); the lowest, when below the plan, goes on as the plan decided again: there
the round of 2 splits heads and hidden units on the 5's batch cut, the optimum (1.000).
Not with pinned ops nor by the symbolic preset. O(classes of rounds) linear searches and
polishes (O(classes^2) on a plan that cuts nothing), and the later moves twice when it wins.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from shardplan.cost.evaluate import ScoreCache
from shardplan.cost.presets import CostOptions
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.search.drec.flex import FlexGraph
from shardplan.search.drec.fold import Fold, op_labels
from shardplan.search.drec.polish import plan_score, polish, polished_if_lower
from shardplan.search.drec.roundorder import reordered, restored
from shardplan.search.drec.swaps import Plan, cuts_anything
from shardplan.search.drec.tables import SearchTables
from shardplan.search.drec.tied import tied_parameters
from shardplan.search.experts import data_parallel


def redecided_rounds(mesh: Mesh) -> list[int]:
    """The rounds to decide again: the first of each class of rounds alike (one mesh axis, one
    number of ways) but the last round's, in round order."""
    rounds = mesh.rounds
    if len(rounds) < 2:  # a mesh of one device or one round: nothing else to decide on
        return []
    last = (rounds[-1].mesh_axis, rounds[-1].q)
    firsts: dict[tuple[int, int], int] = {}
    for r in rounds:
        firsts.setdefault((r.mesh_axis, r.q), r.index)
    return [r for key, r in firsts.items() if key != last]


@dataclass(frozen=True, slots=True)
class _Context:
    """What every search and score of one D-Rec call's re-decisions reads."""

    search_class: Callable[..., Any]
    graph: Graph
    mesh: Mesh
    opts: CostOptions
    memory_lambda: float
    fold: Fold | None
    flex: FlexGraph
    cache: ScoreCache

    def score(self, plan: Plan) -> float:
        g, mesh, opts, fold = self.graph, self.mesh, self.opts, self.fold
        return plan_score(g, mesh, opts, self.memory_lambda, fold, self.cache, plan)

    def polished(self, plan: Plan, frozen: list[int] | None = None) -> Plan:
        """`plan` polished with pair and run moves (`frozen`: ops kept)."""
        fold = self.fold
        weights, twins = (None, None) if fold is None else (fold.round_weights(), fold.twins())
        return polish(self.graph, self.mesh, plan, self.cache, weights, twins, frozen, pairs=True)


def with_round_redecided(
    search_class: Callable[..., Any],
    finish: Callable[[Plan], Plan],
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    memory_lambda: float,
    fold: Fold | None,
    flex: FlexGraph,
    cache: ScoreCache,
    plan: Plan,
) -> Plan:
    """`finish(plan)` (the search's later moves), or `finish` of the plan with
    `redecided_rounds` searched again last, one after the other (module docstring), when that
    plan scores lower than `plan` and stays lower once finished: each start gets the later moves.
    `search_class`: the search taking pinned ops and a free round (`search._PinnedSearch`);
    `cache`: a `ScoreCache` of `graph` on `mesh`."""
    other = plan
    ctx = _Context(search_class, graph, mesh, opts, memory_lambda, fold, flex, cache)
    if not opts.preset.symbolic:
        other = _seeded(ctx, plan) or plan
        for free in redecided_rounds(mesh):
            other = _redecided(ctx, free, other) or other
    done = finish(plan)
    if other is plan:
        return done
    theirs = finish(other)
    return theirs if ctx.score(theirs) < ctx.score(done) * (1 - 1e-12) else done


def _redecided(ctx: _Context, free: int, plan: Plan) -> Plan | None:
    """The plan with round `free` searched again last, polished with pair and run moves, when
    it scores lower than `plan`; else None."""
    candidate = _searched_again(ctx, free, plan)
    if candidate == plan:
        return None
    args = (ctx.graph, ctx.mesh, ctx.opts, ctx.memory_lambda, ctx.fold, ctx.cache, plan)
    found = polished_if_lower(*args, ctx.score(plan), candidate, pairs=True)
    return None if found is plan else found


def _searched_again(ctx: _Context, free: int, plan: Plan) -> Plan:
    """`plan` with round `free` searched last, every op pinned to its cuts in the other rounds."""
    graph, fold = ctx.graph, ctx.fold
    order = [r for r in range(len(ctx.mesh.rounds)) if r != free] + [free]
    pinned = {graph.op_index[name]: tuple(cuts[i] for i in order) for name, cuts in plan.items()}
    search = ctx.search_class(
        graph,
        reordered(ctx.mesh, order),
        ctx.opts,
        ctx.memory_lambda,
        0,
        False,
        ctx.flex,
        fold.round_weights() if fold is not None else None,
        fold.labels if fold is not None else op_labels(graph),
        tables=SearchTables.of(graph, ctx.flex),
        fixed=pinned,
        free_round=len(order) - 1,
    )
    return restored(search.run(), order)


def _seeded(ctx: _Context, plan: Plan) -> Plan | None:
    """When `plan` cuts nothing (replication beat every search): for each class of rounds, the
    data-parallel expert's cuts in that class's rounds alone, every other round then searched
    again in turn on them, polished (also from its tied parameters' readers kept whole, frozen,
    then free); the lowest such plan when it scores below `plan`, else None."""
    graph, mesh = ctx.graph, ctx.mesh
    if cuts_anything(plan):
        return None
    classes: dict[tuple[int, int], list[int]] = {}
    for rnd in mesh.rounds:
        classes.setdefault((rnd.mesh_axis, rnd.q), []).append(rnd.index)
    if len(classes) < 2:
        return None
    data = data_parallel(graph, mesh)
    whole = (None,) * len(mesh.rounds)
    tied = sorted(i for readers in tied_parameters(graph).values() for i in readers)
    best, best_score = None, ctx.score(plan)
    for mine in classes.values():
        candidate = {
            name: tuple(c if r in mine else None for r, c in enumerate(cuts))
            for name, cuts in data.items()
        }
        if not cuts_anything(candidate):
            continue  # the expert cuts nothing in these rounds
        for free in (r for r in range(len(mesh.rounds)) if r not in mine):
            candidate = _searched_again(ctx, free, candidate)
        starts: list[tuple[Plan, list[int] | None]] = [(candidate, None)]
        if tied:
            kept_whole = {**candidate, **{graph.ops[i].name: whole for i in tied}}
            starts.append((kept_whole, tied))
        for start, frozen in starts:
            found = ctx.polished(start, frozen)
            if frozen:
                found = ctx.polished(found)
            if ctx.fold is not None and not ctx.fold.uniform(found):
                continue
            score = ctx.score(found)
            if score < best_score * (1 - 1e-12):
                best, best_score = found, score
    return best


__all__ = ["redecided_rounds", "with_round_redecided"]
