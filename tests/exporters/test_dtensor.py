"""DTensor placements of plans: one placement per round, Partial for partial sums, text form."""

from __future__ import annotations

import sys

import pytest

from shardplan import zoo
from shardplan.errors import MissingDependencyError, PlanError
from shardplan.exporters import dtensor
from shardplan.ir.graph import GraphBuilder
from shardplan.mesh import parse_mesh
from shardplan.plans import Plan
from shardplan.search.api import plan as make_plan

torch_tensor = pytest.importorskip("torch.distributed.tensor")
Shard, Replicate, Partial = torch_tensor.Shard, torch_tensor.Replicate, torch_tensor.Partial


@pytest.fixture(scope="module")
def mlp():
    return zoo.build("mlp", small=True)


def test_mesh_shape_is_one_dim_per_round():
    assert dtensor.mesh_shape(parse_mesh("4")) == (2, 2)
    assert dtensor.mesh_shape(parse_mesh("2x4")) == (2, 2, 2)
    assert dtensor.mesh_shape(parse_mesh("6")) == (2, 3)
    assert dtensor.mesh_shape(parse_mesh("1")) == ()
    assert dtensor.mesh_dim_names(parse_mesh("2x4")) == ("r0", "r1", "r2")


def test_data_parallel_mlp_shards_the_batch_and_replicates_weights(mlp):
    p = make_plan(mlp, "4", method="data-parallel")
    pl = dtensor.placements(p)
    assert set(pl) == set(mlp.tensors)
    assert pl["x"] == (Shard(0), Shard(0))
    assert pl["labels"] == (Shard(0), Shard(0))
    for layer in ("fc0", "fc1", "fc2"):
        assert pl[f"{layer}.weight"] == (Replicate(), Replicate())
        assert pl[f"{layer}.bias"] == (Replicate(), Replicate())
        assert pl[f"{layer}.linear"] == (Shard(0), Shard(0))
    # the mean loss over a split batch is a partial sum on both rounds
    assert pl["loss"] == (Partial(), Partial())
    assert dtensor.placement_texts(p)["loss"] == ("P(sum)", "P(sum)")


def test_megatron_mlp_column_then_row_parallel(mlp):
    p = make_plan(mlp, "2x2", method="megatron")
    pl = dtensor.placements(p)
    # outer axis (round 0) data-parallel, inner axis (round 1) tensor-parallel
    assert pl["x"] == (Shard(0), Replicate())
    assert pl["fc0.weight"] == (Replicate(), Shard(0))  # column-parallel: [out, in] split on out
    assert pl["fc0.bias"] == (Replicate(), Shard(0))
    assert pl["fc0.linear"] == (Shard(0), Shard(1))
    assert pl["fc1.weight"] == (Replicate(), Shard(1))  # row-parallel: split on in
    assert pl["fc1.linear"] == (Shard(0), Partial())  # partial sums before the all-reduce
    assert pl["fc1.bias"] == (Replicate(), Replicate())
    texts = dtensor.placement_texts(p)
    assert texts["fc1.linear"] == ("S(0)", "P(sum)")
    assert texts["fc0.weight"] == ("R", "S(0)")


def test_rounds_of_one_axis_may_split_the_same_dim_twice(mlp):
    p = make_plan(mlp, "4", method="megatron")
    pl = dtensor.placements(p)
    assert pl["fc0.weight"] == (Shard(0), Shard(0))
    assert pl["fc1.linear"] == (Partial(), Partial())


def test_rounds_of_one_axis_may_cut_different_dims(mlp):
    # round 0 data-parallel, round 1 tensor-parallel, both on the single axis of "4"
    strategies = {}
    for op in mlp.ops:
        batch = {"linear": "m", "cross_entropy": "d0"}.get(op.kind, "d0")
        model = {"fc0.linear": "n", "fc0.bias_add": "d1", "relu0": "d1", "fc1.linear": "k"}
        strategies[op.name] = (batch, model.get(op.name))
    p = Plan(mlp, parse_mesh("4"), strategies, "hand")
    texts = dtensor.placement_texts(p)
    assert texts["fc0.weight"] == ("R", "S(0)")
    assert texts["fc0.linear"] == ("S(0)", "S(1)")
    assert texts["fc1.linear"] == ("S(0)", "P(sum)")
    assert texts["x"] == ("S(0)", "R")


def test_max_reduction_is_partial_max():
    b = GraphBuilder("g")
    x = b.input("x", (4, 8))
    b.apply("reduce_max", x, axes=(1,), name="m")
    g = b.build()
    p = Plan(g, parse_mesh("2"), {"m": ("d1",)}, "hand")
    assert dtensor.placement_texts(p) == {"x": ("S(1)",), "m": ("P(max)",)}
    assert dtensor.placements(p)["m"] == (Partial("max"),)


def test_fsdp_parameters_use_their_storage_layout(mlp):
    p = make_plan(mlp, "4", method="fsdp")
    texts = dtensor.placement_texts(p)
    for name, layout in p.param_layouts.items():
        assert texts[name] == dtensor.layout_texts(layout)
    assert any("S(" in t for name in p.param_layouts for t in texts[name])


def test_one_device_has_empty_placements(mlp):
    p = make_plan(mlp, "1", method="data-parallel")
    assert all(v == () for v in dtensor.placements(p).values())


def test_text_form_needs_no_torch(mlp, monkeypatch):
    p = make_plan(mlp, "2x2", method="megatron")
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    monkeypatch.setitem(sys.modules, "torch.distributed.tensor", None)
    texts = dtensor.placements(p)  # auto: strings without torch
    assert texts["fc1.linear"] == ("S(0)", "P(sum)")
    assert dtensor.placements(p, form="text") == texts
    with pytest.raises(MissingDependencyError, match="placement_texts"):
        dtensor.placements(p, form="torch")


def test_text_round_trip_and_errors():
    assert dtensor.to_placements(("S(2)", "R", "P", "P(max)")) == (
        Shard(2),
        Replicate(),
        Partial(),
        Partial("max"),
    )
    with pytest.raises(PlanError, match="not a placement"):
        dtensor.to_placements(("X",))
    with pytest.raises(PlanError, match="form"):
        dtensor.placements(make_plan(zoo.build("mlp", small=True), "2"), form="jax")  # type: ignore[arg-type]
    assert dtensor.layouts_by_round({"x": ("S(0)", "R")}) == {"x": "S(0) R"}


def test_placement_values_print_and_parse():
    from shardplan.sharding import PARTIAL, REPLICATED, Placement, placements

    assert [str(p) for p in placements((1, REPLICATED, PARTIAL), (None, None, "max"))] == [
        "S(1)",
        "R",
        "P(max)",
    ]
    assert str(Placement.partial()) == "P(sum)" and Placement.parse("P") == Placement.partial()
    assert Placement.parse("S(3)") == Placement.shard(3) and Placement.parse("R").is_replicate
    with pytest.raises(PlanError, match="not a placement"):
        Placement.parse("S(-1)")
    with pytest.raises(PlanError, match="reducer"):
        Placement.partial("mean")
