"""The roofline compute price (`cost/terms.compute_cost`), with numbers worked by hand.

A100 preset: 312e12 FLOP/s bf16 and 2,039e9 B/s HBM, each at 70 % (so 218.4e12 FLOP/s and
1,427.3e9 B/s achieved), 7 us per kernel at least; training x3 (forward + backward).
"""

from __future__ import annotations

import pytest

from shardplan.cost import CostOptions, evaluate_strategies
from shardplan.cost.terms import compute_cost
from shardplan.errors import MeshError
from shardplan.hardware import Machine
from shardplan.ir.graph import GraphBuilder
from shardplan.mesh import Mesh

A100 = Mesh((1,), flops_per_s=312e12, machine="a100")
INFER = CostOptions.make("shardplan", False)
TRAIN = CostOptions.make("shardplan", True)


def test_memory_bound_op_is_priced_by_its_bytes():
    # softmax over [64, 16, 512, 512] fp32 scores: 5 FLOPs per element, reads and writes them all
    elems = 64 * 16 * 512 * 512
    nbytes = 2 * 4 * elems  # 2,147,483,648 B
    t = compute_cost(5 * elems, nbytes, INFER, A100)
    assert t == pytest.approx(2_147_483_648 / 1427.3e9)  # 1.5046 ms; FLOPs alone: 6.1 us


def test_compute_bound_op_is_priced_by_its_flops():
    # bf16 matmul 4096 x 4096 x 4096: 2 n^3 FLOPs, three n^2 bf16 matrices moved
    flops, nbytes = 2 * 4096**3, 3 * 4096**2 * 2
    t = compute_cost(flops, nbytes, INFER, A100)
    assert t == pytest.approx(137_438_953_472 / 218.4e12)  # 629.3 us; bytes alone: 70.5 us


def test_tiny_kernel_pays_the_launch_floor_once_per_pass():
    assert compute_cost(1024, 8192, INFER, A100) == pytest.approx(7e-6)
    assert compute_cost(1024, 8192, TRAIN, A100) == pytest.approx(3 * 7e-6)


def test_views_and_the_symbolic_preset_cost_nothing():
    assert compute_cost(0.0, 1e9, TRAIN, A100) == 0.0  # reshape / transpose: 0 FLOPs
    symbolic = CostOptions.make("mindspore", True)
    assert compute_cost(1e12, 1e9, symbolic, A100) == 0.0


def test_uniform_machine_has_no_memory_term_and_no_floor():
    mesh = Mesh((1,), flops_per_s=1e12, machine="uniform")
    assert compute_cost(10.0, 1e15, INFER, mesh) == pytest.approx(10.0 / 1e12)


def test_evaluator_prices_an_unsharded_softmax_by_its_hbm_traffic():
    b = GraphBuilder("soft")
    x = b.input("x", (8, 16, 256, 256))  # fp32
    b.apply("softmax", x, name="sm")
    g = b.build()
    cost = evaluate_strategies(g, A100, {"sm": ()}, INFER)
    elems = 8 * 16 * 256 * 256
    assert cost.compute == pytest.approx(2 * 4 * elems / 1427.3e9)  # 47.0 us


def test_evaluator_splits_the_bytes_a_cut_splits_but_not_a_replicated_weight():
    # linear [8, 4096] x [4096, 4096]^T fp32 on 2 devices, cut along the 8 rows: each device
    # reads half of x, writes half of y but reads the whole weight: memory-bound
    b = GraphBuilder("lin")
    x = b.input("x", (8, 4096))
    b.apply("linear", x, b.param("w", (4096, 4096)), name="fc")
    g = b.build()
    mesh = Mesh((2,), flops_per_s=312e12, machine="a100")
    rows = next(d.name for d in g.ops[0].signature.loop_dims if d.extent == 8)
    cost = evaluate_strategies(g, mesh, {"fc": (rows,)}, INFER)
    nbytes = 4 * (4 * 4096 + 4096 * 4096 + 4 * 4096)  # 67,239,936 B
    assert cost.compute == pytest.approx(nbytes / 1427.3e9)  # 47.1 us; FLOPs: 0.61 us


def test_machine_rejects_bad_roofline_constants():
    with pytest.raises(MeshError, match="efficiency"):
        Machine("x", 1e9, 1e9, 1e9, {"bf16": 1e12}, "bf16", 8, "", flops_efficiency=0.0)
    with pytest.raises(MeshError, match="launch"):
        Machine("x", 1e9, 1e9, 1e9, {"bf16": 1e12}, "bf16", 8, "", launch_s=-1.0)


def test_fused_attention_backward_recomputes_the_scores():
    # q, k, v [8, 16, 1024, 128] fp32, compute-bound both ways: forward 4 b h s^2 d FLOPs; the
    # backward's usual 2x plus the scores again (half the forward, `ir.traits`): 3.5x in all
    b = GraphBuilder("flash")
    q, k, v = (b.param(n, (8, 16, 1024, 128)) for n in "qkv")
    b.apply("attention", q, k, v, name="attn")
    g = b.build()
    flops = 4 * 8 * 16 * 1024 * 1024 * 128
    assert g.ops[0].flops == flops
    forward = evaluate_strategies(g, A100, {"attn": ()}, INFER).compute
    assert forward == pytest.approx(flops / 218.4e12)  # 314.7 us; bytes: 188 us
    trained = evaluate_strategies(g, A100, {"attn": ()}, TRAIN).compute
    assert trained == pytest.approx(3.5 * flops / 218.4e12)
    assert compute_cost(flops, 1.0, TRAIN, A100, 1.0) == pytest.approx(3 * flops / 218.4e12)
