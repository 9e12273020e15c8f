"""Sequence parallelism and interleaved 1F1B in the step model, with figures derived by hand.

SP graph: x [2, 8, 16] -> layer_norm (gain, bias [16]) -> fc1 (w1 [64, 16], column-parallel) ->
gelu -> fc2 (w2 [16, 64], row-parallel) -> add(x, .); fp32, tensor-parallel over 4 devices (two
rounds of q = 2, priced as one hierarchical ring: 2 x 3/4 of the tensor for an all-reduce) on a
1 byte/s link (seconds = bytes). A [2, 8, 16] fp32 tensor is 1024 B.
"""

from dataclasses import replace

import pytest

from shardplan.cost import CostOptions
from shardplan.cost.pipeline import Pipeline, interleaved_in_flight
from shardplan.cost.sequence import ring_terms, sequence_parallel_strategies, tensor_rounds
from shardplan.cost.step import Levers, profile_stage, stage_cost, step_cost
from shardplan.errors import PlanError
from shardplan.ir import GraphBuilder
from shardplan.mesh import Mesh
from shardplan.search.experts import context_parallel, data_parallel, megatron

RATE = 1e6
FULL = 2 * 8 * 16 * 4  # one [2, 8, 16] fp32 tensor: 1024 B


def _block():
    b = GraphBuilder("block")
    x = b.input("x", (2, 8, 16))
    h = b.apply("layer_norm", x, b.param("gain", (16,)), b.param("bias", (16,)), name="ln")
    h = b.apply("linear", h, b.param("w1", (64, 16)), name="fc1")
    h = b.apply("gelu", h, name="act")
    h = b.apply("linear", h, b.param("w2", (16, 64)), name="fc2")
    b.apply("add", x, h, name="residual")
    g = b.build()
    mesh = Mesh((4,), bandwidth_bytes_per_s=(1.0,), flops_per_s=RATE, machine="uniform")
    return g, mesh, megatron(g, mesh, 4)


def test_sequence_parallel_splits_the_replicated_regions_along_the_sequence():
    g, mesh, tp = _block()
    assert tensor_rounds(g, mesh, tp) == (0, 1)
    sp = sequence_parallel_strategies(g, mesh, tp)
    # batch 2 does not divide by 4 and the hidden dim carries the norm's gain: the norm and the
    # residual add cut the sequence (loop dim d1, extent 8) in both rounds
    assert (tp["ln"], tp["residual"]) == ((None, None), (None, None))
    assert sp["ln"] == sp["residual"] == ("d1", "d1")
    assert {n: sp[n] for n in ("fc1", "act", "fc2")} == {n: tp[n] for n in ("fc1", "act", "fc2")}


def test_sequence_parallel_bytes_memory_and_compute_by_hand():
    g, mesh, tp = _block()
    opts = CostOptions()
    plain = profile_stage(g, mesh, tp, opts)
    sp = profile_stage(g, mesh, tp, opts, sequence_parallel=True)
    # collectives: fc2's partial sums all-reduced forward, the norm output's gradient backward:
    # a ring all-reduce 2 (q-1)/q x 1024 = 1536 B; under SP a reduce-scatter (3/4 x 1024 = 768)
    # + an all-gather (768) moves the same bytes forward. Backward, Megatron-LM runs fc1's
    # input-gradient all-reduce under its weight-gradient GEMM (cost/overlap.py): 2 x 8 x 16 x 64
    # multiply-adds x 2 FLOPs / 4 devices = 8192 FLOPs at 1e6 FLOP/s hide 8.192e-3 s; under SP the
    # re-gather (768) runs under dX and the reduce-scatter (768) under dW, each hiding that much,
    # and fc2's forward reduce-scatter comes back as an all-gather of its gradient (768)
    window = 2 * 8 * 16 * 64 * 2 / 4 / RATE
    assert plain.fwd_comm_s == pytest.approx(1536)
    assert plain.bwd_comm_s == pytest.approx(1536 - window)
    assert sp.fwd_comm_s == pytest.approx(768 + 768)
    assert sp.bwd_comm_s == pytest.approx(768 + 2 * (768 - window))
    # kept for the backward, tensor-parallel: x (read by the norm) 1024, the norm's result (read
    # by fc1) 1024, fc1's result (gelu) 1024 / 4 x 4 = 1024, gelu's result (fc2) 1024 = 4096
    assert plain.activation_bytes == 4 * FULL
    # sequence-parallel: x and the norm's result split 4 ways: 256 + 256 + 1024 + 1024 = 2560
    assert sp.activation_bytes == 2 * FULL / 4 + 2 * FULL
    # the norm's gain and bias (2 x 16 fp32 = 128 B) now have partial gradients per sequence
    # shard: all-reduced over the 4 devices, 2 x 3/4 x 128 = 192 B; before, nothing to sync
    assert plain.grad_sync_s == 0.0
    assert sp.grad_sync_s == pytest.approx(192)
    # compute: the norm and the add run on a quarter of the tokens (uniform machine: FLOPs/rate;
    # the backward 2x the FLOPs, but the add hands its gradient on: no backward kernel)
    saved = 0.75 * (g.op("ln").flops + g.op("residual").flops) / RATE
    assert plain.fwd_compute_s - sp.fwd_compute_s == pytest.approx(saved)
    saved_bwd = 0.75 * 2 * g.op("ln").flops / RATE
    assert plain.bwd_compute_s - sp.bwd_compute_s == pytest.approx(saved_bwd)


def test_sequence_parallel_needs_tensor_parallelism_and_matching_levers():
    g, mesh, _ = _block()
    with pytest.raises(PlanError, match="no tensor parallelism"):
        profile_stage(g, mesh, data_parallel(g, mesh), CostOptions(), sequence_parallel=True)
    g, mesh, tp = _block()
    prof = profile_stage(g, mesh, tp, CostOptions())
    with pytest.raises(PlanError, match="sequence_parallel=True on a stage profiled"):
        stage_cost(prof, Levers(sequence_parallel=True), 1, 1)
    with pytest.raises(PlanError, match="True or False"):
        Levers(sequence_parallel=1)


def _fake(fwd: float, bwd: float, act: float):
    g, mesh, tp = _block()
    base = profile_stage(g, mesh, tp, CostOptions())
    return replace(
        base,
        fwd_compute_s=fwd,
        bwd_compute_s=bwd,
        fwd_comm_s=0.0,
        bwd_comm_s=0.0,
        grad_sync_s=0.0,
        activation_bytes=act,
        param_bytes=0.0,
    )


def test_interleaved_1f1b_bubble_p2p_and_memory_by_hand():
    # S = 4 devices, v = 2 chunks each, m = 8; each chunk forward 0.5 s, backward 1 s, 1 B kept:
    # a device runs 1 + 2 = 3 s per micro-batch like a plain stage of the same layers
    chunk = _fake(0.5, 1.0, 1.0)
    pipe = Pipeline((0.0,) * 7, 1.0, 0.0, 4, 8, 1, 1.0, 3.0, virtual_stages=2)
    step = step_cost([chunk] * 8, [Levers()] * 8, 8, pipe)
    # bubble (S - 1)/v = 1.5 slots of 3 s; pipeline (m + 1.5) x 3 = 28.5 (plain 1F1B: 11 x 3 = 33)
    assert step.bubble_s == pytest.approx(4.5)
    assert step.pipeline_s == pytest.approx(28.5)
    # each micro-batch crosses v = 2 boundaries per device and direction: 0.5 B at 1 B/s each
    with_p2p = step_cost([chunk] * 8, [Levers()] * 8, 8, replace(pipe, p2p_bytes=(0.5,) * 7))
    assert with_p2p.pipeline_s == pytest.approx(9.5 * (3 + 2 * 2 * 0.5))
    # in flight (Megatron-LM's warm-up + 1, in chunk units / v): device d holds
    # (2 (S - d - 1) + (v - 1) S + 1) / 2 = 5.5, 4.5, 3.5, 2.5 micro-batches of its 2 B
    assert [s.in_flight for s in step.stages] == [5.5, 4.5, 3.5, 2.5]
    assert [s.activation_bytes for s in step.stages] == [11.0, 9.0, 7.0, 5.0]
    # Korthikanti et al. §4.2.3: the first stage holds (1 + (S - 1)/(S v)) x the plain 1F1B's
    # S micro-batches: 4 x (1 + 3/8) = 5.5
    assert interleaved_in_flight(0, 4, 8, 2) == pytest.approx(4 * (1 + 3 / 8))
    assert interleaved_in_flight(0, 4, 8, 1) == 4


def test_interleaved_needs_whole_chunks_per_device():
    chunk = _fake(0.5, 1.0, 1.0)
    pipe = Pipeline((0.0,) * 6, 1.0, 0.0, 4, 8, 1, 1.0, 3.0, virtual_stages=2)
    with pytest.raises(PlanError, match="7 model chunks are not 2 chunks per device"):
        step_cost([chunk] * 7, [Levers()] * 7, 8, pipe)


def _attention(bandwidth: float):
    """x [1, 8, 16] -> q, k, v (linears) -> softmax(q k^T) v, sequence split over 2 devices."""
    b = GraphBuilder("attn")
    x = b.input("x", (1, 8, 16))
    q, k, v = (b.apply("linear", x, b.param(f"w{n}", (16, 16)), name=n) for n in "qkv")
    s = b.apply("bmm", q, k, transpose_b=True, name="scores")
    p = b.apply("softmax", s, name="probs")
    b.apply("bmm", p, v, name="context")
    g = b.build()
    mesh = Mesh((2,), bandwidth_bytes_per_s=(bandwidth,), flops_per_s=RATE, machine="uniform")
    whole = {op.name: (None,) for op in g.ops}
    return g, mesh, context_parallel(g, mesh, whole, [0])


@pytest.mark.parametrize(
    ("bandwidth", "fwd", "bwd"),
    [
        # K and V [1, 8, 16] fp32 = 512 B each; each device receives the other half of both:
        # G = 2 x 256 = 512 B. The readers (two bmms of 2 x 8 x 8 x 16 = 2048 FLOPs, 1024 per
        # device) take 2.048 ms forward and 4.096 ms backward at 1 MFLOP/s.
        (1e6, 0.0, 0.0),  # G = 0.512 ms, backward 2 G = 1.024 ms: hidden under the attention
        (1e5, 5.12e-3 - 2.048e-3, 2 * 5.12e-3 - 4.096e-3),  # G = 5.12 ms: partly exposed
    ],
)
def test_context_parallel_ring_exchange_by_hand(bandwidth, fwd, bwd):
    g, mesh, cp = _attention(bandwidth)
    # the sequence is split everywhere; the attention reads K and V whole
    assert cp["q"] == cp["k"] == cp["v"] == cp["scores"] == cp["context"] == ("m",)
    ring = ring_terms(g, mesh, cp, CostOptions())
    assert ring.gather_s == pytest.approx(512 / bandwidth)
    assert ring.readers_fwd_s == pytest.approx(2.048e-3)
    assert ring.readers_bwd_s == pytest.approx(4.096e-3)
    prof = profile_stage(g, mesh, cp, CostOptions(), context_parallel=True)
    assert prof.fwd_comm_s == pytest.approx(fwd, abs=1e-12)
    assert prof.bwd_comm_s == pytest.approx(bwd, abs=1e-12)
    # the SPMD evaluator's plain terms charge the whole all-gather, not overlapped
    assert profile_stage(g, mesh, cp, CostOptions()).fwd_comm_s == pytest.approx(512 / bandwidth)
    assert stage_cost(prof, Levers(context_parallel=True), 1, 1).comm_s == pytest.approx(fwd + bwd)


@pytest.mark.parametrize(("tensor", "sp"), [(1, False), (4, False), (4, True)])
def test_a_transformer_layer_keeps_korthikanti_activations(tensor, sp):
    # Korthikanti et al. (MLSys'23) §4.1: a layer keeps sbh (34 + 5 a s / h) bytes in 16-bit;
    # tensor parallel: sbh (10 + 24/t + 5 a s / (h t)); with sequence parallelism all / t. The
    # zoo's gpt3 has no dropout, which removes 2 sbh of masks and 3 a s^2 b of attention
    # dropout (mask + output): 32 sbh + 2 a s^2 b, sbh (8 + 24/t) + 2 a s^2 b / t, and / t.
    from shardplan import zoo
    from shardplan.cost.step import block_starts
    from shardplan.ir.segments import segments, subgraph

    s_, b_, h_, a_ = 32, 2, 64, 4
    g = zoo.build("gpt3", batch=b_, layers=3, hidden=h_, heads=a_, seq=s_, max_positions=s_)
    segs = segments(g)
    starts = block_starts(g, segs)
    layer = subgraph(g, segs[starts[2]].start, segs[starts[3] - 1].stop, "layer")
    mesh = Mesh((tensor,), flops_per_s=RATE, machine="uniform")
    plan = megatron(layer, mesh, tensor) if tensor > 1 else {op.name: () for op in layer.ops}
    prof = profile_stage(layer, mesh, plan, CostOptions.make(dtype="bf16"), sequence_parallel=sp)
    sbh, attn = s_ * b_ * h_, a_ * s_ * s_ * b_
    t = tensor
    want = (32 * sbh + 2 * attn) / t if sp else sbh * (8 + 24 / t) + 2 * attn / t
    # the layer's input is a received activation: 16-bit like the rest (`Tensor.received`)
    assert prof.activation_bytes == pytest.approx(want)


def test_a_chunk_cut_mid_layer_checkpoints_once_per_layer():
    # full recomputation keeps one input per transformer layer (Megatron-LM's uniform method,
    # one layer per checkpoint) whether the chunk starts at a layer or half-way through one:
    # a half that repeats is never a block of its own, only what occurs once (embedding, head)
    from shardplan import zoo
    from shardplan.cost.step import block_starts
    from shardplan.ir.segments import segments, subgraph

    g = zoo.build("gpt3", batch=2, layers=6, hidden=64, heads=4, seq=16, max_positions=16)
    segs = segments(g)
    attn = [k for k, s in enumerate(segs) if g.ops[s.start].name.endswith("ln_1.norm")]
    mlp = [k for k, s in enumerate(segs) if g.ops[s.start].name.endswith("ln_2.norm")]
    for first, last in ((attn[1], mlp[4]), (mlp[1], attn[5]), (mlp[1], mlp[4]), (attn[1], attn[5])):
        chunk = subgraph(g, segs[first].start, segs[last].stop, "chunk")
        blocks = block_starts(chunk, segments(chunk))
        layers = sum(1 for k in attn if first <= k <= last)
        halves = sum(1 for k in mlp if first <= k <= last)
        assert len(blocks) == max(layers, halves), (first, last, blocks)
    # the whole model: each prologue and epilogue segment (they occur once), one per layer
    ends = [k for k in range(len(segs)) if k < attn[0] or k > mlp[-1]]
    assert block_starts(g, segs) == sorted(ends + attn)


def test_the_ring_is_the_data_parallel_rounds_gathers_each_under_its_own_reader():
    """Megatron t=2 with context parallelism 2 on 2x2: the loss reads the vocab-split logits
    whole over the tensor-parallel round — an all-gather no ring runs, so it is not hidden under
    the attention's compute; the ring's readers are the four attention bmms (K and V gathered
    along the sequence in the context-parallel round)."""
    from shardplan import zoo
    from shardplan.cost.evaluate import ScoreCache
    from shardplan.mesh import parse_mesh
    from shardplan.search import experts
    from shardplan.search.step.recipes import context_rounds

    g = zoo.build("gpt3", batch=1, layers=2, hidden=64, heads=4, vocab=512, seq=64)
    mesh, opts = parse_mesh("2x2"), CostOptions.make(dtype="bf16")
    classes = experts.op_classes(g)
    plan = experts.megatron(g, mesh, 2, classes, experts.data_parallel(g, mesh, classes))
    cp = experts.context_parallel(g, mesh, plan, context_rounds(mesh, plan, g, 2), classes)
    assert tensor_rounds(g, mesh, cp) == (1,) and cp["loss"][1] is None  # logits gathered
    cache = ScoreCache(g, mesh, opts)
    ring = ring_terms(g, mesh, cp, opts, cache)
    bmms = [op for op in g.ops if op.name.endswith(("attn.scores", "attn.context"))]
    assert len(bmms) == 4
    price = {
        op.name: cache.price(op, cid, cp[op.name])
        for op, cid in zip(g.ops, cache.classes, strict=True)
    }
    assert ring.readers_fwd_s == pytest.approx(sum(price[op.name].forward for op in bmms))
    # the loss's gather stays in the forward collectives the profile charges
    prof = profile_stage(g, mesh, cp, opts, context_parallel=True, cache=cache)
    plain = profile_stage(g, mesh, cp, opts, cache=cache)
    assert prof.fwd_comm_s == pytest.approx(plain.fwd_comm_s - ring.gather_s + ring.exposed_fwd_s)
    loss_gather = plain.breakdown.ops[[op.name for op in g.ops].index("loss")].redistribution
    assert loss_gather > 0 and prof.fwd_comm_s >= loss_gather * 0.5
