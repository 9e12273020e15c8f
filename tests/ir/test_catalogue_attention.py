"""The fused attention form: which dims cut, FLOPs, result shape, shape and attribute errors."""

from __future__ import annotations

import pytest

from shardplan.errors import ShapeError
from shardplan.ir.catalogue import op_form
from shardplan.ir.dims import DimKind
from shardplan.ir.traits import Saved, backward_recompute, saved_for_backward


def test_keys_and_features_are_frozen_the_rest_parallel():
    form = op_form("attention", [(2, 8, 16, 64), (2, 8, 32, 64), (2, 8, 32, 48)], {})
    kinds = {d.name: d.kind for d in form.signature.loop_dims}
    assert kinds == {
        "b0": DimKind.PARALLEL,
        "b1": DimKind.PARALLEL,
        "s": DimKind.PARALLEL,
        "t": DimKind.FROZEN,
        "d": DimKind.FROZEN,
        "e": DimKind.PARALLEL,
    }
    assert form.output_shapes == ((2, 8, 16, 48),)
    # the two GEMMs: q k^T (s x t x d) and p v (s x t x e), per batch and head
    assert form.flops == 2 * (2 * 8) * 16 * 32 * 64 + 2 * (2 * 8) * 16 * 32 * 48


def test_query_groups_share_the_keys_and_the_mask_broadcasts():
    # grouped-query attention: 4 query heads per k/v head, a causal mask [s, t]
    form = op_form("attention", [(2, 8, 4, 16, 64), (2, 8, 16, 64), (2, 8, 16, 64), (16, 16)], {})
    assert form.signature.text() == "b0 b1 g0 s d, b0 b1 t d, b0 b1 t e, s t -> b0 b1 g0 s e"
    assert form.output_shapes == ((2, 8, 4, 16, 64),)
    assert form.flops == 4 * (2 * 8 * 4) * 16 * 16 * 64


@pytest.mark.parametrize(
    "shapes, message",
    [
        ([(2, 16, 8), (2, 16, 8)], "optional mask"),
        ([(2, 16, 8), (3, 16, 8), (3, 16, 8)], "batch dims"),
        ([(2, 16, 8), (2, 16, 4), (2, 16, 8)], "one feature size"),
        ([(2, 16, 8), (2, 16, 8), (2, 12, 8)], "one key count"),
        ([(2, 16, 8), (2, 16, 8), (2, 16, 8), (16, 8)], "mask"),
        ([(16, 8), (2, 16, 8), (2, 16, 8)], "rank"),
    ],
)
def test_bad_shapes_are_refused_with_the_reason(shapes, message):
    with pytest.raises(ShapeError, match=message):
        op_form("attention", shapes, {})


def test_scale_must_be_a_finite_number():
    shapes = [(2, 16, 8), (2, 16, 8), (2, 16, 8)]
    assert op_form("attention", shapes, {"scale": 0.125}).flops > 0
    for bad in (float("nan"), "0.1", True):
        with pytest.raises(ShapeError, match="scale"):
            op_form("attention", shapes, {"scale": bad})


def test_backward_keeps_the_inputs_and_recomputes_the_scores():
    assert saved_for_backward("attention") is Saved.INPUTS
    assert backward_recompute("attention") == 0.5  # FlashAttention-2: 5 GEMMs vs the forward's 2
    assert backward_recompute("bmm") == 0.0
