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


def _one_op_plan(build, cut_extent):
    """A 1-D `model` mesh of 2 where the one op of `build(b)`'s graph cuts its loop dim of
    extent `cut_extent`."""
    b = GraphBuilder("g")
    build(b)
    g = b.build()
    (op,) = g.ops
    cut = next(d.name for d in op.signature.loop_dims if d.extent == cut_extent)
    return Plan(g, Mesh((2,), ("model",)), {op.name: (cut,)}, "hand")


def _lookup(b):
    ids = b.input("ids", (8,), dtype_bytes=4)
    with b.scope("emb"):
        b.apply("embedding", b.param("weight", (100, 6)), ids, name="op")


# the looked-up rows are the graph output: a hidden split is gathered (colwise_gather)
@pytest.mark.parametrize(("cut", "style"), [(100, "rowwise"), (6, "colwise_gather")])
def test_an_embedding_table_is_rowwise_by_vocabulary_and_colwise_by_hidden(cut, style):
    assert torch_tp_styles(_one_op_plan(_lookup, cut)) == {"emb": style}


def test_a_weight_stored_in_by_out_is_not_an_nn_linear_weight():
    def build(b):
        x = b.input("x", (8, 16))
        with b.scope("proj"):  # x @ W with W [in, out]: no torch style splits that layout
            b.apply("matmul", x, b.param("weight", (16, 32)), name="op")

    with pytest.raises(PlanError, match=r"op 'proj\.op' \(matmul, module 'proj'\)"):
        torch_tp_styles(_one_op_plan(build, 32))  # split out features: fine for [out, in] only


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
