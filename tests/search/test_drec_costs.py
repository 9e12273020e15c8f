"""D-Rec's round pricer against the evaluator, on random plans of every zoo model.

Every zoo model at test size, with fp32 and bf16 tensors. On a one-round mesh a D-Rec round is
the whole plan: its price of a complete assignment (own terms with each candidate's roofline
compute above that of an ideal 1/q piece, plus every edge once) plus the compute of every op's
ideal piece (all its FLOPs and bytes split q ways) equals the evaluator's total.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardplan as sp
from shardplan.cost import CostOptions, evaluate_strategies
from shardplan.cost.work import ideal_compute, whole_op_bytes
from shardplan.search.drec.costs import RoundCosts
from shardplan.sharding import cut_problem
from tests.search.test_tables_vs_evaluator import as_dtype

MODELS = sorted(sp.zoo.MODELS)
GRAPHS = {(m, b): as_dtype(sp.zoo.build(m, small=True), b) for m in MODELS for b in (4, 2)}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from(MODELS),
    nbytes=st.sampled_from([4, 2]),
    devices=st.sampled_from(["2", "3", "4x1"]),
    preset=st.sampled_from(["shardplan", "mindspore"]),
    train=st.booleans(),
    data=st.data(),
)
def test_round_price_equals_the_evaluator(model, nbytes, devices, preset, train, data):
    graph = GRAPHS[model, nbytes]
    mesh = sp.parse_mesh(devices)
    if len(mesh.rounds) != 1:
        mesh = sp.parse_mesh("2")
    opts = CostOptions.make(preset, train)
    q = mesh.rounds[0].q
    pricer = RoundCosts(graph, mesh, opts, 0.0)
    decided: dict[int, str | None] = {}
    for i, op in enumerate(graph.ops):
        valid = [
            c
            for c in pricer.candidates[i]
            if c is None or cut_problem(op, c, op.signature.extents[c], q) is None
        ]
        decided[i] = data.draw(st.sampled_from(valid), label=op.name)
    plan = {op.name: (decided[i],) for i, op in enumerate(graph.ops)}
    want = evaluate_strategies(graph, mesh, plan, opts).total
    cut_compute = sum(
        ideal_compute(op.flops, _bytes(graph, op, opts), q, opts, mesh) for op in graph.ops
    )
    got = pricer.round_cost(0, decided) + cut_compute
    assert got == pytest.approx(want, rel=1e-9, abs=1e-15)


def _bytes(graph, op, opts):
    """Every operand and result of `op`, whole (what an ideal 1/q piece moves q times over), and
    what its backward moves (`cost/backward.py`)."""
    forward = sum(
        graph.tensors[n].numel * opts.element_bytes(graph.tensors[n])
        for n in (*op.inputs, *op.outputs)
    )
    return forward, whole_op_bytes(graph, op, opts)[1]
