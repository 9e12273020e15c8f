"""The step model's optimizer step and its backward collectives under the weight-gradient GEMMs
(`cost.zero.update_bytes`, `cost/overlap.py`), with figures worked by hand.

Attention-input graph: x [2, 8, 16] -> layer_norm (gain, bias [16]) -> q, k, v linears (w [16,
16] each, column-parallel over 4 devices) -> add(q, k) -> add(., v); fp32 on a 1 byte/s link and
1e6 FLOP/s (seconds = bytes).
"""

from __future__ import annotations

import pytest

from shardplan.cost import CostOptions
from shardplan.cost.overlap import exposed_backward, has_weight_gradient_gemm
from shardplan.cost.presets import Optimizer
from shardplan.cost.step import Levers, Pipeline, profile_stage, stage_cost, step_cost
from shardplan.cost.zero import update_bytes
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
