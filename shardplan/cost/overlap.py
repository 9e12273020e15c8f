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

Tensor parallelism's own forward collectives (`tp_comm_overlap`, with sequence parallelism):
megatron-core's `TransformerConfig.tp_comm_overlap` (Megatron-LM `--tp-comm-overlap`, needs
`--sequence-parallel` and Transformer Engine's userbuffers) and torchtitan's
`parallelism.enable_async_tensor_parallel` (PyTorch's micro-pipelined all-gather-matmul and
matmul-reduce-scatter) split each collective into pieces run under the GEMM that reads or writes
it, the decomposition of Wang et al., ASPLOS'23 ("Overlap communication with dependent
computation via decomposition"). Transformer Engine's default methods (`initialize_ub`):
  - "ring_exchange", t pieces (the tensor group's size): the all-gather before a column-
    parallel GEMM forward (qkv_fprop, fc1_fprop) and of the row-parallel GEMM's output
    gradient under its input-gradient GEMM (proj_dgrad, fc2_dgrad); the local piece's GEMM runs
    first: exposed = max(0, c - w (t - 1)/t) (`ring_exchange_exposed`);
  - "pipeline", 4 chunks (`TE_PIPELINE_SPLITS`): the reduce-scatter after a row-parallel GEMM
    forward (proj_fprop, fc2_fprop); the last chunk's scatter follows the GEMM:
    exposed(c, w, 4) as above;
  - "bulk": the column-parallel backward's re-gather and reduce-scatter under dX and dW, as
    Megatron-LM's async path above.
Per op of the tensor-parallel plan (`tensor_overlap_exposed`): an op with a forward all-reduce
c (row-parallel) has a reduce-scatter c/2 under its own forward compute w and, backward, the
all-gather c/2 ring-exchanged under its input-gradient GEMM (the forward's multiply-adds: w); an
op with a backward collective c (column-parallel) has its input's forward all-gather c/2 ring-
exchanged under its window. The forward all-gathers total the row-parallel ops' c/2 (what the
step model's forward collectives hold); the column-parallel GEMMs hide at most that. Not
modelled: the streaming multiprocessors the communication kernels take from the GEMM
(Transformer Engine's `num_sm` / `set_sm_margin`), as NCCL's share under Megatron-LM's async
all-reduce above is not either. An op without a weight-gradient GEMM keeps its collectives
exposed.
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


class _Gemms:
    """Which ops have a weight-gradient GEMM (asked lazily), and the window of an op with a
    backward collective: the forward compute of the GEMM readers of its activation input."""

    def __init__(self, graph: Graph, forward: Mapping[str, float]) -> None:
        self.graph, self.forward = graph, forward
        self.known: dict[int, bool] = {}

    def __call__(self, index: int) -> bool:
        if index not in self.known:
            self.known[index] = has_weight_gradient_gemm(self.graph, self.graph.ops[index])
        return self.known[index]

    def window(self, op: Op) -> float:
        g = self.graph
        return sum(
            self.forward[g.ops[i].name]
            for name in op.inputs
            if g.tensors[name].role is not Role.PARAMETER and name in g.requires_grad
            for i, _ in g.consumers[name]
            if self(i)
        )


def exposed_backward(
    graph: Graph,
    rows: Sequence[OpCost],
    forward: Mapping[str, float],
    sequence_parallel: bool,
) -> float:
    """Seconds of the ops' own backward collectives left exposed (module docstring); `rows` are
    the tensor-parallel plan's `OpCost`s, `forward` each op's forward compute."""
    is_gemm = _Gemms(graph, forward)
    exposed = 0.0
    for index, (op, row) in enumerate(zip(graph.ops, rows, strict=True)):
        if sequence_parallel:  # the forward reduce-scatter's backward all-gather
            exposed += row.intra_fwd / 2
        c = row.intra_bwd
        if c <= 0 or not is_gemm(index):
            exposed += max(0.0, c)
            continue
        window = is_gemm.window(op)
        if sequence_parallel:
            exposed += 2 * max(0.0, c / 2 - window)
        else:
            exposed += max(0.0, c - window)
    return exposed


TE_PIPELINE_SPLITS = 4
"""Transformer Engine's userbuffers split a GEMM + reduce-scatter ("pipeline" method) into 4
chunks by default (transformer_engine/pytorch/module/base.py, `initialize_ub`, default_cfg
`num_splits`: tp_size for "ring_exchange", 4 otherwise)."""


def ring_exchange_exposed(collective: float, window: float, ways: int) -> float:
    """An all-gather of `ways` pieces run as a ring under the GEMM that reads it (Transformer
    Engine's "ring_exchange"): the local piece's GEMM runs first, each later piece's GEMM under
    the next piece's transfer, so what outlasts the window is (t - 1) max(0, c/(t - 1) - w/t)
    = max(0, c - w (t - 1)/t)."""
    t = max(1, ways)
    return max(0.0, collective - window * (t - 1) / t)


def tensor_overlap_exposed(
    graph: Graph,
    rows: Sequence[OpCost],
    forward: Mapping[str, float],
    tensor_ways: int,
) -> tuple[float, float]:
    """(forward, backward) seconds of a sequence-parallel plan's tensor-parallel collectives
    left exposed under `tp_comm_overlap` (module docstring, last part); `rows`, `forward`: as
    `exposed_backward`'s, `tensor_ways`: the tensor-parallel group's size t. O(ops + operands)."""
    is_gemm = _Gemms(graph, forward)
    fwd = bwd = 0.0
    gathered = hidden_gather = 0.0  # the forward all-gathers' seconds, and what their GEMMs hide
    for index, (op, row) in enumerate(zip(graph.ops, rows, strict=True)):
        out, back = row.intra_fwd, row.intra_bwd
        if out <= 0 and back <= 0:
            continue  # no collective of its own: most ops (asking `is_gemm` costs a scan)
        gemm = is_gemm(index)
        if out > 0:  # row-parallel: reduce-scatter, and all-gather of its result's gradient
            gathered += out / 2
            w = forward[op.name]
            fwd += exposed_under(out / 2, w, TE_PIPELINE_SPLITS) if gemm else out / 2
            bwd += ring_exchange_exposed(out / 2, w, tensor_ways) if gemm else out / 2
        if back <= 0:
            continue
        if not gemm:
            bwd += back
            continue
        window = is_gemm.window(op)  # column-parallel: its input's all-gather, ring-exchanged
        hidden_gather += back / 2 - ring_exchange_exposed(back / 2, window, tensor_ways)
        bwd += 2 * max(0.0, back / 2 - window)  # "bulk": as Megatron-LM's async backward
    return fwd + gathered - min(hidden_gather, gathered), bwd


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
    "TE_PIPELINE_SPLITS",
    "ZeroTimes",
    "bucket_count",
    "exposed_backward",
    "exposed_under",
    "has_weight_gradient_gemm",
    "megatron_bucket",
    "p2p_exposed",
    "ring_exchange_exposed",
    "tensor_overlap_exposed",
    "zero_exposed",
]
