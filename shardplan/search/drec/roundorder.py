"""D-Rec with each axis's largest prime rounds first, on meshes whose axes mix primes.

A mesh axis is factored into prime rounds in ascending order (24 -> 2, 2, 2, 3; `mesh.py`), and
D-Rec decides round by round. A dim sized in powers of two (a batch of 8) can take every round
of 2 and still leave nothing for the round of 3, which must then cut a dim that costs collectives
(hidden units, heads); the greedy rounds of 2 never see that, since each prices its cuts assuming
later rounds help. So the rounds of 2 eat the batch and the round of 3 is tensor parallel, or the
rounds of 2 start cutting heads and both share them: BERT-base, one layer, batch 8, on mesh 24
cut the batch 4 ways and the heads 6 ways (1.185 of the ILP optimum), where the batch 8 ways and
the heads 3 ways is optimal; AlexNet on 20 was 1.064.

Deciding the largest prime first lets the round of 3 take the dim that divides by 3 while every
dim is whole, and the rounds of 2 share what is left. The rounds of one axis run over the same
links, so the search can run on a copy of the mesh with its rounds reordered (`reordered`); its
plan is mapped back to the mesh's own round order (`restored`), polished on the mesh
(`polish.py`) and kept when the mesh's own evaluator scores it lower than the plan found in the
ascending order (the copy's score is not used: a collective spanning several rounds is priced in
the mesh's order). Never worse than that plan; one more variant search on a mesh with a
mixed-prime axis, none otherwise (a mesh of one prime per axis, 8 or 4x8, has one order).

Across axes the same holds, and when no cut plan beat keeping everything whole (D-Rec found no
parallelism worth its collectives, as for `swaps.py`) the rounds are also tried in descending
prime order over every axis (`largest_overall`), each round with its own links: BERT-base, one
layer, batch 28, on 2x2x7 stayed replicated (1.279 of the ILP optimum), where the round of 7
decided first takes the batch and the rounds of 2 then split heads and features, the optimum.
And with the axes in reverse order (`innermost_first`): BERT-base, one layer, batch 21, sequence
192, on 7x3 stayed replicated (1.307 of the ILP optimum): the batch split over the 7 nodes alone
all-reduces every weight's gradient across nodes, tensor parallelism over the 3 GPUs alone
all-reduces activations, and each loses to replication; decided first, the round of 3 cuts heads
and features (its all-reduces priced as shrunk by the rounds after it) and the round of 7 then
splits the batch of weights already split by 3, the optimum (1.000).
Both across-axis orders are also tried, whatever the plan, on a mesh of several axes whose
rounds' primes differ (3x5, 4x5, 2x2x3: which dims a prime can split depends on the order):
ViT-B/16, one layer, batch 45, on 3x5 split the batch over both axes (1.075 of the ILP
optimum), where the round of 5 decided first takes the batch and the round of 3 the heads.
At most two more variant searches, on such meshes or on a plan that cuts nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from shardplan.cost.evaluate import ScoreCache
from shardplan.cost.presets import CostOptions
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.search.drec.polish import pair_polished, plan_score, polished_if_lower
from shardplan.search.drec.swaps import cuts_anything
from shardplan.sharding import Strategy

Search = Callable[..., "dict[str, Strategy] | None"]


def largest_first(mesh: Mesh) -> list[int] | None:
    """Round indices with each axis's rounds in descending prime order (ties keep their order),
    or None when that is the mesh's own order (no axis mixes primes)."""
    order: list[int] = []
    for axis in range(len(mesh.shape)):
        mine = [r for r in mesh.rounds if r.mesh_axis == axis]
        order += [r.index for r in sorted(mine, key=lambda r: (-r.q, r.index))]
    return None if order == list(range(len(mesh.rounds))) else order


def reordered(mesh: Mesh, order: Sequence[int]) -> Mesh:
    """A copy of `mesh` whose round k is the mesh's round order[k] (renumbered k): the search's
    view only; plans on it go back to the mesh's order with `restored`. It compares equal to
    `mesh` (a Mesh's rounds are derived, not compared), so nothing priced on one of them may be
    shared with the other: the search on the copy gets no `ScoreCache` of the mesh."""
    copy = replace(mesh)
    rounds = tuple(replace(mesh.rounds[i], index=k) for k, i in enumerate(order))
    object.__setattr__(copy, "_rounds", rounds)  # as Mesh.__post_init__ sets its own
    return copy


def restored(plan: Mapping[str, Strategy], order: Sequence[int]) -> dict[str, Strategy]:
    """A plan of `reordered(mesh, order)` in the mesh's own round order."""
    out = {}
    for name, strategy in plan.items():
        cuts: list[str | None] = [None] * len(order)
        for k, i in enumerate(order):
            cuts[i] = strategy[k]
        out[name] = tuple(cuts)
    return out


def with_round_orders(
    search: Search,
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    memory_lambda: float,
    fold: Any,
    flex: Any,
    pinned: Mapping[int, Strategy] | None = None,
    *,
    first: Search,
    cache: ScoreCache | None = None,
) -> dict[str, Strategy] | None:
    """`first(graph, mesh, ...)`'s plan (the ascending order, with `submesh.py`'s smaller
    meshes), or `search`'s plan on the largest-first order, and, when the plan so far cuts
    nothing or the mesh's axes mix primes, on the largest-overall and the innermost-first
    orders, when the mesh scores it lower (module docstring);
    None as `first` says. Not tried with pinned ops (their strategies are in the
    mesh's order) nor by the symbolic preset (MindSpore's one pass). `cache`: a `ScoreCache`
    of `graph` on `mesh` the scoring on `mesh` shares (else one of its own)."""
    cache = cache if cache is not None else ScoreCache(graph, mesh, opts)
    best = first(search, graph, mesh, opts, memory_lambda, fold, flex, pinned, cache=cache)
    if best is None or pinned or opts.preset.symbolic:
        return best
    largest, overall, inner = largest_first(mesh), largest_overall(mesh), innermost_first(mesh)
    # across axes: when no cut plan beat keeping everything whole, or the axes' primes differ
    primes = {r.q for r in mesh.rounds}
    across = not cuts_anything(best) or (len(mesh.shape) > 1 and len(primes) > 1)
    polished = False
    for order in (largest, overall, inner):
        if order is None or (order is not largest and (order == largest or not across)):
            continue
        if order is inner and order == overall:
            continue  # searched already
        found = search(graph, reordered(mesh, order), opts, memory_lambda, fold, flex, None)
        if found is None:
            continue  # it broke the fold's uniform interior: keep the plan found so far
        if not polished:  # compared as the search returns them: with the pair and run moves
            best = pair_polished(graph, mesh, opts, memory_lambda, fold, cache, best)
            polished = True
        best_score = plan_score(graph, mesh, opts, memory_lambda, fold, cache, best)
        candidate = restored(found, order)
        args = (graph, mesh, opts, memory_lambda, fold, cache, best, best_score, candidate)
        best = polished_if_lower(*args, pairs=True)
    return best


def largest_overall(mesh: Mesh) -> list[int] | None:
    """Round indices in descending prime order across every axis (ties keep their order), or
    None when that is the mesh's own order."""
    order = [r.index for r in sorted(mesh.rounds, key=lambda r: (-r.q, r.index))]
    return None if order == list(range(len(mesh.rounds))) else order


def innermost_first(mesh: Mesh) -> list[int] | None:
    """Round indices with the axes in reverse order (the innermost axis's rounds first, each
    axis's in the mesh's order), or None when that is the mesh's own order (one axis)."""
    order = [r.index for r in sorted(mesh.rounds, key=lambda r: (-r.mesh_axis, r.index))]
    return None if order == list(range(len(mesh.rounds))) else order


__all__ = [
    "innermost_first",
    "largest_first",
    "largest_overall",
    "reordered",
    "restored",
    "with_round_orders",
]
