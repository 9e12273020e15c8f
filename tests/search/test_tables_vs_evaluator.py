"""The ILP/DP cost tables against the evaluator, on random plans of every zoo model at test size,
for fp32 and bf16 tensors, both presets, training and inference (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardplan as sp
from shardplan.cost import CostOptions, evaluate_strategies
from shardplan.cost.evaluate import memory_per_device, output_layouts, param_homes
from shardplan.cost.linear import memory_from_pieces, memory_pieces
from shardplan.ir.graph import make_graph
from shardplan.search.exact.space import build_model

MODELS = sorted(sp.zoo.MODELS)


def as_dtype(graph: sp.Graph, nbytes: int) -> sp.Graph:
    """The same graph with every tensor stored in `nbytes` bytes per element."""
    tensors = {name: replace(t, dtype_bytes=nbytes) for name, t in graph.tensors.items()}
    return make_graph(graph.name, tensors, graph.ops)


GRAPHS = {(m, b): as_dtype(sp.zoo.build(m, small=True), b) for m in MODELS for b in (4, 2)}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from(MODELS),
    nbytes=st.sampled_from([4, 2]),
    mesh=st.sampled_from(["4", "2x3", "2x2", "8"]),
    preset=st.sampled_from(["shardplan", "mindspore"]),
    train=st.booleans(),
    data=st.data(),
)
def test_tables_equal_the_evaluator(model, nbytes, mesh, preset, train, data):
    graph, mesh = GRAPHS[model, nbytes], sp.parse_mesh(mesh)
    opts = CostOptions.make(preset, train)
    tables = build_model(graph, mesh, opts)
    choice = [data.draw(st.integers(0, len(u) - 1)) for u in tables.unary]
    plan = tables.strategies(choice)
    cost = evaluate_strategies(graph, mesh, plan, opts)
    assert tables.objective(choice) == pytest.approx(cost.total, rel=1e-9, abs=1e-15)
    pieces = [
        memory_pieces(graph, i, plan[op.name], mesh.rounds, opts) for i, op in enumerate(graph.ops)
    ]
    homes = param_homes(graph, plan)
    want = memory_per_device(graph, mesh.rounds, homes, output_layouts(graph, plan), plan, opts)
    assert memory_from_pieces(pieces, train) == pytest.approx(want, rel=1e-12)
