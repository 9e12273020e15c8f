"""The step model's optimizer step, its backward collectives under the weight-gradient GEMMs
and what data-parallel and pipeline engines overlap (`cost.zero.update_bytes`,
`cost/overlap.py`), with figures worked by hand.

Attention-input graph: x [2, 8, 16] -> layer_norm (gain, bias [16]) -> q, k, v linears (w [16,
16] each, column-parallel over 4 devices) -> add(q, k) -> add(., v); fp32 on a 1 byte/s link and
1e6 FLOP/s (seconds = bytes).
"""

from __future__ import annotations

import math

import pytest

from shardplan.cost import CostOptions
from shardplan.cost.overlap import (
    TE_PIPELINE_SPLITS,
    bucket_count,
    exposed_backward,
    exposed_under,
    has_weight_gradient_gemm,
    ring_exchange_exposed,
)
from shardplan.cost.presets import Optimizer
from shardplan.cost.step import Levers, Pipeline, profile_stage, stage_cost, step_cost
from shardplan.cost.zero import update_bytes
from shardplan.errors import PlanError
from shardplan.ir import GraphBuilder
from shardplan.mesh import Mesh
from shardplan.search.experts import data_parallel, megatron

RATE = 1e6
HBM = 2039e9 * 0.7  # the A100 preset's achieved HBM bandwidth


def _qkv():
    b = GraphBuilder("qkv")
    x = b.input("x", (2, 8, 16))
    x = b.apply("layer_norm", x, b.param("gain", (16,)), b.param("bias", (16,)), name="ln")
    q, k, v = (b.apply("linear", x, b.param(f"w{n}", (16, 16)), name=n) for n in "qkv")
    b.apply("add", b.apply("add", q, k, name="qk"), v, name="out")
    return b.build()


def test_three_readers_of_one_input_hide_its_gradient_all_reduce():
    g = _qkv()
    mesh = Mesh((4,), bandwidth_bytes_per_s=(1.0,), flops_per_s=RATE, machine="uniform")
    tp = megatron(g, mesh, 4)
    gemms = [has_weight_gradient_gemm(g, op) for op in g.ops]
    assert gemms == [False, True, True, True, False, False]
    prof = profile_stage(g, mesh, tp, CostOptions())
    # the norm result's gradient: partial sums over the 4 devices, one ring all-reduce 2 x 3/4 x
    # 1024 B = 1536 s (charged once: the three readers share it). Window: q, k and v's
    # weight-gradient GEMMs, each 2 x 16 x 16 x 16 / 4 = 2048 FLOPs = 2.048e-3 s
    assert prof.breakdown.comm.intra_bwd == pytest.approx(1536)
    assert prof.bwd_comm_s == pytest.approx(1536 - 3 * 2048 / RATE)


def test_a_window_longer_than_the_collective_hides_it_all():
    g = _qkv()
    mesh = Mesh((4,), bandwidth_bytes_per_s=(1e12,), flops_per_s=RATE, machine="uniform")
    tp = megatron(g, mesh, 4)
    prof = profile_stage(g, mesh, tp, CostOptions())
    forward = {op.name: 1.0 for op in g.ops}  # 1 s per GEMM: far more than 1.5e-9 s of bytes
    assert exposed_backward(g, prof.breakdown.ops, forward, False) == 0.0
    # under SP each half (re-gather, reduce-scatter) is hidden too; nothing is all-reduced forward
    assert exposed_backward(g, prof.breakdown.ops, forward, True) == 0.0


def test_the_optimizer_step_moves_its_state_once_in_and_out():
    b = GraphBuilder("one")
    b.apply("linear", b.input("x", (8, 16)), b.param("w", (32, 16)), name="fc")
    g = b.build()
    mesh = Mesh((4,), flops_per_s=312e12, machine="a100")
    dp = data_parallel(g, mesh)
    opts = CostOptions.make(dtype="bf16")
    # bf16 + Adam per element: fp32 master and m, v read and written (2 x 12), the bf16 gradient
    # read (2), the bf16 weight written (2) = 28 B; 512 elements; ZeRO 1-3 update a quarter each
    assert opts.update_bytes_for(2) == 28
    assert update_bytes(g, mesh.rounds, dp, opts) == (512 * 28, 512 * 28 / 4)
    # fp32 SGD with momentum: weight read and written (8), gradient read (4), momentum (8) = 20
    sgd = CostOptions.make(optimizer=Optimizer.SGD_MOMENTUM)
    assert sgd.update_bytes_for(4) == 20
    prof = profile_stage(g, mesh, dp, opts)
    assert prof.update_s == pytest.approx(512 * 28 / HBM)
    assert prof.update_sharded_s == pytest.approx(512 * 7 / HBM)
    assert stage_cost(prof, Levers(zero=1), 1, 1).optimizer_s == pytest.approx(512 * 7 / HBM)
    pipe = Pipeline((), 1.0, 0.0, 4, 8, 1, 312e12, 3.0)
    step = step_cost([prof], [Levers()], 1, pipe)
    assert step.optimizer_s == pytest.approx(512 * 28 / HBM)
    assert step.step_s == pytest.approx(step.pipeline_s + step.sync_s + step.optimizer_s)


# --- what data-parallel and pipeline engines overlap (cost.overlap.exposed_under, issue 23) ---


def test_exposed_under_is_the_last_piece_or_what_outlasts_the_window():
    # c = 6 s in k = 3 pieces under w = 4 s: the last piece starts at 4 s at the earliest;
    # pieces 1, 2 ready at 4/3 and 8/3 s run back to back from 4/3 s: done at 4/3 + 6 = 7.33 s,
    # 3.33 s after the window (> the last piece's 2 s)
    assert exposed_under(6.0, 4.0, 3) == pytest.approx(6.0 - 4.0 * 2 / 3)
    # a long window: only the last piece (2 / 4 = 0.5 s) is left
    assert exposed_under(2.0, 10.0, 4) == 0.5
    assert exposed_under(5.0, 100.0, 1) == 5.0  # one piece: nothing to overlap it with
    assert bucket_count(1024, 256) == 4 and bucket_count(1025, 256) == 5
    assert bucket_count(1024, 0) == 1  # 0: no bucketing


def _two_linears():
    """fc1: x [8, 16] @ w1 [32, 16]^T, fc2: [8, 32] @ w2 [16, 32]^T, data parallel over 4 devices
    on a 1 B/s link at 1 FLOP/s (fp32): each GEMM 2 x 8 x 16 x 32 / 4 = 2048 FLOPs per device,
    so F = 4096 s, B = 2 F = 8192 s; the gradients, 1024 elements = 4096 B, all-reduce in
    2 x 3/4 x 4096 = 6144 s (ZeRO-1/2: reduce-scatter 3072 s + all-gather 3072 s)."""
    b = GraphBuilder("two")
    x = b.apply("linear", b.input("x", (8, 16)), b.param("w1", (32, 16)), name="fc1")
    b.apply("linear", x, b.param("w2", (16, 32)), name="fc2")
    g = b.build()
    mesh = Mesh((4,), bandwidth_bytes_per_s=(1.0,), flops_per_s=1.0, machine="uniform")
    p = profile_stage(g, mesh, data_parallel(g, mesh), CostOptions())
    assert (p.fwd_compute_s, p.bwd_compute_s, p.grad_sync_s) == (4096, 8192, 6144)
    assert p.grad_elements == 1024 and p.blocks == 2
    return p


def test_gradient_all_reduce_in_buckets_under_the_last_backward():
    p = _two_linears()
    off = stage_cost(p, Levers(), 2, 1)
    assert off.sync_s == 6144 and off.sync_hidden_s == 0
    # 1024 elements in buckets of 256: k = 4; max(6144 / 4, 6144 - 8192 x 3/4) = 1536 s
    on = stage_cost(p, Levers(overlap_grad_reduce=True, bucket_elements=256), 2, 1)
    assert (on.sync_s, on.sync_hidden_s) == (1536, 6144 - 1536)
    assert (on.fwd_s, on.bwd_s) == (off.fwd_s, off.bwd_s)
    # one bucket (no bucketing): the whole all-reduce waits for the last gradient
    one = stage_cost(p, Levers(overlap_grad_reduce=True), 2, 1)
    assert one.sync_s == 6144
    # ZeRO-1: the reduce-scatter hides (max(768, 3072 - 6144) = 768), the gather of the updated
    # weights after the optimizer (3072 s) does not
    z1 = stage_cost(p, Levers(zero=1, overlap_grad_reduce=True, bucket_elements=256), 2, 1)
    assert (z1.sync_s, z1.sync_hidden_s) == (768 + 3072, 6144 - 3840)
    # ZeRO-2: each micro-batch's reduce-scatter under its own backward: 8192 + 768
    z2 = stage_cost(p, Levers(zero=2, overlap_grad_reduce=True, bucket_elements=256), 2, 1)
    assert (z2.bwd_s, z2.zero_hidden_s, z2.sync_s) == (8192 + 768, 3072 - 768, 3072)


def test_zero3_prefetch_gathers_the_next_block_under_this_ones_compute():
    p = _two_linears()
    off = stage_cost(p, Levers(zero=3), 1, 1)
    assert (off.fwd_s, off.bwd_s) == (4096 + 3072, 8192 + 6144)  # gather; gather + scatter
    # k = 2 blocks: forward max(3072 / 2, 3072 - 4096 / 2) = 1536; backward, the gather alone
    # max(1536, 3072 - 8192 / 2) = 1536 plus the reduce-scatter's 3072
    pre = stage_cost(p, Levers(zero=3, prefetch=True), 1, 1)
    assert (pre.fwd_s, pre.bwd_s, pre.zero_hidden_s) == (4096 + 1536, 8192 + 4608, 3072)
    # with the reduce-scatter overlapped too: max(6144 / 2, 6144 - 4096) = 3072 of 6144
    both = stage_cost(p, Levers(zero=3, prefetch=True, overlap_grad_reduce=True), 1, 1)
    assert (both.bwd_s, both.zero_hidden_s) == (8192 + 3072, 9216 - 1536 - 3072)


def test_p2p_sends_under_the_chunks_compute():
    p = _two_linears()
    pipe = Pipeline((6000.0,), 1.0, 0.0, 8, 8, 1, 1.0, 3.0)  # 6000 B at 1 B/s: 6000 s a send
    off = step_cost([p, p], [Levers(), Levers()], 2, pipe)
    slot = 4096 + 8192 + 2 * 6000
    assert off.step_s == (2 + 1) * slot + 6144 + off.optimizer_s  # today's figures
    assert (
        off.p2p_s == 3 * 2 * 6000 and off.p2p_hidden_s == 0 and "p2p_hidden_s" not in off.to_dict()
    )
    on = step_cost([p, p], [Levers(overlap_p2p=True)] * 2, 2, pipe)
    # the forward send outlasts F = 4096 by 1904 s, the backward one hides under B = 8192
    assert on.pipeline_s == 3 * (4096 + 8192 + 1904)
    assert (on.p2p_s, on.p2p_hidden_s) == (3 * 1904, 3 * (12000 - 1904))
    assert on.to_dict()["p2p_hidden_s"] == on.p2p_hidden_s
    # interleaved, v = 2 chunks a device: each chunk's send under its own F, B; 2 x 1904 a slot
    pipe2 = Pipeline((6000.0,) * 3, 1.0, 0.0, 8, 8, 1, 1.0, 3.0, virtual_stages=2)
    v2 = step_cost([p] * 4, [Levers(overlap_p2p=True)] * 4, 2, pipe2)
    assert v2.pipeline_s == (2 + 0.5) * (2 * (4096 + 8192) + 2 * 1904)


def test_every_overlap_lever_off_is_todays_step_bit_for_bit():
    p = _two_linears()
    pipe = Pipeline((6000.0,), 1.0, 0.0, 8, 8, 1, 1.0, 3.0)
    for z in (0, 1, 2, 3):
        # a bucket size alone overlaps nothing: the step equals the plain levers' exactly
        plain = step_cost([p, p], [Levers(zero=z)] * 2, 4, pipe)
        sized = step_cost([p, p], [Levers(zero=z, bucket_elements=64)] * 2, 4, pipe)
        assert plain == sized and plain.hidden_s == 0
        zs = p.zero[z - 1] if z else None
        fwd = 4096 + (zs.fwd_s if zs else 0.0)
        bwd = 8192 + (zs.bwd_s if zs else 0.0)
        sync = zs.step_s if zs else 6144.0
        update = p.update_sharded_s if z else p.update_s
        assert plain.step_s == (4 + 1) * (fwd + bwd + 2 * 6000.0) + sync + update


def _mlp():
    b = GraphBuilder("mlp")
    x = b.input("x", (2, 8, 16))
    x = b.apply("layer_norm", x, b.param("gain", (16,)), b.param("bias", (16,)), name="ln")
    h = b.apply("linear", x, b.param("w1", (64, 16)), name="fc1")
    h = b.apply("gelu", h, name="act")
    b.apply("linear", h, b.param("w2", (16, 64)), name="fc2")
    return b.build()


def test_ring_exchange_hides_all_but_what_outlasts_t_minus_1_pieces_of_the_gemm():
    # local piece first: (t - 1) max(0, c/(t - 1) - w/t) = max(0, c - w (t - 1)/t)
    assert ring_exchange_exposed(8.0, 4.0, 4) == pytest.approx(3 * max(0.0, 8 / 3 - 4 / 4))
    assert ring_exchange_exposed(1.0, 4.0, 4) == 0.0
    assert ring_exchange_exposed(5.0, 9.0, 1) == 5.0  # one way: nothing to pipeline


def test_tp_comm_overlap_on_a_megatron_mlp_by_hand():
    g = _mlp()
    mesh = Mesh((4,), bandwidth_bytes_per_s=(1.0,), flops_per_s=RATE, machine="uniform")
    tp = megatron(g, mesh, 4)
    prof = profile_stage(g, mesh, tp, CostOptions(), sequence_parallel=True)
    # fc2's partial sums [2, 8, 16] fp32 = 1024 B, all-reduced over 4: 2 x 3/4 x 1024 = 1536 s;
    # fc1's input gradient alike. Each GEMM's forward: 2 x 2 x 8 x 16 x 64 / 4 FLOPs = 8.192 ms
    w = 2 * 2 * 8 * 16 * 64 / 4 / RATE
    rows = {op.name: row for op, row in zip(g.ops, prof.breakdown.ops, strict=True)}
    assert rows["fc2"].intra_fwd == pytest.approx(1536)
    assert rows["fc1"].intra_bwd == pytest.approx(1536)
    # forward: fc2's reduce-scatter (768 s) in 4 chunks under its GEMM, the last one's scatter
    # after it; the all-gather (768 s) ring-exchanged under fc1's GEMM in 4 pieces
    rs = max(768 / 4, 768 - w * 3 / 4)
    ag = max(0.0, 768 - w * 3 / 4)
    assert prof.tp_overlap_fwd_comm_s == pytest.approx(rs + ag)
    assert prof.fwd_comm_s == pytest.approx(1536)
    # backward: fc2's output-gradient all-gather ring-exchanged under its input-gradient GEMM
    # (w), fc1's re-gather and reduce-scatter under dX and dW as without the lever
    assert prof.tp_overlap_bwd_comm_s == pytest.approx(ag + 2 * max(0.0, 768 - w))
    assert prof.bwd_comm_s == pytest.approx(768 + 2 * max(0.0, 768 - w))
    on = stage_cost(prof, Levers(sequence_parallel=True, tp_comm_overlap=True), 1, 1)
    off = stage_cost(prof, Levers(sequence_parallel=True), 1, 1)
    assert off.fwd_s - on.fwd_s == pytest.approx(1536 - rs - ag)
    assert off.bwd_s - on.bwd_s == pytest.approx(768 - ag)


def test_tp_comm_overlap_under_long_gemms_leaves_the_last_scatter_chunk():
    g = _mlp()
    mesh = Mesh((4,), bandwidth_bytes_per_s=(1e12,), flops_per_s=RATE, machine="uniform")
    prof = profile_stage(g, mesh, megatron(g, mesh, 4), CostOptions(), sequence_parallel=True)
    c = 1536 / 1e12
    assert prof.tp_overlap_fwd_comm_s == pytest.approx(c / 2 / TE_PIPELINE_SPLITS)
    assert prof.tp_overlap_bwd_comm_s == pytest.approx(0.0, abs=1e-18)


def test_tp_comm_overlap_needs_sequence_parallelism():
    g = _mlp()
    mesh = Mesh((4,), bandwidth_bytes_per_s=(1.0,), flops_per_s=RATE, machine="uniform")
    prof = profile_stage(g, mesh, megatron(g, mesh, 4), CostOptions())
    assert math.isnan(prof.tp_overlap_fwd_comm_s)  # not profiled without SP
    with pytest.raises(PlanError, match="tp_comm_overlap"):
        stage_cost(prof, Levers(tp_comm_overlap=True), 1, 1)
