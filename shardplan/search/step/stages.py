"""Stage partitioning shared by the training-step search and the recipes.

A model is cut into S contiguous stages over whole segments (`ir/segments`: the repeated blocks)
so that the largest stage's FLOPs are least: f[s][j] = min_i max(f[s-1][i], F[j] - F[i]) over
segment prefixes, O(K^2 S), one numpy array over (i, j) per s. Or as Megatron-LM cuts it
(`aligned_starts`): the same number of whole layers per stage (megatron-core's
`get_num_layers_to_build`: num_layers / (pipeline x virtual) each), the segments before the
repeated run with the first stage and those after it with the last. The cut is found on the graph at
the global batch and applied, by segment index, to the graph at the micro-batch size. A stage
runs on the outermost mesh axis divided by S times the other axes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from shardplan.errors import PlanError
from shardplan.ir.graph import Graph
from shardplan.ir.segments import Segment, segments, subgraph
from shardplan.mesh import Mesh
from shardplan.search.step.structure import LayerSplit, layer_split, segment_prints


def stage_mesh(mesh: Mesh, stages: int) -> Mesh:
    """The devices of one stage: the outermost axis divided by the number of stages."""
    shape = (mesh.shape[0] // stages, *mesh.shape[1:])
    return replace(mesh, shape=shape)


def balanced_stages(costs: Sequence[float], stages: int) -> list[int]:
    """Start index of each of `stages` contiguous groups of `costs` minimising the largest
    group's sum (DP over prefixes, see the module docstring). Needs len(costs) >= stages."""
    k = len(costs)
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=float))])
    f = np.full((stages + 1, k + 1), np.inf)
    arg = np.zeros((stages + 1, k + 1), dtype=int)
    f[0, 0] = 0.0
    span = prefix[None, :] - prefix[:, None]  # span[i, j]: the sum of costs[i:j]
    below = np.tril(np.ones((k + 1, k + 1), dtype=bool))  # i >= j: no group, never chosen
    for s in range(1, stages + 1):
        # vals[i, j] = max(f[s-1, i], span[i, j]) over i in [s - 1, j); argmin keeps the first i
        vals = np.maximum(f[s - 1][:, None], span)
        vals[below] = np.inf
        vals[: s - 1] = np.inf
        best = np.argmin(vals[:, s:], axis=0)
        f[s, s:] = vals[best, np.arange(s, k + 1)]
        arg[s, s:] = best
    starts, j = [], k
    for s in range(stages, 0, -1):
        j = int(arg[s, j])
        starts.append(j)
    return starts[::-1]


def aligned_starts(split: LayerSplit, stages: int) -> list[int] | None:
    """The first segment of each of `stages` chunks of equal whole layers of the model's
    repeated run `split` (module docstring); None when the layers do not divide evenly."""
    if stages == 1:
        return [0]
    if stages > split.layers or split.layers % stages:
        return None
    per = split.layers // stages
    return [0, *(split.layer_start(s * per) for s in range(1, stages))]


def megatron_starts(
    probe: Graph,
    chunks: int,
    segs: Sequence[Segment] | None = None,
    split: LayerSplit | None = None,
) -> list[int]:
    """The first segment of each chunk as Megatron-LM cuts the model (`aligned_starts`),
    FLOP-balanced (`stage_starts`) when its layers do not divide evenly; `segs` and `split`:
    the probe's segments and layer split when known."""
    segs = segments(probe) if segs is None else segs
    split = layer_split(segment_prints(probe, segs)) if split is None else split
    return aligned_starts(split, chunks) or stage_starts(probe, chunks, segs)


def tokens_per_sample(graph: Graph, batch: int) -> int:
    """Tokens per sample: the second dim of the first rank-2 graph input of leading dim `batch`
    (token ids), else 1 (then tokens/s equals samples/s)."""
    for t in graph.tensors.values():
        if t.role.value == "input" and len(t.shape) == 2 and t.shape[0] == batch:
            return t.shape[1]
    return 1


def segment_flops(graph: Graph, segs: Sequence[Segment]) -> list[float]:
    """FLOPs of each segment of `graph`."""
    return [sum(op.flops for op in graph.ops[s.start : s.stop]) for s in segs]


def stage_starts(probe: Graph, stages: int, segs: Sequence[Segment] | None = None) -> list[int]:
    """The first segment of each of `stages` FLOP-balanced stages of `probe` (module docstring;
    `segs`: its segments when known); PlanError when the model has fewer segments than stages."""
    segs = segments(probe) if segs is None else segs
    if stages < 1 or len(segs) < stages:
        raise PlanError(
            f"{stages} pipeline stages need at least as many segments (repeated blocks); "
            f"{probe.name!r} has {len(segs)}: use at most {len(segs)} stages"
        )
    return balanced_stages(segment_flops(probe, segs), stages)


def stage_graphs(graph: Graph, starts: Sequence[int]) -> list[Graph]:
    """The stage sub-graphs of `graph` (at the micro-batch size) cut at segments `starts`."""
    gsegs = segments(graph)
    bounds = [gsegs[i].start for i in starts] + [len(graph.ops)]
    return [
        subgraph(graph, bounds[s], bounds[s + 1], f"{graph.name}.stage{s}")
        for s in range(len(starts))
    ]
