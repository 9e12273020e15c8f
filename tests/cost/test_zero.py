"""ZeRO stages of a plain plan, priced by the one evaluator, with figures derived by hand.

The graph: x [8, 16] -> fc1 (w1 [32, 16]) -> fc2 (w2 [16, 32]): 1024 parameter elements, fp32
(4 bytes) with Adam (8 bytes of state per element), data parallel over 4 devices (two rounds of
q = 2 on one 1 byte/s link, so seconds = bytes). Stage 0 holds 16 bytes per element: 16,384 B;
the gradient all-reduce sends 2 * 3/4 * 4096 = 6144 B per device.
"""

import pytest

from shardplan.cost import CostOptions
from shardplan.cost.zero import gather_terms, zero_layout
from shardplan.errors import PlanError
from shardplan.exporters.plan_json import from_json, to_json
from shardplan.ir import GraphBuilder
from shardplan.mesh import Mesh
from shardplan.plans import Plan, with_zero
from shardplan.search.experts import data_parallel

PARAMS = 32 * 16 + 16 * 32
WEIGHT_BYTES = 4 * PARAMS  # 4096
GATHER = 0.75 * WEIGHT_BYTES  # one all-gather over 4 devices: each receives 3/4 of it: 3072


def _dp4(train: bool = True) -> Plan:
    b = GraphBuilder("two")
    x = b.input("x", (8, 16))
    h = b.apply("linear", x, b.param("w1", (32, 16)), name="fc1")
    b.apply("linear", h, b.param("w2", (16, 32)), name="fc2")
    g = b.build()
    mesh = Mesh((4,), bandwidth_bytes_per_s=(1.0,), flops_per_s=1e6, machine="uniform")
    return Plan(g, mesh, data_parallel(g, mesh), "data-parallel", CostOptions(train=train))


@pytest.mark.parametrize(
    ("zero", "param_bytes"),
    [
        (0, PARAMS * (4 + 4 + 8)),  # 16,384
        (1, PARAMS * (4 + 4 + 8 / 4)),  # Adam state / 4: 10,240
        (2, PARAMS * (4 + 4 / 4 + 8 / 4)),  # gradients / 4 too: 7,168
        (3, PARAMS * (4 + 4 + 8) / 4),  # weights / 4 too: 4,096
    ],
)
def test_each_stage_divides_its_state_by_the_data_parallel_degree(zero, param_bytes):
    p = with_zero(_dp4(), zero)
    assert p.zero == zero
    assert p.cost.param_memory == param_bytes
    assert p.cost.activation_memory == _dp4().cost.activation_memory  # activations untouched


def test_stages_1_and_2_reduce_scatter_then_gather_at_the_all_reduce_price():
    base = _dp4()
    assert base.cost.comm.all_reduce_bytes == pytest.approx(2 * GATHER)  # 6144
    for zero in (1, 2):
        c = with_zero(base, zero).cost
        assert c.comm.all_reduce_bytes == 0.0
        assert c.comm.reduce_scatter_bytes == pytest.approx(GATHER)  # the gradient, 3072 B
        assert c.comm.all_gather_bytes == pytest.approx(GATHER)  # the updated weights
        assert c.comm.grad_sync == pytest.approx(base.cost.comm.grad_sync)  # 6144 s either way
        assert c.total == pytest.approx(base.cost.total)


def test_zero3_all_gathers_each_parameter_once_forward_and_once_backward():
    base, p = _dp4(), with_zero(_dp4(), 3)
    c = p.cost
    assert c.comm.all_gather_bytes == pytest.approx(2 * GATHER)  # 6144 B: forward + backward
    assert c.comm.redistribution_fwd == pytest.approx(GATHER)  # 3072 s before the forward
    assert c.comm.redistribution_bwd == pytest.approx(GATHER)  # again before the backward
    assert c.comm.reduce_scatter_bytes == pytest.approx(GATHER)  # the gradient
    assert c.comm.grad_sync == pytest.approx(GATHER)
    assert c.comm.all_reduce_bytes == 0.0
    assert c.total - base.cost.total == pytest.approx(GATHER)  # 1.5x the all-reduce's 6144
    # stored split as today's fallback did, the largest local dim per round (ties: the first):
    # w1 [32, 16] -> [16, 16] -> [8, 16]; w2 [16, 32] -> [16, 16] -> [8, 16]
    assert dict(p.param_layouts) == {"w1": (0, 0), "w2": (1, 0)}


def test_zero3_in_inference_gathers_weights_before_the_forward_only():
    p = with_zero(_dp4(train=False), 3)
    assert p.cost.param_memory == WEIGHT_BYTES / 4
    assert p.cost.comm.all_gather_bytes == pytest.approx(GATHER)
    assert p.cost.comm.redistribution_bwd == 0.0
    with pytest.raises(PlanError, match="ZeRO stage 1 splits gradients and optimizer state"):
        with_zero(_dp4(train=False), 1)


def test_a_parameter_read_twice_is_gathered_and_reduce_scattered_once():
    # w [16, 16] read by two linears (a tied weight): 256 elements, 1024 B
    b = GraphBuilder("tied")
    w = b.param("w", (16, 16))
    h = b.apply("linear", b.input("x", (8, 16)), w, name="a")
    b.apply("linear", h, w, name="b")
    g = b.build()
    mesh = Mesh((4,), bandwidth_bytes_per_s=(1.0,), flops_per_s=1e6, machine="uniform")
    base = Plan(g, mesh, data_parallel(g, mesh), "data-parallel")
    # stage 0: the second reader's all-reduce is shared with the first: one 2 * 3/4 * 1024
    assert base.cost.comm.all_reduce_bytes == pytest.approx(1536)
    c = with_zero(base, 3).cost
    assert c.comm.all_gather_bytes == pytest.approx(2 * 768)  # 3/4 * 1024, twice
    assert c.comm.reduce_scatter_bytes == pytest.approx(768)
    assert c.param_memory == 256 * 16 / 4


def test_gather_terms_is_the_hierarchical_all_gather():
    # rounds: 2 devices at 1 B/s (slow, outer) then 2 at 4 B/s; 64 elements of 4 bytes, replicated
    mesh = Mesh((2, 2), bandwidth_bytes_per_s=(1.0, 4.0), flops_per_s=1e6, machine="uniform")
    t = gather_terms(64, 4, (-1, -1), (0, 1), mesh.rounds)
    # the slow round first, while pieces are half the tensor: 1/2 * 128 B at 1 B/s = 64 s; then
    # the fast round on the whole 256 B: 1/2 * 256 B at 4 B/s = 32 s; bytes 64 + 128 = 3/4 * 256
    assert t.redistribution_fwd == pytest.approx(64 + 32)
    assert t.all_gather_bytes == pytest.approx(0.75 * 256)
    assert gather_terms(64, 4, (-1, -1), (), mesh.rounds).total == 0.0


def test_zero_layout_splits_the_largest_dim_each_replicating_round_divides():
    mesh = Mesh((2, 3), machine="uniform")
    assert zero_layout((6, 4), (-1, -1), mesh.rounds) == (0, 0)  # 6 -> 3 -> 1
    assert zero_layout((4, 6), (0, -1), mesh.rounds) == (0, 1)  # home keeps round 0's split
    assert zero_layout((5, 4), (-1, -1), mesh.rounds) == (1, -1)  # 5 and 2 do not divide by 3


def test_zero_plans_round_trip_through_json():
    for zero in (1, 3):
        p = with_zero(_dp4(), zero)
        back = from_json(to_json(p))
        assert back.zero == zero
        assert dict(back.param_layouts) == dict(p.param_layouts)
        assert back.cost == p.cost
    assert '"zero"' not in to_json(_dp4())  # stage 0 plans keep their JSON


def test_bad_stages_and_mismatched_layouts_are_plan_errors():
    p = _dp4()
    with pytest.raises(PlanError, match="ZeRO stage must be 0, 1, 2 or 3, got 4"):
        with_zero(p, 4)
    z3 = with_zero(p, 3)
    wrong = {**z3.param_layouts, "w1": (1, 1)}
    with pytest.raises(PlanError, match="param_layouts differ for \\['w1'\\]; build the plan"):
        Plan(p.graph, p.mesh, p.strategies, "x", z3.options, param_layouts=wrong)
    symbolic = Plan(p.graph, p.mesh, p.strategies, "x", CostOptions.make("mindspore"))
    with pytest.raises(PlanError, match="'shardplan' cost preset only"):
        with_zero(symbolic, 2)


def test_engines_run_a_zero_plan_as_stage_0_with_its_stored_layouts():
    from shardplan.plans import spmd_plan

    z3 = with_zero(_dp4(), 3)
    run = spmd_plan(z3)
    assert run.zero == 0 and dict(run.param_layouts) == dict(z3.param_layouts)
    # priced as the engines run it: one gather forward (3072 B), the gradient all-reduced (6144)
    assert run.cost.comm.all_gather_bytes == pytest.approx(GATHER)
    assert run.cost.comm.all_reduce_bytes == pytest.approx(2 * GATHER)
    assert dict(spmd_plan(with_zero(_dp4(), 2)).param_layouts) == {}


def test_a_group_round_no_op_cuts_needs_no_reduce_scatter_but_a_gather_of_the_update():
    # every op replicated: each device computes the whole gradient, nothing is all-reduced at
    # stage 0; stage 1 still splits the Adam state 4 ways (10,240 B) and all-gathers the
    # updated weights: 3/4 * 4096 = 3072 B (and s at 1 B/s)
    dp = _dp4()
    rounds = len(dp.mesh.rounds)
    replicated = Plan(dp.graph, dp.mesh, {op: (None,) * rounds for op in dp.strategies}, "x")
    assert replicated.cost.comm.total == 0.0
    c = with_zero(replicated, 1).cost
    assert c.param_memory == PARAMS * (4 + 4 + 8 / 4)
    assert c.comm.reduce_scatter_bytes == 0.0
    assert c.comm.all_gather_bytes == pytest.approx(GATHER)
    assert c.total - replicated.cost.total == pytest.approx(GATHER)
