"""D-Rec's variants: which greedy searches one call runs, and the best of their polished plans.

Each variant (`search.drec_folded`'s docstring: "no cut" priced two ways, leading axes left
unused, heavy ops by their dearest or cheapest cut, hopeful all-reduces, the next-round
lookahead) is one linear `search._Search` run over the rounds (the cheapest-cut-first order
only with two or more heavy ops: with one it is the dearest-first search again); its plan is
polished (`polish.py`) and scored by the evaluator, and the lowest score is kept. Variants share the
graph's tables, own prices and edge contexts (`tables.py`, `state.py`), the rounds an earlier
variant already decided alike, and one `ScoreCache` for scoring. A variant leaving rounds unused
is skipped when `gates.unused_floor` shows it cannot win. O(variants x linear search).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from shardplan.cost.evaluate import ScoreCache
from shardplan.cost.presets import CostOptions
from shardplan.errors import ShardplanError
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.search.drec.flex import FlexGraph
from shardplan.search.drec.fold import Fold, op_labels
from shardplan.search.drec.gates import unused_floor
from shardplan.search.drec.nextround import differs
from shardplan.search.drec.polish import plan_score, polish
from shardplan.search.drec.state import EdgeBook
from shardplan.search.drec.swaps import with_round_swaps
from shardplan.search.drec.tables import SearchTables
from shardplan.sharding import Strategy, check_strategies


def variant_runs(
    mesh: Mesh, opts: CostOptions, pinned: Mapping[int, Strategy] | None, heavy: int = 2
) -> deque[tuple[int, bool, bool, bool, bool, bool]]:
    """The variants to run (`search.drec_folded`'s docstring), as (rounds left unused, final
    compute, ties deferred, lightest cut first, hopeful all-reduces, next-round lookahead);
    `heavy`: the graph's heavy ops (with one, the lightest-cut-first order is the same search)."""
    rounds = mesh.rounds
    axis_ends = [r for r in range(1, len(rounds)) if rounds[r].mesh_axis != rounds[r - 1].mesh_axis]
    variants = [(0, False, False, False), (0, True, True, False)]
    variants += [(k, False, False, False) for k in [*axis_ends, len(rounds)]]
    variants.insert(1, (0, False, False, True))
    if opts.preset.symbolic:  # MindSpore's constants: its one greedy pass, to reproduce it
        variants = variants[:1]
    if pinned:  # a variant leaving rounds unused must not override a fixed cut in them
        first_cut = min((r for s in pinned.values() for r, c in enumerate(s) if c), default=None)
        variants = [v for v in variants if first_cut is None or v[0] <= first_cut]
    if heavy <= 1:  # one heavy op orders alike by either cut: the same search
        variants = [v for v in variants if not v[3]]
    runs = deque((*v, opts.preset.symbolic, False) for v in variants)  # MindSpore's: hopeful
    if not opts.preset.symbolic and any(map(differs, rounds, rounds[1:])):
        runs.append((0, False, False, False, False, True))  # the next-round lookahead
    return runs


def best_variant(
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    memory_lambda: float,
    fold: Fold | None,
    flex: FlexGraph,
    pinned: Mapping[int, Strategy] | None = None,
    *,
    searches: tuple[Callable[..., Any], Callable[..., Any]],
    cache: ScoreCache | None = None,
) -> dict[str, Strategy] | None:
    """Every variant's plan, polished (`polish.py`), the lowest scored kept; None when a variant
    broke `fold`'s uniform interior. `searches`: the class running one variant, and the one
    running it with pinned ops (`search._Search`, `search._PinnedSearch`); `cache`: a
    `ScoreCache` of `graph` on `mesh` to score in (else one of its own)."""
    search_class = searches[1] if pinned else searches[0]
    best: dict[str, Strategy] | None = None
    best_score = float("inf")
    rounds = mesh.rounds
    weights = fold.round_weights() if fold is not None else None
    labels = fold.labels if fold is not None else op_labels(graph)  # the same for every variant
    scored: list[tuple[dict[str, Strategy], float]] = []
    raw: list[dict[str, Strategy]] = []  # the variants' plans before the polish
    twins = fold.twins() if fold is not None else None
    tables = SearchTables.of(graph, flex)  # shared by the variants: graph and flex alone
    cache = cache if cache is not None else ScoreCache(graph, mesh, opts)  # and plan prices
    runs = variant_runs(mesh, opts, pinned, len(flex.heavy))
    rounds_seen: dict[tuple[object, ...], tuple[dict[int, str | None], bool]] = {}
    prices: dict[tuple[object, ...], dict[str | None, float]] = {}  # own prices, shared
    edges = EdgeBook()  # and edge contexts and prices
    while runs:
        unused, final_compute, defer, by_min, hopeful, ahead = runs.popleft()
        if unused and best_score < unused_floor(graph, mesh, opts, unused, weights):
            continue  # leaving those rounds unused cannot beat the plan found: not searched
        if unused == len(rounds) and not pinned:  # nothing left to search: all replicated
            strategies = {op.name: (None,) * len(rounds) for op in graph.ops}
        else:
            search = search_class(
                graph,
                mesh,
                opts,
                memory_lambda,
                unused,
                final_compute,
                flex,
                weights,
                labels,
                hopeful=hopeful,
                tables=tables,
                defer_ties=defer,
                lightest_cut_order=by_min,
                fixed=pinned,
                rounds_seen=rounds_seen,
                shared_prices=prices,
                shared_edges=edges,
                next_round=ahead,
            )
            strategies = search.run()
            if search.binding and not (unused or final_compute or ahead):  # a round could not cut
                # where the first variants assumed it would: price them hopefully too
                runs.appendleft((unused, final_compute, defer, by_min, True, ahead))
        if strategies in raw:
            continue  # another variant found the same plan: it is scored already
        raw.append(strategies)
        plans = [polish(graph, mesh, strategies, cache, weights, twins, frozen=pinned)]
        if memory_lambda:  # the polish prices time alone: the plan it started from may weigh less
            plans.append(strategies)
        for strategies in plans:
            if any(strategies == plan for plan, _ in scored):
                continue  # another variant's plan polished into this one: scored already
            if fold is not None and not fold.uniform(strategies):
                return None
            score = plan_score(graph, mesh, opts, memory_lambda, fold, cache, strategies)
            scored.append((strategies, score))
            if score < best_score:
                best, best_score = strategies, score
    if best is None or opts.preset.symbolic:
        return best
    return _with_swaps(graph, mesh, opts, memory_lambda, fold, cache, scored, best, pinned)


def _with_swaps(
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    memory_lambda: float,
    fold: Fold | None,
    cache: ScoreCache,
    scored: list[tuple[dict[str, Strategy], float]],
    best: dict[str, Strategy],
    frozen: Mapping[int, Strategy] | None = None,
) -> dict[str, Strategy]:
    """`swaps.with_round_swaps` of the variants' best plan: a swapped plan polished with pair
    and run moves (`frozen`: the pinned ops kept), kept when valid, uniform over `fold`'s
    interior and scored lower."""
    weights = fold.round_weights() if fold is not None else None
    twins = fold.twins() if fold is not None else None

    def improve(candidate: dict[str, Strategy]) -> tuple[dict[str, Strategy], float] | None:
        try:  # equal rounds exchanged keep each dim's split, yet a halo may not allow it
            check_strategies(graph.ops, candidate, mesh.rounds, cache.classes, cache.valid)
        except ShardplanError:
            return None
        found = polish(graph, mesh, candidate, cache, weights, twins, frozen, pairs=True)
        if fold is not None and not fold.uniform(found):
            return None
        return found, plan_score(graph, mesh, opts, memory_lambda, fold, cache, found)

    best_score = next(score for plan, score in scored if plan is best)
    return with_round_swaps(mesh, scored, best, best_score, improve)[0]


__all__ = ["best_variant", "variant_runs"]
