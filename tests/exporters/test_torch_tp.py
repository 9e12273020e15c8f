"""`to_torch_tp` / `torch_tp_styles`: Megatron-shaped plans become PyTorch TP styles, anything
else a PlanError naming the op (`tests/torch/test_parallelize.py` trains with them)."""

from __future__ import annotations

import pytest

from shardplan import Mesh
from shardplan import plan as make_plan
from shardplan.errors import PlanError
from shardplan.exporters.axes import collapse, collapse_texts
from shardplan.exporters.torch_tp import torch_tp_styles
from shardplan.ir.graph import GraphBuilder
from shardplan.plans import Plan


def mlp():
    b = GraphBuilder("mlp")
    x = b.input("x", (8, 16))
    with b.scope("fc1"):
        h = b.apply("linear", x, b.param("weight", (64, 16)), name="linear")
    h = b.apply("gelu", h, name="act")
    with b.scope("fc2"):
        h = b.apply("linear", h, b.param("weight", (16, 64)), name="linear")
    b.apply("reduce_mean", h, axes=(0, 1), name="loss")
    return b.build()


def test_megatron_mlp_is_colwise_then_rowwise():
    p = make_plan(mlp(), Mesh((2, 2), ("data", "model")), "megatron")
    assert torch_tp_styles(p) == {"fc1": "colwise", "fc2": "rowwise"}
    assert torch_tp_styles(p, "model") == torch_tp_styles(p, 1)


def test_batch_split_on_the_tp_axis_is_a_named_error():
    p = make_plan(mlp(), Mesh((2, 2), ("data", "model")), "data-parallel")
    with pytest.raises(PlanError, match=r"op 'fc1\.linear'.*'x'"):
        torch_tp_styles(p)


def test_a_split_weight_of_a_non_linear_op_is_a_named_error():
    b = GraphBuilder("mm")
    x = b.input("x", (8, 16))
    w = b.param("w", (16, 32))
    b.apply("reduce_mean", b.apply("matmul", x, w, name="mm"), axes=(0, 1), name="loss")
    g = b.build()
    strategies = {op.name: (None,) for op in g.ops}
    strategies["mm"] = (next(d.name for d in g.op("mm").signature.loop_dims if d.extent == 32),)
    with pytest.raises(PlanError, match="op 'mm' \\(matmul"):
        torch_tp_styles(Plan(g, Mesh((2,), ("model",)), strategies, "hand"))


def test_unknown_axis_is_a_plan_error():
    p = make_plan(mlp(), Mesh((2, 2), ("data", "model")), "megatron")
    with pytest.raises(PlanError, match="'tp'"):
        torch_tp_styles(p, "tp")


def test_collapse_onto_axes():
    mesh = Mesh((2, 4), ("data", "model"))  # rounds: data 2 | model 2, 2
    assert collapse((0, 1, 1), mesh, -1) == (0, 1)
    assert collapse((0, 1, -1), mesh, -1) is None
    assert collapse_texts(("S(0)", "R", "R"), mesh) == ("S(0)", "R")
    assert collapse((0,), Mesh((1, 2), ("a", "b")), -1) == (-1, 0)  # an axis of size 1
