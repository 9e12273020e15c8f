"""The one cut-validity rule (`cut_problem`): a WINDOW cut must divide the input dim it splits."""

from __future__ import annotations

import pytest

from shardplan import zoo
from shardplan.errors import PlanError
from shardplan.exporters.mindspore import in_strategy
from shardplan.ir.graph import GraphBuilder
from shardplan.mesh import parse_mesh
from shardplan.plans import Plan
from shardplan.search.api import plan
from shardplan.search.exact.space import op_strategies
from shardplan.sharding import check_strategy, cut_problem


def _conv_graph():
    b = GraphBuilder("conv7")
    x = b.input("x", (2, 3, 7, 7))
    w = b.param("w", (4, 3, 3, 3))
    b.apply("conv2d", x, w, name="conv")  # output grid 5x5, input 7x7
    return b.build()


def _assert_cuts_divide(p: Plan) -> None:
    for op in p.graph.ops:
        for name, counts in zip(op.inputs, in_strategy(p, op.name), strict=True):
            shape = p.graph.tensors[name].shape
            assert all(s % c == 0 for s, c in zip(shape, counts, strict=True)), (op.name, name)


def test_window_cut_must_divide_the_input_dim():
    graph = _conv_graph()
    conv = graph.op("conv")
    rounds = parse_mesh(5).rounds
    assert cut_problem(conv, "y", 5, 5) is not None  # 5 | 5 (grid) but 5 does not divide 7
    assert "not divisible into 5 parts" in cut_problem(conv, "y", 5, 5)
    with pytest.raises(PlanError, match="op 'conv'.*size 7"):
        check_strategy(conv, ("y",), rounds)
    assert ("y",) not in op_strategies(conv, rounds)
    assert ("x",) not in op_strategies(conv, rounds)


@pytest.mark.parametrize("method", ["drec", "ilp", "dp", "data-parallel", "megatron"])
def test_no_method_returns_a_window_cut_that_does_not_divide(method):
    # issue 16 case 1: alexnet --small on mesh 5 used to cut a 64-row image 5 ways
    graph = zoo.build("alexnet", small=True)
    p = plan(graph, parse_mesh(5, "ascend910"), method, preset="mindspore", optimizer="none")
    _assert_cuts_divide(p)


def test_plan_with_a_bad_window_cut_is_rejected():
    graph = _conv_graph()
    with pytest.raises(PlanError, match="not divisible into 5 parts"):
        Plan(graph, parse_mesh(5), {"conv": ("y",)}, "hand")
