"""Each op's backward priced by its own work (`cost/backward.py`), with figures worked by hand.

Bytes: kernels x |grad of the result| + |saved| + |gradients written|. Seconds on the A100 preset:
312e12 FLOP/s bf16 and 2,039e9 B/s HBM at 70 % (218.4e12 FLOP/s, 1,427.3e9 B/s), 7 us floor.
"""

from __future__ import annotations

import pytest

from shardplan.cost import CostOptions, evaluate_strategies
from shardplan.cost.backward import Piece, backward_bytes
from shardplan.cost.terms import compute_cost
from shardplan.ir.graph import GraphBuilder
from shardplan.mesh import Mesh

A100 = Mesh((1,), flops_per_s=312e12, machine="a100")
TRAIN = CostOptions.make("shardplan", True)
HBM = 2039e9 * 0.7
PEAK = 312e12 * 0.7


def act(nbytes: float, numel: float, grad: bool = True) -> Piece:
    return Piece(nbytes, numel, 4, False, grad)


def param(nbytes: float, numel: float) -> Piece:
    return Piece(nbytes, numel, 4, True, True)


def test_linear_runs_two_gemms_each_reading_the_result_gradient():
    # y [4, 16] = x [4, 8] W^T, W [16, 8], fp32: |x| 128, |W| 512, |y| 256 B. dX = dY W and
    # dW = dY^T x: 2 x 256 (dY twice) + 128 + 512 (x and W) + 128 + 512 (dX, dW written)
    assert backward_bytes("linear", [act(128, 32), param(512, 128)], [act(256, 64)]) == 1792
    # a first layer (x needs no gradient): dW alone, dY once, x read, W not: 256 + 128 + 512
    first = [act(128, 32, grad=False), param(512, 128)]
    assert backward_bytes("linear", first, [act(256, 64)]) == 896


def test_softmax_reads_its_result_and_dropout_its_one_byte_mask():
    # softmax keeps its result: dY + y read, dX written = 3 x 1024
    assert backward_bytes("softmax", [act(1024, 256)], [act(1024, 256)]) == 3 * 1024
    # dropout keeps a 1-byte mask per element (256 B for 256 fp32 elements): 1024 + 256 + 1024
    assert backward_bytes("dropout", [act(1024, 256)], [act(1024, 256)]) == 2304


def test_add_hands_the_gradient_on_and_a_broadcast_input_is_reduced():
    # a residual add: both inputs have the result's size: no kernel at all
    assert backward_bytes("add", [act(1024, 256), act(1024, 256)], [act(1024, 256)]) == 0.0
    # x [4, 64] + position rows [1, 64]: x passes, the [64] input needs dY summed: 1024 + 256
    pos = [act(1024, 256), act(256, 64)]
    assert backward_bytes("add", pos, [act(1024, 256)]) == 1024 + 256
    # bias_add: dY read once for the bias gradient (64 fp32 = 256 B written)
    assert backward_bytes("bias_add", [act(1024, 256), param(256, 64)], [act(1024, 256)]) == 1280


def test_an_op_whose_inputs_need_no_gradient_has_no_backward():
    assert backward_bytes("gelu", [act(1024, 256, grad=False)], [act(1024, 256)]) == 0.0


def test_compute_cost_adds_the_backward_roofline_to_the_forward():
    # a memory-bound op: forward 1 GB, backward 1.5 GB moved; FLOPs negligible
    t = compute_cost(1e6, 1e9, TRAIN, A100, 1.5e9)
    assert t == pytest.approx(1e9 / HBM + 1.5e9 / HBM)
    # a GEMM: the backward has twice the forward's FLOPs whatever its bytes
    flops = 2 * 4096**3
    assert compute_cost(flops, 1e8, TRAIN, A100, 2e8) == pytest.approx(3 * flops / PEAK)
    # no backward kernel: the forward alone; no bytes given: the preset's 3 x the forward
    assert compute_cost(1e6, 1e9, TRAIN, A100, 0.0) == pytest.approx(1e9 / HBM)
    assert compute_cost(1e6, 1e9, TRAIN, A100) == pytest.approx(3e9 / HBM)


def test_evaluator_prices_a_softmax_backward_by_its_three_tensors():
    # softmax over a [8, 16, 256, 256] fp32 activation that needs a gradient (a parameter scales
    # it first): forward reads and writes 32 MiB each; backward reads dY and y, writes dX
    b = GraphBuilder("soft")
    x = b.input("x", (8, 16, 256, 256))
    s = b.apply("mul", x, b.param("g", (256,)), name="gain")
    b.apply("softmax", s, name="sm")
    g = b.build()
    cost = evaluate_strategies(g, A100, {"gain": (), "sm": ()}, TRAIN)
    mib32 = 8 * 16 * 256 * 256 * 4
    softmax = next(o for o in cost.ops if o.name == "sm")
    assert softmax.compute == pytest.approx(2 * mib32 / HBM + 3 * mib32 / HBM)
