"""Hand-computed costs: every figure here is derived by hand from the ring formulas."""

import pytest

import shardplan as sp
from shardplan.cost import CostOptions, evaluate_strategies
from shardplan.errors import PlanError
from shardplan.exporters.plan_json import from_json, to_json
from shardplan.ir import GraphBuilder
from shardplan.mesh import Mesh
from shardplan.plans import Plan
from shardplan.search import plan

UNIT = Mesh((2,), bandwidth_bytes_per_s=(1.0,), flops_per_s=1e30)  # cost = bytes moved


def _matmul_graph(m=8, k=6, n=4):
    """X = x0 + p (so X needs a gradient), Y = X @ W."""
    b = GraphBuilder("mm")
    x0 = b.input("x0", (m, k))
    x = b.apply("add", x0, b.param("p", (m, k)), name="make_x")
    b.apply("matmul", x, b.param("w", (k, n)), name="mm")
    return b.build()


@pytest.mark.parametrize(
    ("cut", "add_cut", "expected_bytes"),
    [("m", "d0", 6 * 4 * 4),   # cut m: W replicated, its gradient all-reduced: |W|
     ("n", None, 8 * 6 * 4),   # cut n: X replicated, its gradient all-reduced: |X|
     ("k", "d1", 8 * 4 * 4)],  # cut k: Y holds partial sums, all-reduced forward: |Y|
)
def test_matmul_cut_costs_on_two_devices(cut, add_cut, expected_bytes):
    g = _matmul_graph()
    strategies = {"make_x": (add_cut,), "mm": (cut,)}
    cost = evaluate_strategies(g, UNIT, strategies, CostOptions.make())
    # ring all-reduce on q=2 moves 2*(q-1)/q = 1 times the tensor
    assert cost.comm.total == pytest.approx(expected_bytes)
    assert cost.comm.redistribution_fwd + cost.comm.redistribution_bwd == 0


def test_matmul_cut_categories():
    g = _matmul_graph()
    opts = CostOptions.make()
    by_m = evaluate_strategies(g, UNIT, {"make_x": ("d0",), "mm": ("m",)}, opts).comm
    by_k = evaluate_strategies(g, UNIT, {"make_x": ("d1",), "mm": ("k",)}, opts).comm
    assert by_m.grad_sync == pytest.approx(96) and by_m.intra_fwd == 0
    assert by_k.intra_fwd == pytest.approx(128) and by_k.grad_sync == 0


def test_inference_has_no_gradient_terms():
    g = _matmul_graph()
    cost = evaluate_strategies(g, UNIT, {"make_x": ("d0",), "mm": ("m",)},
                               CostOptions.make(train=False))
    assert cost.comm.total == 0


def _mlp2(batch=16, d_in=8, hidden=32, d_out=8):
    b = GraphBuilder("mlp2")
    x = b.input("x", (batch, d_in))
    from shardplan.zoo.layers import dense

    h = b.apply("relu", dense(b, x, hidden, "fc1"), name="relu")
    dense(b, h, d_out, "fc2")
    return b.build()


def test_megatron_mlp_has_one_forward_all_reduce():
    g = _mlp2()
    p = plan(g, UNIT, "megatron")
    assert p.strategies["fc1.linear"] == ("n",)
    assert p.strategies["fc2.linear"] == ("k",)
    rows = {r.name: r for r in p.cost.ops}
    reducing = [name for name, r in rows.items() if r.intra > 0 and name.endswith("linear")]
    # fc2's partial sums [16, 8] fp32 are all-reduced once; x is a graph input: no gradient
    assert p.cost.comm.intra_fwd == pytest.approx(16 * 8 * 4)
    assert reducing == ["fc2.linear"]
    assert p.cost.comm.redistribution_fwd + p.cost.comm.redistribution_bwd == 0


def test_data_parallel_mlp_only_syncs_gradients():
    g = _mlp2()
    mesh = Mesh((8,), bandwidth_bytes_per_s=(1.0,), flops_per_s=1e30)
    p = plan(g, mesh, "data-parallel")
    assert p.cost.comm.grad_sync == pytest.approx(g.param_bytes * 2 * 7 / 8)
    assert p.cost.comm.total == pytest.approx(p.cost.comm.grad_sync)


def test_gpt2_small_data_parallel_sync_and_adam_memory():
    g = sp.zoo.build("gpt2-small", batch=8, seq=1024)
    mesh = sp.parse_mesh("8")
    p = plan(g, mesh, "data-parallel")
    bandwidth = mesh.bandwidth_bytes_per_s[0]
    # the tied embedding is used twice but its gradient is reduced once
    assert p.cost.comm.grad_sync * bandwidth == pytest.approx(g.param_bytes * 2 * 7 / 8)
    # fp32 weights + gradients + Adam m and v: 16 bytes per parameter, replicated
    assert p.cost.param_memory == 16 * g.num_params
    acts = sum(g.tensors[t].nbytes for op in g.ops for t in op.outputs) / 8
    assert p.cost.activation_memory >= acts


def test_op_terms_are_the_rows_of_the_breakdown():
    """The per-operator walk the verifier shares with the evaluator sums to its breakdown."""
    from shardplan.cost.evaluate import op_terms, output_layouts, param_homes

    p = plan(sp.zoo.build("gpt2-small", small=True, batch=8), "2x4", "megatron")
    g, opts = p.graph, CostOptions.make("shardplan", True)
    homes = param_homes(g, p.strategies, p.param_layouts)
    terms = list(op_terms(g, p.mesh, p.strategies, opts, homes, output_layouts(g, p.strategies)))
    assert [t.op.name for t in terms] == [op.name for op in g.ops]
    assert any(t.edges for t in terms)  # megatron's activations are redistributed somewhere
    rows = p.cost.ops
    assert [t.intra.total for t in terms] == [r.intra for r in rows]
    assert [t.redistribution.total for t in terms] == [r.redistribution for r in rows]
    assert [t.compute for t in terms] == [r.compute for r in rows]
    assert all(
        e.src != e.dst and e.tensor == t.op.inputs[e.position] for t in terms for e in t.edges
    )


def test_hierarchical_all_reduce_telescopes_to_ring_volume():
    g = _mlp2(batch=64)
    flat = Mesh((8,), bandwidth_bytes_per_s=(1.0,), flops_per_s=1e30)
    two_level = Mesh((2, 4), bandwidth_bytes_per_s=(1.0, 1.0), flops_per_s=1e30)
    a = plan(g, flat, "data-parallel").cost.comm.grad_sync
    b = plan(g, two_level, "data-parallel").cost.comm.grad_sync
    assert a == pytest.approx(b)


def test_slow_outer_axis_carries_the_smallest_piece():
    g = _mlp2(batch=64)
    mesh = Mesh((2, 4), bandwidth_bytes_per_s=(1.0, 100.0), flops_per_s=1e30)
    cost = plan(g, mesh, "data-parallel").cost.comm.grad_sync
    # inner 4-way: 2*(3/4)*S over fast links, outer 2-way: 2*(1/2)*S/4 over the slow one
    s = g.param_bytes
    assert cost == pytest.approx(2 * 3 / 4 * s / 100 + 2 * 1 / 2 * s / 4 / 1)


def test_mindspore_preset_counts_elements():
    g = sp.zoo.build("sapp-mlp")
    p = plan(g, "8", preset="mindspore")
    assert p.cost.units == "elements" and p.cost.compute == 0


@pytest.mark.parametrize(
    ("strategy", "match"),
    [(("n", "n", "n"), r"op 'mm' \(matmul\) round 2 \(q=2\): local extent 1 of 'n'"),
     (("k", None), r"op 'mm': strategy .* has 2 cuts but the mesh has 3 rounds"),
     (("x", None, None), r"op 'mm'.*loop dim 'x' does not exist")],
)
def test_invalid_plans_name_the_op(strategy, match):
    g = _matmul_graph(m=8, k=8, n=4)
    with pytest.raises(PlanError, match=match):
        Plan(g, sp.parse_mesh("8"), {"make_x": (None, None, None), "mm": strategy}, "hand")


def test_frozen_cut_is_rejected():
    b = GraphBuilder("sm")
    x = b.apply("add", b.input("x0", (4, 8)), b.param("p", (4, 8)), name="a")
    b.apply("softmax", x, name="softmax")
    g = b.build()
    with pytest.raises(PlanError, match=r"op 'softmax' .* 'd1' is FROZEN"):
        Plan(g, sp.parse_mesh("2"), {"a": (None,), "softmax": ("d1",)}, "hand")


@pytest.mark.parametrize("name", sorted(sp.zoo.MODELS))
def test_plan_json_round_trips_for_every_zoo_model(name):
    g = sp.zoo.build(name, small=True)
    p = plan(g, "2x2")
    again = from_json(to_json(p))
    assert again == p
    assert to_json(again) == to_json(p)


def test_bad_json_is_a_plan_error():
    with pytest.raises(PlanError, match="not a shardplan plan"):
        from_json('{"schema": "other"}')
    with pytest.raises(PlanError, match="does not parse"):
        from_json("{nope")
