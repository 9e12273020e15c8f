"""What a pipeline adds beyond its stages: boundary sends, shared-parameter sync, the schedule.

Point-to-point: each boundary activation crosses from the stage that produces it to every later
stage that reads it, sent sharded over the stage's devices (numel x width / devices per stage),
once per micro-batch in each direction (activation forward, its gradient backward). Parameters
held by several stages (a tied embedding) all-reduce their gradient over those stages' copies
once per step: a ring all-reduce of the per-device share over the holders (`collectives`).
Interleaved 1F1B (Narayanan et al., SC'21 §2.2.2) with v model chunks per device: the bubble is
(S - 1) / v slots of a whole stage's forward + backward, and each micro-batch crosses v x as many
device boundaries. O(stages x tensors).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardplan.cost import collectives as coll
from shardplan.cost.presets import CostOptions
from shardplan.ir.graph import Graph
from shardplan.ir.op import Role


@dataclass(frozen=True, slots=True)
class Pipeline:
    """What the step needs beyond the stages: per-device bytes sent between consecutive stages
    (per micro-batch, each direction), the pipeline link, shared-parameter sync, the totals, the
    preset's training-FLOPs factor (forward + backward FLOPs over forward FLOPs) and v, the model
    chunks per device of the interleaved schedule (1: plain 1F1B)."""

    p2p_bytes: tuple[float, ...]
    bandwidth_bytes_per_s: float
    shared_sync_s: float
    devices: int
    batch: int
    tokens_per_sample: int
    peak_flops_per_s: float
    training_flops_factor: float
    virtual_stages: int = 1


def boundary_bytes(
    graphs: Sequence[Graph], opts: Sequence[CostOptions], devices_per_stage: int
) -> tuple[float, ...]:
    """Per-device bytes crossing each of the len(graphs) - 1 stage boundaries per micro-batch."""
    produced: dict[str, int] = {}
    for s, g in enumerate(graphs):
        for op in g.ops:
            for t in op.outputs:
                produced[t] = s
    p2p = [0.0] * (len(graphs) - 1)
    for s, (g, o) in enumerate(zip(graphs, opts, strict=True)):
        for name, t in g.tensors.items():
            src = produced.get(name)
            if t.role is Role.INPUT and src is not None and src < s:
                nbytes = t.numel * o.element_bytes(t) / devices_per_stage  # sent sharded
                for b in range(src, s):
                    p2p[b] += nbytes
    return tuple(p2p)


def shared_sync_s(
    graphs: Sequence[Graph], opts: Sequence[CostOptions], devices_per_stage: int, bandwidth: float
) -> float:
    """Seconds of the per-step all-reduces of parameters held by several stages."""
    holders: dict[str, list[int]] = {}
    for s, g in enumerate(graphs):
        for t in g.parameters:
            holders.setdefault(t.name, []).append(s)
    shared = 0.0
    for name, where in holders.items():
        if len(where) > 1:
            t = graphs[where[0]].tensors[name]
            nbytes = t.numel * opts[where[0]].element_bytes(t) / devices_per_stage
            shared += coll.all_reduce_s(nbytes, len(where), bandwidth)
    return shared


def cut_terms(
    graph: Graph, bounds: Sequence[int], opts: CostOptions, devices_per_stage: int, bandwidth: float
) -> tuple[tuple[float, ...], float]:
    """`boundary_bytes` and `shared_sync_s` of the stages ops[bounds[s]:bounds[s + 1]] of one
    graph, read off it directly (no stage sub-graphs): equal to them on `stage_graphs`. O(ops)."""
    stage_of = [0] * len(graph.ops)
    for s in range(len(bounds) - 1):
        stage_of[bounds[s] : bounds[s + 1]] = [s] * (bounds[s + 1] - bounds[s])
    p2p = [0.0] * (len(bounds) - 2)
    holders: dict[str, set[int]] = {}
    seen: set[tuple[str, int]] = set()
    for i, op in enumerate(graph.ops):
        s = stage_of[i]
        for name in op.inputs:
            t = graph.tensors[name]
            if t.role is Role.PARAMETER:
                holders.setdefault(name, set()).add(s)
                continue
            src = graph.producer.get(name)
            if src is None or stage_of[src] >= s or (name, s) in seen:
                continue
            seen.add((name, s))
            # an activation here; the stage receiving it prices it alike (`Tensor.received`)
            nbytes = t.numel * opts.element_bytes(t) / devices_per_stage  # sent sharded
            for b in range(stage_of[src], s):
                p2p[b] += nbytes
    shared = 0.0
    for name, where in holders.items():
        if len(where) > 1:
            t = graph.tensors[name]
            nbytes = t.numel * opts.element_bytes(t) / devices_per_stage
            shared += coll.all_reduce_s(nbytes, len(where), bandwidth)
    return tuple(p2p), shared


def interleaved_bubble_slots(stages: int, virtual_stages: int) -> float:
    """Idle slots of (interleaved) 1F1B, in units of one stage's forward + backward of a micro-
    batch: (S - 1) / v (Narayanan et al. §2.2.2; v = 1 is plain 1F1B)."""
    return (stages - 1) / virtual_stages


def interleaved_in_flight(
    stage: int, stages: int, micro_batches: int, virtual_stages: int
) -> float:
    """Micro-batches of whole-stage activations stage `stage` holds at its peak.

    Plain 1F1B (v = 1): min(S - s, m) (the warm-up forwards before its first backward).
    Interleaved: stage s runs (S - s - 1) x 2 + (v - 1) x S chunk forwards of warm-up plus the
    one before its first backward (Megatron-LM's `get_num_warmup_microbatches`, interleaved
    branch), each a 1/v slice of the stage, so it keeps (2 (S - s - 1) + (v - 1) S + 1) / v
    stage-equivalents, i.e. about S (1 + (S - 1)/(v S)) on the first stage (Korthikanti et al.
    §4.2.3), capped at all m v chunks."""
    if virtual_stages == 1:
        return min(stages - stage, micro_batches)
    chunks = 2 * (stages - stage - 1) + (virtual_stages - 1) * stages + 1
    return min(chunks, micro_batches * virtual_stages) / virtual_stages


__all__ = [
    "Pipeline",
    "boundary_bytes",
    "interleaved_bubble_slots",
    "interleaved_in_flight",
    "shared_sync_s",
]
