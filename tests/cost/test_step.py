"""The training-step model, one lever at a time, with figures derived by hand.

The graph: x [8, 16] -> fc1 (w1 [32, 16]) -> fc2 (w2 [16, 32]); 1024 parameter elements,
forward FLOPs 2 * 8 * 16 * 32 = 8192 per linear. Links of 1 byte/s make seconds = bytes.
"""

from dataclasses import replace

import pytest

from shardplan.cost import CostOptions, evaluate_strategies
from shardplan.cost.step import (
    Levers,
    Pipeline,
    Recompute,
    profile_stage,
    stage_cost,
    step_cost,
)
from shardplan.errors import MeshError, PlanError
from shardplan.hardware import peak_flops
from shardplan.ir import GraphBuilder
from shardplan.mesh import Mesh
from shardplan.search.experts import data_parallel

PARAMS = 32 * 16 + 16 * 32
RATE = 1e6  # FLOP/s; on the "uniform" machine: compute is FLOPs / RATE (no roofline terms)


def _two_linears():
    b = GraphBuilder("two")
    x = b.input("x", (8, 16))
    h = b.apply("linear", x, b.param("w1", (32, 16)), name="fc1")
    b.apply("linear", h, b.param("w2", (16, 32)), name="fc2")
    return b.build()


def _dp4():
    g = _two_linears()
    mesh = Mesh((4,), bandwidth_bytes_per_s=(1.0,), flops_per_s=RATE, machine="uniform")
    return g, mesh, data_parallel(g, mesh)


def test_bf16_halves_the_gradient_all_reduce_bytes():
    g, mesh, dp = _dp4()
    fp32 = evaluate_strategies(g, mesh, dp, CostOptions())
    bf16 = evaluate_strategies(g, mesh, dp, CostOptions.make(dtype="bf16"))
    # ring all-reduce over 4 devices: each sends 2 * 3/4 of the gradient bytes
    assert fp32.comm.all_reduce_bytes == pytest.approx(2 * 0.75 * PARAMS * 4)
    assert bf16.comm.all_reduce_bytes == pytest.approx(2 * 0.75 * PARAMS * 2)
    assert bf16.comm.grad_sync == pytest.approx(fp32.comm.grad_sync / 2)


def test_mixed_precision_state_is_16_bytes_per_parameter():
    g, mesh, dp = _dp4()
    # bf16 weight 2 + bf16 gradient 2 + fp32 master 4 + Adam 8; fp32: 4 + 4 + 8 (no master)
    bf16 = evaluate_strategies(g, mesh, dp, CostOptions.make(dtype="bf16"))
    assert bf16.param_memory == PARAMS * 16
    sgd = evaluate_strategies(g, mesh, dp, CostOptions.make(optimizer="sgd-momentum", dtype="fp32"))
    assert sgd.param_memory == PARAMS * (4 + 4 + 4)


def test_full_recomputation_adds_exactly_one_forward():
    g = _two_linears()
    mesh = Mesh((1,), flops_per_s=RATE, machine="uniform")
    strategies = {op.name: () for op in g.ops}
    prof = profile_stage(g, mesh, strategies, CostOptions.make(dtype="bf16"))
    none = stage_cost(prof, Levers(Recompute.NONE), 1, 1)
    full = stage_cost(prof, Levers(Recompute.FULL), 1, 1)
    forward = 2 * 8192 / RATE
    assert none.fwd_s == pytest.approx(forward)
    assert none.bwd_s == pytest.approx(2 * forward)
    assert full.recompute_s == pytest.approx(forward)
    assert full.bwd_s - none.bwd_s == pytest.approx(forward)
    # kept for the backward: what each linear's backward reads, its input (autograd's mm saves
    # self): x (8*16, its declared 4 bytes: graph inputs keep their width) for fc1 and fc1's
    # result (8*32, bf16) for fc2; fc2's result no backward reads
    assert none.activation_bytes == 4 * 8 * 16 + 2 * 8 * 32
    # full: the stage input x and the checkpoint fc1 (segment entry) are kept; rebuilding a
    # segment during the backward keeps nothing more (fc1 is the checkpoint, fc2 unread)
    assert full.activation_bytes == 4 * 8 * 16 + 2 * 8 * 32


def test_1f1b_bubble_for_4_stages_and_8_micro_batches():
    g = _two_linears()
    base = profile_stage(
        g,
        Mesh((1,), flops_per_s=RATE, machine="uniform"),
        {o.name: () for o in g.ops},
        CostOptions(),
    )
    prof = replace(
        base,
        fwd_compute_s=1.0,
        bwd_compute_s=2.0,
        fwd_comm_s=0.0,
        bwd_comm_s=0.0,
        grad_sync_s=0.0,
        param_bytes=0.0,
    )
    pipe = Pipeline((0.0, 0.0, 0.0), 1.0, 0.0, 4, 8, 1, 1.0, 3.0)
    step = step_cost([prof] * 4, [Levers()] * 4, 8, pipe)
    # slot = fwd + bwd = 3 s; (m + S - 1) = 11 slots, of which S - 1 = 3 are bubble
    assert step.pipeline_s == pytest.approx(33.0)
    assert step.bubble_s == pytest.approx(9.0)
    assert step.bubble_s / step.pipeline_s == pytest.approx(3 / 11)
    assert [s.in_flight for s in step.stages] == [4, 3, 2, 1]
    with_p2p = step_cost([prof] * 4, [Levers()] * 4, 8, replace(pipe, p2p_bytes=(0.5,) * 3))
    assert with_p2p.pipeline_s == pytest.approx(11 * (3 + 2 * 0.5))


def test_zero3_all_gathers_each_parameter_once_forward_and_once_backward():
    g, mesh, dp = _dp4()
    prof = profile_stage(g, mesh, dp, CostOptions.make(dtype="bf16"))
    # all-gather of the bf16 parameters over 4 devices: each receives 3/4 of 2 * PARAMS bytes
    assert prof.zero[2].fwd_s == pytest.approx(0.75 * 2 * PARAMS)  # 1 byte/s
    z0 = stage_cost(prof, Levers(zero=0), 1, 1)
    z3 = stage_cost(prof, Levers(zero=3), 1, 1)
    gather = 0.75 * 2 * PARAMS
    assert z3.fwd_s - z0.fwd_s == pytest.approx(gather)  # all-gather before forward
    assert z3.bwd_s - z0.bwd_s == pytest.approx(2 * gather)  # again + reduce-scatter
    assert z0.sync_s == pytest.approx(2 * gather)  # the plain all-reduce, once per step
    assert z3.sync_s == 0.0


@pytest.mark.parametrize(
    ("zero", "bytes_per_param"),
    [(0, 16), (1, 2 + 2 + 12 / 4), (2, 2 + (2 + 12) / 4), (3, 16 / 4)],
)
def test_zero_stages_shard_state_over_the_data_parallel_group(zero, bytes_per_param):
    g, mesh, dp = _dp4()
    prof = profile_stage(g, mesh, dp, CostOptions.make(dtype="bf16"))
    assert stage_cost(prof, Levers(zero=zero), 1, 1).param_bytes == PARAMS * bytes_per_param


def test_micro_batches_sync_gradients_once_per_step():
    g, mesh, dp = _dp4()
    prof = profile_stage(g, mesh, dp, CostOptions.make(dtype="bf16"))
    pipe = Pipeline((), 1.0, 0.0, 4, 8, 1, RATE, 3.0)
    one = step_cost([prof], [Levers()], 1, pipe)
    four = step_cost([prof], [Levers()], 4, pipe)
    slot = one.stages[0].fwd_s + one.stages[0].bwd_s
    assert four.pipeline_s == pytest.approx(4 * slot)
    assert four.sync_s == one.sync_s == pytest.approx(2 * 0.75 * 2 * PARAMS)


def test_bad_levers_and_shapes_are_typed_errors():
    with pytest.raises(PlanError, match="ZeRO stage"):
        Levers(zero=4)
    g, mesh, dp = _dp4()
    prof = profile_stage(g, mesh, dp, CostOptions())
    with pytest.raises(PlanError, match="2 stages need 2 levers"):
        step_cost([prof, prof], [Levers()], 1, Pipeline((0.0,), 1.0, 0.0, 4, 8, 1, RATE, 3.0))


def test_peak_rates_follow_the_datasheets():
    assert peak_flops("a100", "bf16") == 312e12
    assert peak_flops("a100", "fp32") == 19.5e12
    assert peak_flops("h100", "fp16") == 989e12
    with pytest.raises(MeshError, match="ascend910.*no published bf16.*--dtype fp16"):
        peak_flops("ascend910", "bf16")
    with pytest.raises(MeshError, match="no published fp8 rate"):
        peak_flops("a100", "fp8")
    with pytest.raises(MeshError, match="unknown dtype"):
        CostOptions.make(dtype="fp8")


def test_selective_recomputation_drops_the_attention_scores():
    # seq 32 > hidden 64 / heads 4 ... the scores [b h s t] = 4*4*32*32 = 16384 elements outgrow
    # every parameter op's result in the attention half-layer (4*32*64 = 8192): the scores, their
    # scaling, the mask add and the softmax are recomputed; of them only the softmax's result is
    # kept for a backward (softmax's and the context bmm's), so one such tensor per layer, 2 layers
    from shardplan import zoo

    g = zoo.build("gpt2-small", small=True, seq=32, max_positions=32)
    mesh = Mesh((1,), flops_per_s=RATE, machine="uniform")
    prof = profile_stage(g, mesh, {op.name: () for op in g.ops}, CostOptions.make(dtype="bf16"))
    assert prof.selective_bytes == 2 * 1 * (4 * 4 * 32 * 32) * 2
    scores_flops = 2 * 4 * 4 * 32 * 32 * 16  # q k^T: 2 b h s t d
    assert prof.selective_flops >= 2 * scores_flops
    none = stage_cost(prof, Levers(Recompute.NONE), 1, 1)
    sel = stage_cost(prof, Levers(Recompute.SELECTIVE), 1, 1)
    full = stage_cost(prof, Levers(Recompute.FULL), 1, 1)
    assert sel.recompute_s == pytest.approx(prof.selective_flops / RATE)
    assert 0 < sel.recompute_s < full.recompute_s
    assert sel.activation_bytes < none.activation_bytes
