"""MoE and grouped-convolution forms: which dims cut, FLOPs, shape errors."""

from __future__ import annotations

import pytest

from shardplan.errors import ShapeError
from shardplan.ir.catalogue import op_form
from shardplan.ir.dims import DimKind


def test_expert_matmul_flops_and_weight_layouts():
    stored_out_in = op_form("expert_matmul", [(8, 4, 16, 32), (8, 64, 32)], {"transpose_b": True})
    assert stored_out_in.signature.text() == "e a0 a1 k, e n k -> e a0 a1 n"
    assert stored_out_in.flops == 2 * 8 * 4 * 16 * 32 * 64
    stored_in_out = op_form("expert_matmul", [(8, 10, 32), (8, 32, 64)], {})
    assert stored_in_out.output_shapes == ((8, 10, 64),)
    with pytest.raises(ShapeError, match="disagree"):
        op_form("expert_matmul", [(8, 10, 32), (4, 32, 64)], {})


def test_dispatch_and_combine_keep_the_group_dim_next_to_the_expert_dim():
    # the dispatched tokens are [e, g, c, m]: produced split on g (data parallel), read split
    # on e (expert parallel) -> the edge between them is a split-to-split (all-to-all)
    dispatch = op_form("moe_dispatch", [(4, 16, 32), (4, 8, 6)], {})
    assert dispatch.signature.outputs == ((("e",), ("g",), ("c",), ("m",)),)
    combine = op_form("moe_combine", [(8, 4, 6, 32), (4, 16, 2), (4, 16, 2)], {})
    assert combine.signature.inputs[0] == (("e",), ("g",), ("c",), ("n",))
    assert combine.signature.loop_dim("e").kind is DimKind.FROZEN
    assert combine.flops == 2 * 4 * 16 * 2 * 32


def test_routing_attributes_are_checked():
    with pytest.raises(ShapeError, match="capacity"):
        op_form("moe_route", [(2, 6, 2)], {"experts": 4})
    with pytest.raises(ShapeError, match="larger than"):
        op_form("moe_topk_ids", [(2, 6, 4)], {"k": 5})


def test_depthwise_conv_cuts_channels_by_group():
    form = op_form("conv2d", [(2, 8, 6, 6), (8, 1, 3, 3)], {"groups": 8, "padding": 1})
    dims = {d.name: d.kind for d in form.signature.loop_dims}
    assert dims == {
        "n": DimKind.PARALLEL,
        "g": DimKind.PARALLEL,
        "o": DimKind.FROZEN,
        "y": DimKind.WINDOW,
        "x": DimKind.WINDOW,
        "c": DimKind.FROZEN,
        "r": DimKind.FROZEN,
        "s": DimKind.FROZEN,
    }
    assert form.signature.text() == "n (g c) y x, (g o) c r s -> n (g o) y x"
    assert form.flops == 2 * (2 * 8 * 6 * 6) * 1 * 3 * 3  # one input channel per output
    grouped = op_form("conv2d", [(2, 8, 6, 6), (4, 2, 3, 3)], {"groups": 4})
    assert grouped.output_shapes == ((2, 4, 4, 4),)
    with pytest.raises(ShapeError, match="groups"):
        op_form("conv2d", [(2, 8, 6, 6), (4, 3, 3, 3)], {"groups": 4})
