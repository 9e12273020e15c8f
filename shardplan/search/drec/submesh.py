"""D-Rec on a smaller mesh: the innermost axis's trailing rounds of its largest prime left unused.

The unused-axis variants leave the leading rounds (slow outer axes) unused. On a mesh whose
innermost axis mixes primes (12 = 2 x 2 x 3, 18 = 2 x 3 x 3, 20 = 2 x 2 x 5) the rounds of the
largest prime come last; a model sized in powers of two can often cut them only along dims that
cost collectives (a tensor-parallel cut of 1536 = 3 x 512 hidden units), and the best plan
leaves them unused. Each round prices its cuts assuming later rounds help (they shrink its
all-reduces), so the rounds of 3 are never priced as a pair that should both stay unused:
qwen3-235b-a22b (2 layers) on 18 cut its expert matmuls by 3 and all-reduced their activations'
gradients, 1.276 of the ILP optimum, where using only the round of 2 is optimal.

`with_smaller_meshes` searches the mesh without those rounds too (recursively: 30 = 2 x 3 x 5
tries 6, then 2), pads its plan with "no cut", polishes it on the full mesh and keeps it when
the full mesh's score is lower. A smaller mesh is not searched when the plan found leaves those
rounds unused already, nor when `gates.unused_floor` on its devices reaches the best score.
Extra cost: at most one search per distinct prime of the innermost axis, with fewer rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from shardplan.cost.evaluate import ScoreCache
from shardplan.cost.presets import CostOptions
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.search.drec.gates import unused_floor
from shardplan.search.drec.polish import plan_score, polished_if_lower
from shardplan.sharding import Strategy

Search = Callable[..., "dict[str, Strategy] | None"]


def trailing_submesh(mesh: Mesh) -> Mesh | None:
    """`mesh` without the innermost axis's rounds of its largest prime, when that axis has
    rounds of another prime before them (else None)."""
    axis = len(mesh.shape) - 1
    qs = [r.q for r in mesh.rounds if r.mesh_axis == axis]
    if len(set(qs)) < 2:
        return None
    largest = max(qs)
    shape = (*mesh.shape[:axis], mesh.shape[axis] // largest ** qs.count(largest))
    return replace(mesh, shape=shape)


def with_smaller_meshes(
    search: Search,
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    memory_lambda: float,
    fold: Any,
    flex: Any,
    pinned: Mapping[int, Strategy] | None = None,
    cache: ScoreCache | None = None,
) -> dict[str, Strategy] | None:
    """`search(graph, mesh, ...)`'s plan, or the plan found on `trailing_submesh(mesh)` (padded
    with no cut, polished on `mesh`) when it scores lower on `mesh`; None as `search` says.
    `cache`: a `ScoreCache` of `graph` on `mesh` the scoring shares (else one of its own)."""
    cache = cache if cache is not None else ScoreCache(graph, mesh, opts)
    best = search(graph, mesh, opts, memory_lambda, fold, flex, pinned, cache=cache)
    sub = trailing_submesh(mesh)
    if best is None or sub is None:
        return best
    kept = len(sub.rounds)
    if all(c is None for s in best.values() for c in s[kept:]):
        return best  # those rounds are unused already: the polish settled the rounds before them
    if pinned and any(c is not None for s in pinned.values() for c in s[kept:]):
        return best  # a user-fixed cut in the rounds left out
    weights = fold.round_weights() if fold is not None else None
    best_score = plan_score(graph, mesh, opts, memory_lambda, fold, cache, best)
    if best_score <= unused_floor(graph, sub, opts, 0, weights):
        return best  # the smaller mesh's devices cannot beat it: not searched
    small_pins = {i: s[:kept] for i, s in (pinned or {}).items()}
    small = with_smaller_meshes(search, graph, sub, opts, memory_lambda, fold, flex, small_pins)
    if small is None:
        return best  # the smaller mesh broke the fold's uniform interior: keep this mesh's plan
    pad = (None,) * (len(mesh.rounds) - kept)
    padded = {name: (*s, *pad) for name, s in small.items()}
    args = (graph, mesh, opts, memory_lambda, fold, cache, best, best_score, padded)
    return polished_if_lower(*args, frozen=pinned)
