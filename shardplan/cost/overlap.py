"""Tensor-parallel collectives of the backward that run under the weight-gradient GEMMs.

Megatron-LM's column-parallel linear (megatron/core/tensor_parallel/layers.py,
`LinearWithGradAccumulationAndAsyncCommunication.backward`; on by default, Megatron-LM's
`--no-async-tensor-model-parallel-allreduce` turned it off) computes the input gradient
dX = dY W, starts its all-reduce over the tensor-parallel group asynchronously and computes the
weight gradient dW = dY^T X while it runs; under sequence parallelism it re-gathers
the input asynchronously while computing dX, and reduce-scatters dX while computing dW. The
row-parallel linear's forward reduce-scatter becomes, in the backward, an all-gather of the
result's gradient that nothing hides.

So, per op `o` of a stage plan with its own backward collective c = intra_bwd(o) (an op whose
input gradient is reduced: the column-parallel linear), where o has a weight-gradient GEMM (a
parameter that needs a gradient and a REDUCE loop dim: a contraction):
  window(o) = sum of the forward compute of the readers of o's activation input that have a
    weight-gradient GEMM (dW and dX each have the forward's multiply-adds; one fused QKV GEMM
    in Megatron-LM is three such readers here)
  exposed(o) = max(0, c - window(o))                                   (tensor parallelism)
  exposed(o) = max(0, c/2 - window(o)) + max(0, c/2 - window(o))       (sequence parallelism:
    the re-gather under dX, the reduce-scatter under dW, each half the all-reduce's bytes)
and under sequence parallelism every op with a forward all-reduce (the row-parallel linear) adds
half of it: the all-gather of its result's gradient. Backward collectives of other ops stay
exposed. O(ops + operands).

What data-parallel and pipeline engines overlap beyond that (issue 23, each on its own lever,
`cost.levers.Levers`, off by default) is one closed form: a collective of c seconds in k equal
pieces, piece i ready (or needed) after i/k of a compute window of w seconds, the pieces run one
after another on one communication stream. The last piece starts at the window's end at the
earliest, the first piece's wait is never hidden, so what outlasts the window is
  exposed(c, w, k) = max(c/k, c - w (k - 1)/k)  = c/k + (k - 1)/k max(0, c - w)
(k = 1: all of it; a prefetch that runs one piece ahead leaves the same). Per stage:
  - gradient sync (`overlap_grad_reduce`): megatron-core `DistributedDataParallelConfig.
    overlap_grad_reduce` (megatron/core/distributed/distributed_data_parallel_config.py; off by
    default, Megatron-LM `--overlap-grad-reduce`, buckets of max(4e7, 1e6 x dp) parameters,
    distributed_data_parallel.py), PyTorch DDP (torch/nn/parallel/distributed.py, bucketed
    all-reduce hooks, `bucket_cap_mb` 25 MiB), FSDP / FSDP2 (reduce-scatter per wrapped unit),
    DeepSpeed ZeRO `overlap_comm` (on by default at stage 3 only). Window: the last micro-
    batch's backward compute of the stage (B + recomputation); k = the stage's gradient elements
    over `bucket_elements` (rounded up; 0: one bucket). ZeRO-0: the all-reduce, ZeRO-1: the
    reduce-scatter (the updated weights' all-gather after the optimizer stays exposed), ZeRO-2:
    each micro-batch's reduce-scatter under its own backward.
  - ZeRO-3 (`prefetch`: FSDP `forward_prefetch` / `backward_prefetch`, FSDP2's implicit prefetch
    of the next unit, DeepSpeed `stage3_prefetch_bucket_size`): the forward gather under the
    forward compute, the backward gather (and with `overlap_grad_reduce` the reduce-scatter)
    under the backward compute, k = the stage's repeated blocks (FSDP wraps each transformer
    block; DeepSpeed fetches submodule by submodule, at least as fine).
  - pipeline sends (`overlap_p2p`): megatron-core `overlap_p2p_comm` (megatron/core/pipeline_
    parallel/schedules.py, interleaved schedule only; on by default since Megatron-LM 4eeff55,
    2023-10, `--no-overlap-p2p-communication` turns it off): each send of a chunk's activation
    (gradient) runs under one chunk's forward (backward), per slot
    v (max(0, p2p - F/v) + max(0, p2p - B/v)) instead of 2 v p2p (`p2p_exposed`).
The cooldown's slack (stage s > 0 ends its backward s steps before stage 0) is not credited:
stage 0, which ends the pipeline, has none.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardplan.cost.evaluate import OpCost
from shardplan.ir.dims import DimKind
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role

if TYPE_CHECKING:
    from shardplan.cost.levers import Levers
    from shardplan.cost.step import StageProfile


def has_weight_gradient_gemm(graph: Graph, op: Op) -> bool:
    """A contraction (a REDUCE loop dim) with a parameter that needs a gradient."""
    contracts = any(d.kind is DimKind.REDUCE for d in op.signature.loop_dims)
    return contracts and any(
        graph.tensors[t].role is Role.PARAMETER and t in graph.requires_grad for t in op.inputs
    )


def exposed_backward(
    graph: Graph,
    rows: Sequence[OpCost],
    forward: Mapping[str, float],
    sequence_parallel: bool,
) -> float:
    """Seconds of the ops' own backward collectives left exposed (module docstring); `rows` are
    the tensor-parallel plan's `OpCost`s, `forward` each op's forward compute."""
    gemm: dict[int, bool] = {}  # op index -> has a weight-gradient GEMM (asked lazily)

    def is_gemm(i: int) -> bool:
        if i not in gemm:
            gemm[i] = has_weight_gradient_gemm(graph, graph.ops[i])
        return gemm[i]

    exposed = 0.0
    for index, (op, row) in enumerate(zip(graph.ops, rows, strict=True)):
        if sequence_parallel:  # the forward reduce-scatter's backward all-gather
            exposed += row.intra_fwd / 2
        c = row.intra_bwd
        if c <= 0 or not is_gemm(index):
            exposed += max(0.0, c)
            continue
        window = sum(
            forward[graph.ops[i].name]
            for name in op.inputs
            if graph.tensors[name].role is not Role.PARAMETER and name in graph.requires_grad
            for i, _ in graph.consumers[name]
            if is_gemm(i)
        )
        if sequence_parallel:
            exposed += 2 * max(0.0, c / 2 - window)
        else:
            exposed += max(0.0, c - window)
    return exposed


MEGATRON_BUCKET_FLOOR = 40_000_000
"""megatron-core's default gradient bucket, in parameters, is max(4e7, 1e6 x dp)
(megatron/core/distributed/distributed_data_parallel.py, `ddp_config.bucket_size`)."""
MEGATRON_BUCKET_PER_RANK = 1_000_000
DDP_BUCKET_BYTES = 25 * 2**20
"""PyTorch DDP's `bucket_cap_mb` default, 25 MiB (torch/nn/parallel/distributed.py,
`_DEFAULT_BUCKET_CAP_MB`)."""


DEEPSPEED_REDUCE_BUCKET = 500_000_000
"""DeepSpeed ZeRO's `reduce_bucket_size` default, in elements (deepspeed/runtime/zero/config.py)."""


def megatron_bucket(data_ways: int) -> int:
    """megatron-core's default bucket (parameters) for `data_ways` data-parallel ranks."""
    return max(MEGATRON_BUCKET_FLOOR, MEGATRON_BUCKET_PER_RANK * data_ways)


def exposed_under(collective: float, window: float, pieces: float) -> float:
    """Seconds of a collective of `pieces` equal parts that outlast a compute window (module
    docstring): max(c/k, c - w (k - 1)/k); one piece: all of it."""
    k = max(1.0, pieces)
    return max(collective / k, collective - window * (k - 1) / k)


def bucket_count(elements: float, bucket_elements: int) -> int:
    """Buckets of a stage's gradient: its elements over the bucket, rounded up (0: one)."""
    if bucket_elements <= 0 or elements <= 0:
        return 1
    return math.ceil(elements / bucket_elements)


@dataclass(frozen=True, slots=True)
class ZeroTimes:
    """A stage's data-parallel collectives under its levers: ZeRO's per micro-batch (forward,
    backward) and the per-step sync left exposed, and what the overlap hid of each."""

    fwd_s: float
    bwd_s: float
    sync_s: float
    hidden_per_micro_batch_s: float = 0.0
    sync_hidden_s: float = 0.0


def zero_exposed(p: StageProfile, lv: Levers, recompute_s: float) -> ZeroTimes:
    """ZeRO's per-micro-batch collectives and the per-step gradient sync of stage profile `p`
    under `lv` (module docstring); with every overlap lever off, exactly the profile's terms."""
    z = lv.zero
    if z == 0:
        raw = ZeroTimes(0.0, 0.0, p.grad_sync_s)
    else:
        zs = p.zero[z - 1]
        raw = ZeroTimes(zs.fwd_s, zs.bwd_s, zs.step_s)
    if not (lv.overlap_grad_reduce or (lv.prefetch and z == 3)):
        return raw
    fwd_window, bwd_window = p.fwd_compute_s, p.bwd_compute_s + recompute_s
    if z == 3:  # unit by unit: the gather of the next under this one's compute
        k = max(1.0, p.blocks)
        gather = raw.fwd_s
        fwd = exposed_under(gather, fwd_window, k) if lv.prefetch else gather
        hideable = (gather if lv.prefetch else 0.0) + (
            raw.bwd_s - gather if lv.overlap_grad_reduce else 0.0
        )
        bwd = exposed_under(hideable, bwd_window, k) + raw.bwd_s - hideable
        hidden = raw.fwd_s + raw.bwd_s - fwd - bwd
        return ZeroTimes(fwd, bwd, raw.sync_s, hidden)
    k = bucket_count(p.grad_elements, lv.bucket_elements)
    if z == 2:  # each micro-batch's reduce-scatter under its own backward
        bwd = exposed_under(raw.bwd_s, bwd_window, k)
        return ZeroTimes(0.0, bwd, raw.sync_s, raw.bwd_s - bwd)
    # ZeRO-1: the reduce-scatter (ZeRO-2's per-micro-batch one) hides, the gather does not
    reduce = p.grad_sync_s if z == 0 else p.zero[1].bwd_s
    rest = 0.0 if z == 0 else p.zero[1].step_s
    sync = exposed_under(reduce, bwd_window, k) + rest
    return ZeroTimes(0.0, 0.0, sync, sync_hidden_s=raw.sync_s - sync)


def p2p_exposed(p2p: float, virtual: int, fwd_s: float, bwd_s: float) -> float:
    """Per slot, the pipeline sends of `overlap_p2p` left exposed: each of a device's v chunk
    forwards (backwards) hides one send of p2p seconds under its compute (module docstring)."""
    return virtual * (max(0.0, p2p - fwd_s / virtual) + max(0.0, p2p - bwd_s / virtual))


__all__ = [
    "DDP_BUCKET_BYTES",
    "DEEPSPEED_REDUCE_BUCKET",
    "MEGATRON_BUCKET_FLOOR",
    "MEGATRON_BUCKET_PER_RANK",
    "ZeroTimes",
    "bucket_count",
    "exposed_backward",
    "exposed_under",
    "has_weight_gradient_gemm",
    "megatron_bucket",
    "p2p_exposed",
    "zero_exposed",
]
