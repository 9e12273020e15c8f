"""The training step: SPMD stage plans priced with micro-batches, recomputation, ZeRO, sequence
and context parallelism, and (interleaved) 1F1B.

Input: per pipeline stage (per model chunk when interleaved), the evaluator's terms of its SPMD
plan at the micro-batch size (`profile_stage`), and the levers. Per stage s and micro-batch
(F = forward compute, the ops' forward rooflines (`cost.work.forward_compute`); B the backward
compute, each op's own backward (`cost.backward`: a GEMM's twice its forward FLOPs, an
element-wise op's the bytes its backward moves); c_f / c_b the forward / backward collectives,
c_b less what runs under the weight-gradient GEMMs (`cost.overlap`); z_f / z_b / z_step ZeRO's,
`cost.zero.zero_steps`):
  fwd_s = F + c_f + z_f            (ZeRO-3: all-gather of the parameters)
  bwd_s = B + c_b + recompute + z_b (ZeRO-2: reduce-scatter of gradients; ZeRO-3: all-gather
          again + reduce-scatter)
  recompute: none 0; selective: the forward of the ops whose results are larger than any
  parameter op's result in their segment (attention scores, softmax); full: F + c_f (one more
  forward of the stage).
Sequence parallelism (`cost.sequence`) takes F, B, the activations and the gradient sync of the
plan's sequence-split layout, the collectives of the tensor-parallel plan (forward: the
reduce-scatter + all-gather move what the all-reduce did; backward: `cost.overlap`); context
parallelism replaces the plan's activation all-gathers by the K/V ring's exposed part
(`cost.sequence.ring_terms`).
1F1B over S stages and m micro-batches (Narayanan et al., SC'21), v model chunks per device
(`cost.pipeline`): slot = max_s(fwd_s + bwd_s) + 2 v p2p; pipeline = (m + (S - 1)/v) slot, of
which the bubble (S - 1)/v slot. Then once per step: the data-parallel gradient sync (ZeRO-0:
the evaluator's all-reduce; ZeRO 1-2: z_step), the all-reduce of parameters shared by two
stages (a tied embedding) and the optimizer step (the slowest device's update bytes over its
HBM bandwidth, `cost.zero.update_bytes`; ZeRO 1-3 update a 1/ways shard).
What the engine overlaps beyond that is on the levers (`cost.levers.Levers`, all off by default:
every term above added): the gradient sync bucket by bucket under the last micro-batch's
backward, ZeRO-3's gathers prefetched under the previous unit's compute, the pipeline sends
under a chunk's compute; each leaves exposed(c, w, k) = max(c/k, c - w (k - 1)/k) of a
collective c in k pieces under a window w (`cost.overlap`), the rest is reported as hidden.
Memory of stage s: parameter state (ZeRO z: `cost.zero.zero_steps`, the plain plan's formulas),
plus its in-flight micro-batches of kept activations (1F1B: min(S - s, m); interleaved: the
warm-up count of `cost.pipeline.interleaved_in_flight`) and the block being rebuilt during
backward under recomputation. Kept activations are what the ops' backward reads
(`ir.traits.SAVED_FOR_BACKWARD`), each tensor once in its producer's layout; full recomputation
keeps each repeated block's input (`block_starts`). Everything is a closed-form sum over the
stage's ops: O(stages x ops).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardplan.cost.evaluate import CostBreakdown, ScoreCache, evaluate_strategies
from shardplan.cost.kept import KeptItem, kept_items, made_at, saved_bytes
from shardplan.cost.levers import Levers, Recompute, StageCost, StepCost
from shardplan.cost.overlap import (
    exposed_backward,
    p2p_exposed,
    tensor_overlap_exposed,
    zero_exposed,
)
from shardplan.cost.pipeline import (
    Pipeline,
    interleaved_bubble_slots,
    interleaved_in_flight,
)
from shardplan.cost.presets import CostOptions
from shardplan.cost.price import OpPrice
from shardplan.cost.sequence import ring_terms, sequence_parallel_strategies, tensor_rounds
from shardplan.cost.zero import (
    ZeroParam,
    ZeroStep,
    gradient_elements,
    param_reads,
    update_bytes,
    zero_params,
    zero_steps,
)
from shardplan.errors import PlanError
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role
from shardplan.ir.segments import Segment, segments
from shardplan.mesh import Mesh, Round
from shardplan.sharding import Layout, Strategy


@dataclass(frozen=True, slots=True)
class StageProfile:
    """What one stage's SPMD plan costs per micro-batch (seconds, bytes per device)."""

    fwd_compute_s: float
    bwd_compute_s: float
    fwd_comm_s: float
    bwd_comm_s: float
    grad_sync_s: float
    activation_bytes: float
    input_bytes: float
    selective_bytes: float
    selective_peak_bytes: float
    selective_s: float
    selective_flops: float
    checkpoint_bytes: float
    segment_peak_bytes: float
    param_bytes: float
    zero: tuple[ZeroStep, ...]
    """ZeRO stages 1, 2, 3 of this stage's parameters (`cost.zero.zero_steps`)."""
    update_s: float
    """The optimizer step's seconds without ZeRO (`cost.zero.update_bytes` over the HBM
    bandwidth)."""
    update_sharded_s: float
    """... and with ZeRO 1-3 (each device updates its shard)."""
    flops: float
    breakdown: CostBreakdown
    sequence_parallel: bool = False
    context_parallel: bool = False
    grad_elements: float = 0.0
    """Gradient elements one device holds (each parameter needing one, in its home layout):
    what the data-parallel sync moves, cut into buckets (`cost.overlap.zero_exposed`)."""
    blocks: float = 1.0
    """Repeated blocks of the stage (`block_starts`): the units ZeRO-3 gathers one by one."""
    tp_overlap_fwd_comm_s: float = math.nan
    """`fwd_comm_s` under the `tp_comm_overlap` lever (`cost.overlap.tensor_overlap_exposed`;
    NaN: not profiled, a profile without sequence parallelism)."""
    tp_overlap_bwd_comm_s: float = math.nan
    """... and `bwd_comm_s`."""


def profile_stage(
    graph: Graph,
    mesh: Mesh,
    strategies: Mapping[str, Strategy],
    opts: CostOptions,
    param_layouts: Mapping[str, Layout] | None = None,
    sequence_parallel: bool = False,
    context_parallel: bool = False,
    cache: ScoreCache | None = None,
    plain: CostBreakdown | None = None,
) -> StageProfile:
    """Read one stage's per-micro-batch terms off the evaluator (see the module docstring).

    `sequence_parallel`: compute, activations, gradient sync and ZeRO of the plan's sequence-
    parallel layout (`cost.sequence`), collectives of the tensor-parallel plan (the reduce-scatter
    + all-gather pair moves what the all-reduce did). `cache` (of graph, mesh, opts) and `plain`
    (`strategies`' own evaluation) let a plan's plain and SP profiles share prices: same result."""
    if not opts.train:
        raise PlanError("the training-step model needs training options (train=True)")
    cache = cache or ScoreCache(graph, mesh, opts)  # evaluations and forward share op prices
    cost = plain = plain or evaluate_strategies(graph, mesh, strategies, opts, param_layouts, cache)
    stored = strategies
    if sequence_parallel:  # the tensor-parallel rounds read once for the layout and the overlap
        tp_rounds = tensor_rounds(graph, mesh, strategies, cache)
        strategies = sequence_parallel_strategies(graph, mesh, strategies, cache, tp_rounds)
        cost = evaluate_strategies(graph, mesh, strategies, opts, param_layouts, cache)
    rounds = mesh.rounds
    prices = [
        cache.price(op, cid, tuple(strategies[op.name]))
        for op, cid in zip(graph.ops, cache.classes, strict=True)
    ]
    op_compute = {op.name: p.forward for op, p in zip(graph.ops, prices, strict=True)}
    fwd = sum(op_compute.values())
    c = plain.comm
    fwd_comm = c.intra_fwd + c.redistribution_fwd
    exposed = exposed_backward(graph, plain.ops, op_compute, sequence_parallel)
    bwd_comm = exposed + c.redistribution_bwd + c.halo
    tp_fwd = tp_bwd = math.nan
    if sequence_parallel:
        tp_fwd, tp_bwd = _tp_overlap_comm(graph, mesh, tp_rounds, plain, op_compute)
    if context_parallel:  # the exchange's exposed part replaces its all-gather terms
        ring = ring_terms(graph, mesh, stored, opts, cache)
        fwd_comm += ring.exposed_fwd_s - ring.gather_s
        bwd_comm += ring.exposed_bwd_s - ring.scatter_s
        tp_fwd += ring.exposed_fwd_s - ring.gather_s
        tp_bwd += ring.exposed_bwd_s - ring.scatter_s
    act = _activations(graph, prices, rounds, opts, op_compute, cache)
    params = _zero_params(graph, rounds, strategies, opts, prices, cache)
    update = _update_seconds(graph, mesh, strategies, opts, params, _zero_memo(cache))
    return StageProfile(
        fwd_compute_s=fwd,
        bwd_compute_s=cost.compute - fwd,
        # sums with shared-gradient credits can cancel to -1e-18: collectives take >= 0 s
        fwd_comm_s=max(0.0, fwd_comm),
        bwd_comm_s=max(0.0, bwd_comm),
        grad_sync_s=max(0.0, cost.comm.grad_sync),
        activation_bytes=act.saved,
        input_bytes=act.inputs,
        selective_bytes=act.selective,
        selective_peak_bytes=act.selective_peak,
        selective_s=act.selective_s,
        selective_flops=act.selective_flops,
        checkpoint_bytes=act.checkpoints,
        segment_peak_bytes=act.segment_peak,
        param_bytes=cost.param_memory,
        zero=zero_steps(graph, rounds, strategies, opts, params, cache.table.zero),
        update_s=update[0],
        update_sharded_s=update[1],
        flops=graph.flops,
        breakdown=plain,
        sequence_parallel=sequence_parallel,
        context_parallel=context_parallel,
        grad_elements=gradient_elements(graph, rounds, params, _zero_memo(cache)),
        blocks=act.blocks,
        tp_overlap_fwd_comm_s=tp_fwd if math.isnan(tp_fwd) else max(0.0, tp_fwd),
        tp_overlap_bwd_comm_s=tp_bwd if math.isnan(tp_bwd) else max(0.0, tp_bwd),
    )


def _zero_params(
    graph: Graph,
    rounds: Sequence[Round],
    strategies: Mapping[str, Strategy],
    opts: CostOptions,
    prices: Sequence[OpPrice],
    cache: ScoreCache,
) -> dict[str, ZeroParam]:
    """`zero_params` of the stage's plan, its parameter reads and memo kept in `cache` (the
    graph's alone, under one mesh's rounds: shared by every plan profiled there)."""
    reads = cache.memo.get("param reads")
    if reads is None:
        reads = cache.memo["param reads"] = param_reads(graph)
    inputs = [p.inputs for p in prices]
    return zero_params(graph, rounds, strategies, opts.train, inputs, reads, _zero_memo(cache))


def _zero_memo(cache: ScoreCache) -> dict[tuple[object, ...], Any]:
    """The memo `cost.zero` keeps in `cache` across the plans of its graph (shards, cut rounds,
    per-parameter counts and update bytes: one graph, rounds and options)."""
    return cache.memo.setdefault("zero params", {})  # type: ignore[no-any-return]


def _tp_overlap_comm(
    graph: Graph,
    mesh: Mesh,
    rounds: Sequence[int],
    plain: CostBreakdown,
    op_compute: Mapping[str, float],
) -> tuple[float, float]:
    """The profile's forward and backward collectives under `tp_comm_overlap` (cost.overlap);
    `rounds`: the plan's tensor-parallel rounds (`cost.sequence.tensor_rounds`)."""
    ways = math.prod(mesh.rounds[r].q for r in rounds)
    fwd, bwd = tensor_overlap_exposed(graph, plain.ops, op_compute, ways)
    c = plain.comm
    return fwd + c.redistribution_fwd, bwd + c.redistribution_bwd + c.halo


def _update_seconds(
    graph: Graph,
    mesh: Mesh,
    strategies: Mapping[str, Strategy],
    opts: CostOptions,
    params: Mapping[str, ZeroParam],
    memo: dict[tuple[object, ...], Any] | None = None,
) -> tuple[float, float]:
    """The optimizer step is element-wise: its bytes at the machine's achieved HBM bandwidth
    (the roofline's memory side; a machine without an HBM rate prices none); `memo`:
    `update_bytes`'."""
    m = mesh.hardware
    if opts.preset.symbolic or m is None:
        return 0.0, 0.0
    rate = m.hbm_bytes_per_s * m.hbm_efficiency
    plain, sharded = update_bytes(graph, mesh.rounds, strategies, opts, params, memo)
    return plain / rate, sharded / rate


@dataclass(frozen=True, slots=True)
class _Activations:
    saved: float
    inputs: float
    selective: float
    selective_peak: float
    selective_s: float
    selective_flops: float
    checkpoints: float
    segment_peak: float
    blocks: int


def block_starts(
    graph: Graph, segs: Sequence[Segment], classes: Sequence[int] | None = None
) -> list[int]:
    """The segments full recomputation checkpoints: the first of each repeated block. Segments of
    equal structure repeat; the most frequent structure (the first of them on a tie) opens each
    block (a transformer layer's attention half), and a segment whose structure occurs once (an
    embedding, a head) is a block of its own; without repetition every segment is one. A
    repeating half is never a block of its own, so a chunk cut mid-layer still checkpoints once
    per layer (Megatron-LM's uniform method, one layer per checkpoint).
    O(ops); `classes` (a `ScoreCache`'s: equal kind and signature) spell each class once."""
    text: dict[int, tuple[str, str]] = {}
    ops = graph.ops
    if classes is None:
        prints = [
            tuple((op.kind, op.signature.text()) for op in ops[s.start : s.stop]) for s in segs
        ]
    else:
        for op, cid in zip(ops, classes, strict=True):
            if cid not in text:
                text[cid] = (op.kind, op.signature.text())
        prints = [tuple(text[classes[i]] for i in range(s.start, s.stop)) for s in segs]
    counts: dict[tuple[object, ...], int] = {}
    for fp in prints:
        counts[fp] = counts.get(fp, 0) + 1
    top = max(counts.values())
    opener = next(fp for fp in prints if counts[fp] == top)
    return [k for k, fp in enumerate(prints) if k == 0 or fp == opener or counts[fp] == 1 < top]


def stage_blocks(graph: Graph, cache: ScoreCache) -> tuple[Any, list[int], list[Any]]:
    """`graph`'s segments, the first segment of each block full recomputation checkpoints
    (`block_starts`) and what selective recomputation drops per segment (`selective_drops`):
    the graph's alone, whatever the strategies, kept in `cache` (a `ScoreCache` of `graph`)."""
    if "blocks" not in cache.memo:
        segs = segments(graph)
        drops = [selective_drops(graph, graph.ops[seg.start : seg.stop]) for seg in segs]
        cache.memo["blocks"] = (segs, block_starts(graph, segs, cache.classes), drops)
    return cache.memo["blocks"]  # type: ignore[no-any-return]


def selective_drops(graph: Graph, ops: Sequence[Op]) -> list[tuple[Op, str]]:
    """What selective recomputation drops in one segment's `ops`: (op, result) for results
    larger than the widest result of an op reading a parameter (attention scores, softmax);
    none in a segment without such an op."""
    widest = max(
        (
            graph.tensors[n].numel
            for op in ops
            if any(graph.tensors[t].role is Role.PARAMETER for t in op.inputs)
            for n in op.outputs
        ),
        default=None,
    )
    if widest is None:
        return []
    return [(op, n) for op in ops for n in op.outputs if graph.tensors[n].numel > widest]


def _kept_facts(
    graph: Graph, cache: ScoreCache
) -> tuple[tuple[KeptItem, ...], list[tuple[str, int, int]], list[tuple[tuple[str, str], ...]]]:
    """The graph's alone, kept in `cache`: its kept tensors (`kept_items`); each full-
    recomputation checkpoint with its (producer, result position); per block, the (result,
    its mask's key) pairs of its results (the next checkpoint left out) that something keeps."""
    found = cache.memo.get("kept facts")
    if found is None:
        items = kept_items(graph)
        keys = {item.key for item in items}
        segs, starts, _ = stage_blocks(graph, cache)
        entries = [(e, graph.producer[e], made_at(graph, e)[1])
                   for e in (segs[k].entry for k in starts) if e is not None]  # fmt: skip
        blocks = []
        for a, b in zip(starts, [*starts[1:], len(segs)], strict=True):
            exit_ = segs[b].entry if b < len(segs) else None  # kept as the next checkpoint
            names = [n for op in graph.ops[segs[a].start : segs[b - 1].stop] for n in op.outputs]
            blocks.append(tuple((n, f"{n}:mask") for n in names
                                if n != exit_ and (n in keys or f"{n}:mask" in keys)))  # fmt: skip
        found = cache.memo["kept facts"] = (items, entries, blocks)
    return found  # type: ignore[no-any-return]


def _activations(
    graph: Graph,
    prices: Sequence[OpPrice],
    rounds: Sequence[Round],
    opts: CostOptions,
    op_compute: Mapping[str, float],
    cache: ScoreCache,
) -> _Activations:
    """Kept activations per micro-batch under each recomputation choice (module docstring);
    `prices`: each op's `OpPrice` under the stage's strategies, `cache` the `ScoreCache` that
    priced them (local bytes, op classes)."""
    size = cache.local_bytes
    layouts = [(p.inputs, p.resolved) for p in prices]
    items, entries, blocks = _kept_facts(graph, cache)
    saved = saved_bytes(graph, {}, rounds, opts, layouts, size, items)

    def kept(name: str) -> float:
        return saved.get(name, 0.0) + saved.get(f"{name}:mask", 0.0)

    if "first_reads" not in cache.memo:  # each graph input's first reader: the graph's alone
        cache.memo["first_reads"] = [
            (index, i, name)
            for index, op in enumerate(graph.ops)
            for i, name in enumerate(op.inputs)
            if graph.tensors[name].role is Role.INPUT and graph.consumers[name][0][0] == index
        ]
    # a stage's inputs stay for its backward whatever is recomputed
    reads = cache.memo["first_reads"]
    inputs = sum((size(name, prices[index].inputs[i]) for index, i, name in reads), 0.0)
    sel_bytes = sel_peak = sel_s = sel_flops = 0.0
    drops = stage_blocks(graph, cache)[2]
    ckpt = sum(size(e, layouts[index][1][k]) for e, index, k in entries)
    seg_peak = 0.0
    for block in blocks:  # each block's results kept, the next checkpoint left out
        seg_peak = max(seg_peak, sum(saved.get(n, 0.0) + saved.get(m, 0.0) for n, m in block))
    for dropped in drops:
        seg_bytes = sum(kept(n) for _, n in dropped)
        sel_bytes += seg_bytes
        sel_peak = max(sel_peak, seg_bytes)
        producers = {op.name: op for op, _ in dropped}.values()
        sel_s += sum(op_compute[op.name] for op in producers)
        sel_flops += sum(op.flops for op in producers)
    return _Activations(
        sum(saved.values()),
        inputs,
        sel_bytes,
        sel_peak,
        sel_s,
        sel_flops,
        ckpt,
        seg_peak,
        len(blocks),
    )


def stage_cost(p: StageProfile, levers: Levers, micro_batches: int, in_flight: float) -> StageCost:
    """Price one stage (see the module docstring)."""
    for name in ("sequence_parallel", "context_parallel"):
        if getattr(p, name) != getattr(levers, name):
            raise PlanError(
                f"levers ask for {name}={getattr(levers, name)} on a stage profiled with "
                f"{name}={getattr(p, name)}; profile_stage(..., {name}=...) must match"
            )
    fwd_comm, bwd_comm = p.fwd_comm_s, p.bwd_comm_s
    if levers.tp_comm_overlap:
        if not levers.sequence_parallel or math.isnan(p.tp_overlap_fwd_comm_s):
            raise PlanError(
                "tp_comm_overlap overlaps sequence parallelism's all-gathers and reduce-scatters "
                "with their GEMMs (megatron-core requires --sequence-parallel for it): turn "
                "sequence_parallel on (and profile the stage with it) or tp_comm_overlap off"
            )
        fwd_comm, bwd_comm = p.tp_overlap_fwd_comm_s, p.tp_overlap_bwd_comm_s
    z = levers.zero  # ZeRO's collectives and state split: cost/zero.py alone prices them
    param_bytes = p.param_bytes if z == 0 else p.zero[z - 1].param_bytes
    update = p.update_s if z == 0 else p.update_sharded_s
    if levers.recompute is Recompute.FULL:
        recompute = p.fwd_compute_s + fwd_comm
        kept, rebuilt = p.checkpoint_bytes + p.input_bytes, p.segment_peak_bytes
    elif levers.recompute is Recompute.SELECTIVE:
        recompute = p.selective_s
        kept, rebuilt = p.activation_bytes - p.selective_bytes, p.selective_peak_bytes
    else:
        recompute, kept, rebuilt = 0.0, p.activation_bytes, 0.0
    zt = zero_exposed(p, levers, recompute)  # what the engine's overlap leaves (cost.overlap)
    zfwd, zbwd, sync = zt.fwd_s, zt.bwd_s, zt.sync_s
    per_mb = zfwd + zbwd
    fwd = p.fwd_compute_s + fwd_comm + zfwd
    bwd = p.bwd_compute_s + bwd_comm + recompute + zbwd
    return StageCost(
        fwd_s=fwd,
        bwd_s=bwd,
        recompute_s=recompute,
        zero_per_micro_batch_s=per_mb,
        comm_s=fwd_comm + bwd_comm + per_mb,
        sync_s=sync,
        param_bytes=param_bytes,
        activation_bytes=in_flight * kept + rebuilt,
        in_flight=in_flight,
        kept_bytes=kept,
        rebuilt_bytes=rebuilt,
        optimizer_s=update,
        sync_hidden_s=zt.sync_hidden_s,
        zero_hidden_s=zt.hidden_per_micro_batch_s,
    )


def _device_cost(chunks: Sequence[StageCost], in_flight: float) -> StageCost:
    """One device's v model chunks as one stage: times, syncs and state add up; it holds
    `in_flight` stage-equivalents of the chunks' kept activations and one chunk's rebuild."""
    kept = sum(c.kept_bytes for c in chunks)
    rebuilt = max(c.rebuilt_bytes for c in chunks)
    return StageCost(
        fwd_s=sum(c.fwd_s for c in chunks),
        bwd_s=sum(c.bwd_s for c in chunks),
        recompute_s=sum(c.recompute_s for c in chunks),
        zero_per_micro_batch_s=sum(c.zero_per_micro_batch_s for c in chunks),
        comm_s=sum(c.comm_s for c in chunks),
        sync_s=sum(c.sync_s for c in chunks),
        param_bytes=sum(c.param_bytes for c in chunks),
        activation_bytes=in_flight * kept + rebuilt,
        in_flight=in_flight,
        kept_bytes=kept,
        rebuilt_bytes=rebuilt,
        optimizer_s=sum(c.optimizer_s for c in chunks),
        sync_hidden_s=sum(c.sync_hidden_s for c in chunks),
        zero_hidden_s=sum(c.zero_hidden_s for c in chunks),
    )


def _device_costs(
    profiles: Sequence[StageProfile],
    levers: Sequence[Levers],
    m: int,
    n_stages: int,
    v: int,
) -> tuple[StageCost, ...]:
    """Each device's cost: its stage, or (v > 1) its chunks d, d + S, ... as one stage; chunks
    sharing one profile and lever are priced once."""
    priced: dict[tuple[int, int, float], StageCost] = {}

    def cost(c: int, in_flight: float) -> StageCost:
        key = (id(profiles[c]), id(levers[c]), in_flight)
        if key not in priced:
            priced[key] = stage_cost(profiles[c], levers[c], m, in_flight)
        return priced[key]

    if v == 1:
        return tuple(cost(s, min(n_stages - s, m)) for s in range(len(profiles)))
    return tuple(  # their times add, their activations interleave
        _device_cost(
            [cost(c, 1) for c in range(d, len(profiles), n_stages)],
            interleaved_in_flight(d, n_stages, m, v),
        )
        for d in range(n_stages)
    )


def step_cost(
    profiles: Sequence[StageProfile],
    levers: Sequence[Levers],
    micro_batches: int,
    pipe: Pipeline,
) -> StepCost:
    """1F1B step time, throughput and memory of `profiles` under `levers` (module docstring)."""
    v, m = pipe.virtual_stages, micro_batches
    chunks = len(profiles)
    if v < 1 or chunks % v:
        raise PlanError(
            f"step model: {chunks} model chunks are not {v} chunks per device on each stage; "
            "give S x v chunk profiles (v >= 1)"
        )
    n_stages = chunks // v
    if m < 1 or len(levers) != chunks or len(pipe.p2p_bytes) != chunks - 1:
        raise PlanError(
            f"step model: {chunks} stages need {chunks} levers and {chunks - 1} "
            f"boundaries and m >= 1 (got {len(levers)}, {len(pipe.p2p_bytes)}, m={m})"
        )
    stages = _device_costs(profiles, levers, m, n_stages, v)
    p2p = max((b / pipe.bandwidth_bytes_per_s for b in pipe.p2p_bytes), default=0.0)
    # each micro-batch crosses v boundaries per device and direction (Narayanan et al. §2.2.2)
    sends = 2 * v * p2p
    if all(lv.overlap_p2p for lv in levers):  # under the slowest device's chunks (cost.overlap)
        top = max(stages, key=lambda s: s.fwd_s + s.bwd_s)
        sends = p2p_exposed(p2p, v, top.fwd_s, top.bwd_s)
    slot = max(s.fwd_s + s.bwd_s for s in stages) + sends
    bubble_slots = interleaved_bubble_slots(n_stages, v)
    pipeline = (m + bubble_slots) * slot
    sync = max(s.sync_s for s in stages) + pipe.shared_sync_s
    unhidden = max(s.sync_s + s.sync_hidden_s for s in stages) + pipe.shared_sync_s
    p2p_hidden = (m + bubble_slots) * (2 * v * p2p - sends)  # 0.0 without the overlap
    optimizer = max(s.optimizer_s for s in stages)
    step = pipeline + sync + optimizer
    model_flops = pipe.training_flops_factor * m * sum(p.flops for p in profiles)
    recompute_flops = m * sum(
        p.flops
        if lv.recompute is Recompute.FULL
        else p.selective_flops
        if lv.recompute is Recompute.SELECTIVE
        else 0.0
        for p, lv in zip(profiles, levers, strict=True)
    )
    hardware = model_flops + recompute_flops
    per_device = model_flops / step / pipe.devices
    return StepCost(
        step_s=step,
        pipeline_s=pipeline,
        bubble_s=bubble_slots * slot,
        p2p_s=(m + bubble_slots) * 2 * v * p2p - p2p_hidden,
        sync_s=sync,
        recompute_s=m * max(s.recompute_s for s in stages),
        micro_batches=m,
        stages=stages,
        samples_per_s=pipe.batch / step,
        tokens_per_s=pipe.batch * pipe.tokens_per_sample / step,
        model_flops=model_flops,
        hardware_flops=hardware,
        tflops_per_device=per_device / 1e12,
        hardware_tflops_per_device=hardware / step / pipe.devices / 1e12,
        peak_fraction=per_device / pipe.peak_flops_per_s,
        optimizer_s=optimizer,
        sync_hidden_s=unhidden - sync if any(s.sync_hidden_s for s in stages) else 0.0,
        p2p_hidden_s=p2p_hidden,
        zero_hidden_s=m * max(s.zero_hidden_s for s in stages),
    )
