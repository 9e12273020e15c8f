"""Pipeline chunks in whole layers: even, or Megatron-LM's first / last stages apart.

`chunk_starts` gives the first segment of each model chunk from its layer count. Megatron-LM
says an uneven cut as the first and last stage's layer counts, the other layers going evenly
over the middle stages (`--decoder-first/last-pipeline-num-layers`); with v model chunks per
stage (interleaved 1F1B) each stage's layers split into v equal chunks, so the first, middle
and last counts must each divide by v, and virtual round j runs chunk j of every stage in
stage order (megatron-core `get_transformer_layer_offset`, uneven interleaved branch).
`first_last_layers` picks the (first, middle, last) counts whose heaviest stage has the fewest
FLOPs: O(layers^2 / (stages v^2)) cuts of O(stages v) each.
"""

from __future__ import annotations

import itertools

from shardplan.errors import PlanError
from shardplan.search.step.stages import aligned_starts
from shardplan.search.step.structure import LayerSplit


def chunk_starts(split: LayerSplit, chunks: int, stage_layers: tuple[int, ...] = ()) -> list[int]:
    """The first segment of each of `chunks` chunks: equal layers, or `stage_layers` per chunk
    (the embedding with the first, the head with the last); PlanError when they do not add up."""
    if not stage_layers:
        starts = aligned_starts(split, chunks)
        if starts is None:
            said = f"{chunks} pipeline chunks"
            raise PlanError(f"{split.layers} layers do not split evenly over {said}")
        return starts
    if len(stage_layers) != chunks or sum(stage_layers) != split.layers or min(stage_layers) < 1:
        raise PlanError(
            f"layers per pipeline chunk {list(stage_layers)} must be {chunks} counts of at least "
            f"1 adding up to the model's {split.layers} layers"
        )
    ends = itertools.accumulate(stage_layers[:-1])
    return [0, *(split.layer_start(k) for k in ends)]


def chunk_layers(stage_counts: tuple[int, ...], virtual: int = 1) -> tuple[int, ...]:
    """Layers per model chunk in model order from layers per stage, each stage's split into
    `virtual` equal chunks (chunk c on stage c mod S); PlanError when a count does not divide."""
    if any(count % virtual for count in stage_counts):
        raise PlanError(
            f"layers per pipeline stage {list(stage_counts)} do not split into {virtual} equal "
            "chunks per stage (interleaved 1F1B needs each stage's count divisible by the chunks)"
        )
    return tuple(count // virtual for count in stage_counts) * virtual


def stage_counts(layers: tuple[int, ...], stages: int) -> tuple[int, ...]:
    """Layers per pipeline stage from layers per model chunk (chunk c on stage c mod S)."""
    return tuple(sum(layers[s::stages]) for s in range(stages))


def first_last_layers(
    split: LayerSplit, stages: int, segment_cost: list[float], virtual: int = 1
) -> tuple[int, ...] | None:
    """Megatron-LM's uneven cut of `stages` pipeline stages (`--decoder-first/last-pipeline-num-
    layers`) with `virtual` chunks per stage: k whole layers on each middle stage, the rest on
    the first and last (with the embedding and the head), f, k and l multiples of `virtual`,
    f and l >= `virtual`; the (f, k, l) whose heaviest stage costs least (`segment_cost` per
    segment, FLOPs; a stage's chunks summed); the even cut, where there is one, unless it is
    strictly heavier; then ties to the first in (k, f) order. Layers per stage, or None when no
    cut beats the even one (module docstring)."""
    layers, v = split.layers, virtual
    if stages < 2 or layers < stages * v or layers % v:
        return None
    upto = [0.0, *itertools.accumulate(segment_cost)]

    def heaviest(counts: tuple[int, ...]) -> float:
        starts = chunk_starts(split, stages * v, chunk_layers(counts, v))
        ends = [*starts[1:], len(segment_cost)]
        chunk = [upto[e] - upto[a] for a, e in zip(starts, ends, strict=True)]
        return max(sum(chunk[s::stages]) for s in range(stages))

    even = (layers // stages,) * stages
    best = (heaviest(even), even) if layers % (stages * v) == 0 else None
    middle = stages - 2
    for k in range(v, layers // max(middle, 1) + 1, v) if middle else [0]:
        rest = layers - middle * k
        for f in range(v, rest - v + 1, v):
            counts = (f, *([k] * middle), rest - f)
            cost = heaviest(counts)
            if best is None or cost < best[0] * (1 - 1e-12):
                best = (cost, counts)
    if best is None or len(set(best[1])) == 1:
        return None
    return best[1]


__all__ = ["chunk_layers", "chunk_starts", "first_last_layers", "stage_counts"]
