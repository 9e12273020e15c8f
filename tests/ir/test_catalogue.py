"""The operator catalogue: every kind's signature, dim kinds, result shapes and FLOPs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from shardplan.errors import ShapeError, UnsupportedOpError
from shardplan.ir.catalogue import BINARY, CATALOGUE, UNARY, op_form
from shardplan.ir.dims import DimKind, Reducer
from shardplan.ir.signature import group_extent

P, R, W, F = DimKind.PARALLEL, DimKind.REDUCE, DimKind.WINDOW, DimKind.FROZEN

# kind -> (input shapes, attrs, result shapes, {loop dim: kind} for every loop dim)
CASES: dict[str, tuple[list[tuple[int, ...]], dict, list[tuple[int, ...]], dict]] = {
    **{k: ([(2, 3)], {}, [(2, 3)], {"d0": P, "d1": P}) for k in UNARY},
    **{k: ([(2, 3), (2, 3)], {}, [(2, 3)], {"d0": P, "d1": P}) for k in BINARY},
    "bias_add": ([(2, 4, 5, 5), (4,)], {"axis": 1}, [(2, 4, 5, 5)],
                 {"d0": P, "d1": P, "d2": P, "d3": P}),
    "softmax": ([(2, 3, 8)], {"axis": -1}, [(2, 3, 8)], {"d0": P, "d1": P, "d2": F}),
    "layer_norm": ([(2, 3, 8), (8,), (8,)], {}, [(2, 3, 8)], {"d0": P, "d1": P, "d2": F}),
    "rms_norm": ([(2, 3, 8), (8,)], {}, [(2, 3, 8)], {"d0": P, "d1": P, "d2": F}),
    "batch_norm": ([(2, 4, 5, 5), (4,), (4,)], {}, [(2, 4, 5, 5)],
                   {"d0": P, "d1": P, "d2": P, "d3": P}),
    "linear": ([(2, 3, 4), (5, 4)], {}, [(2, 3, 5)], {"b": P, "m": P, "n": P, "k": R}),
    "matmul": ([(3, 4), (4, 5)], {}, [(3, 5)], {"m": P, "n": P, "k": R}),
    "bmm": ([(2, 3, 4), (2, 4, 5)], {}, [(2, 3, 5)], {"b": P, "m": P, "n": P, "k": R}),
    "conv2d": ([(2, 3, 8, 8), (4, 3, 3, 3)], {"stride": 1, "padding": 1}, [(2, 4, 8, 8)],
               {"n": P, "o": P, "y": W, "x": W, "c": R, "r": F, "s": F}),
    "pool2d": ([(2, 3, 8, 8)], {"kernel": 2, "stride": 2, "mode": "max"}, [(2, 3, 4, 4)],
               {"n": P, "c": P, "y": W, "x": W}),
    "reduce_sum": ([(2, 3, 4)], {"axes": (1,)}, [(2, 4)], {"d0": P, "d1": R, "d2": P}),
    "reduce_mean": ([(2, 3, 4, 4)], {"axes": (2, 3)}, [(2, 3)],
                    {"d0": P, "d1": P, "d2": R, "d3": R}),
    "reduce_max": ([(2, 3)], {"axes": (-1,)}, [(2,)], {"d0": P, "d1": R}),
    "reshape": ([(2, 12)], {"shape": (2, 3, 4)}, [(2, 3, 4)], {"r0": P, "r1": P, "r2": P}),
    "transpose": ([(2, 3, 4)], {"perm": (2, 0, 1)}, [(4, 2, 3)], {"d0": P, "d1": P, "d2": P}),
    "embedding": ([(100, 16), (2, 8)], {}, [(2, 8, 16)], {"d0": P, "d1": P, "e": P, "v": R}),
    "concat": ([(2, 3), (2, 5)], {"axis": 1}, [(2, 8)], {"d0": P, "c0": F, "c1": F, "cat": F}),
    "cross_entropy": ([(4, 10), (4,)], {}, [()], {"d0": R, "v": F}),
    "einsum": ([(2, 4, 3, 5), (2, 4, 6)], {"spec": "b s e c, b s m -> e c m"}, [(3, 5, 6)],
               {"e": P, "c": P, "m": P, "b": R, "s": R}),
    # experts as a loop dim (shardplan/ir/catalogue_moe.py): g groups of t tokens, e experts
    "moe_topk_ids": ([(2, 6, 4)], {"k": 2}, [(2, 6, 2)], {"g": P, "t": P, "e": F, "k": F}),
    "moe_topk_weights": ([(2, 6, 4)], {"k": 2}, [(2, 6, 2)], {"g": P, "t": P, "e": F, "k": F}),
    "moe_route": ([(2, 6, 2)], {"experts": 4, "capacity": 3}, [(2, 6, 2)],
                  {"g": P, "t": F, "k": F}),
    "moe_slots": ([(2, 6, 2)], {"experts": 4, "capacity": 3}, [(2, 4, 3)],
                  {"g": P, "t": F, "k": F, "e": F, "c": F}),
    "moe_dispatch": ([(2, 6, 8), (2, 4, 3)], {}, [(4, 2, 3, 8)],
                     {"e": P, "g": P, "c": P, "m": P, "t": F}),
    "expert_matmul": ([(4, 2, 3, 8), (4, 16, 8)], {"transpose_b": True}, [(4, 2, 3, 16)],
                      {"e": P, "a0": P, "a1": P, "k": R, "n": P}),
    "moe_combine": ([(4, 2, 3, 8), (2, 6, 2), (2, 6, 2)], {}, [(2, 6, 8)],
                    {"g": P, "t": P, "n": P, "k": R, "e": F, "c": F}),
    # fused attention (shardplan/ir/catalogue_attention.py): batch b0, one query-head group g0
    "attention": ([(2, 3, 4, 8), (2, 5, 8), (2, 5, 6), (4, 5)], {}, [(2, 3, 4, 6)],
                  {"b0": P, "g0": P, "s": P, "t": F, "d": F, "e": P}),
}


def test_every_catalogue_kind_has_a_case():
    assert set(CASES) == set(CATALOGUE)


@pytest.mark.parametrize("kind", sorted(CATALOGUE))
def test_signature_of_every_kind(kind):
    shapes, attrs, results, kinds = CASES[kind]
    form = op_form(kind, shapes, attrs)
    sig = form.signature
    assert form.output_shapes == tuple(results)
    assert {d.name: d.kind for d in sig.loop_dims} == kinds
    assert form.flops >= 0
    # every operand's groups multiply to its shape (a WINDOW group of an input is a window grid)
    extents = sig.extents
    window = {d.name for d in sig.loop_dims if d.kind is W}
    for dims, shape in zip(sig.inputs, shapes, strict=True):
        assert len(dims) == len(shape)
        for group, size in zip(dims, shape, strict=True):
            if not window & set(group):
                assert group_extent(group, extents) == size
    for dims, shape in zip(sig.outputs, results, strict=True):
        assert tuple(group_extent(g, extents) for g in dims) == shape
    for d in sig.loop_dims:
        if d.kind is R:
            assert d.reducer is not None


def test_linear_flops_and_groups():
    form = op_form("linear", [(8, 16, 32), (64, 32)], {})
    assert form.flops == 2 * (8 * 16) * 32 * 64
    assert form.signature.text() == "b m k, n k -> b m n"
    assert op_form("linear", [(4,), (5, 4)], {}).output_shapes == ((5,),)


def test_matmul_transpose_b_and_bmm_attention():
    assert op_form("matmul", [(3, 4), (5, 4)], {"transpose_b": True}).output_shapes == ((3, 5),)
    form = op_form("bmm", [(2, 4, 8, 16), (2, 4, 8, 16)], {"transpose_b": True})
    assert form.signature.text() == "b0 b1 m k, b0 b1 n k -> b0 b1 m n"
    assert form.output_shapes == ((2, 4, 8, 8),)
    assert form.flops == 2 * 2 * 4 * 8 * 16 * 8


def test_softmax_frozen_axis_follows_attr():
    kinds = [d.kind for d in op_form("softmax", [(2, 3, 8)], {"axis": 1}).signature.loop_dims]
    assert kinds == [P, F, P]


def test_conv2d_window_halo_and_shape():
    form = op_form("conv2d", [(2, 3, 32, 32), (16, 3, 5, 5)], {"stride": 2, "padding": (2, 1)})
    dims = {d.name: d for d in form.signature.loop_dims}
    assert form.output_shapes == ((2, 16, 16, 15),)
    assert (dims["y"].halo, dims["x"].halo) == (3, 3)
    assert dims["c"].reducer is Reducer.SUM
    assert form.flops == 2 * (2 * 16 * 16 * 15) * 3 * 5 * 5
    assert form.signature.text() == "n c y x, o c r s -> n o y x"


def test_pool2d_padding_and_default_stride():
    form = op_form("pool2d", [(2, 3, 7, 7)], {"kernel": 3, "stride": 2, "padding": 1})
    assert form.output_shapes == ((2, 3, 4, 4),)
    assert op_form("pool2d", [(1, 1, 6, 6)], {"kernel": 3}).output_shapes == ((1, 1, 2, 2),)


def test_reduce_keepdims_default_axes_and_reducers():
    form = op_form("reduce_max", [(2, 3, 4)], {"axes": (1,), "keepdims": True})
    assert form.output_shapes == ((2, 1, 4),)
    assert form.signature.outputs == ((("d0",), (), ("d2",)),)
    assert form.signature.loop_dim("d1").reducer is Reducer.MAX
    everything = op_form("reduce_mean", [(2, 3)], {})
    assert everything.output_shapes == ((),)
    assert all(d.kind is R and d.reducer is Reducer.SUM for d in everything.signature.loop_dims)


def test_embedding_and_cross_entropy_signatures():
    assert op_form("embedding", [(100, 16), (2, 8)], {}).signature.text() == (
        "v e, d0 d1 -> d0 d1 e")
    assert op_form("cross_entropy", [(2, 8, 10), (2, 8)], {}).signature.text() == (
        "d0 d1 v, d0 d1 -> ")


def test_bias_add_axis_and_bad_bias():
    assert op_form("bias_add", [(2, 4, 5), (4,)], {"axis": 1}).signature.inputs[1] == (("d1",),)
    with pytest.raises(ShapeError, match=r"bias shape \(4,\) must be \(5,\) for axis 2"):
        op_form("bias_add", [(2, 4, 5), (4,)], {})


# -- reshape ---------------------------------------------------------------------------------------


def test_reshape_head_split_refines():
    form = op_form("reshape", [(8, 1024, 768)], {"shape": (8, 1024, 12, 64)})
    sig = form.signature
    assert sig.inputs == ((("r0",), ("r1",), ("r2", "r3")),)
    assert sig.outputs == ((("r0",), ("r1",), ("r2",), ("r3",)),)
    assert [d.extent for d in sig.loop_dims] == [8, 1024, 12, 64]
    assert all(d.kind is P for d in sig.loop_dims)
    assert form.flops == 0


def test_reshape_flatten_and_inferred_dim():
    form = op_form("reshape", [(2, 256, 6, 6)], {"shape": (2, -1)})
    assert form.output_shapes == ((2, 9216),)
    assert form.signature.text() == "r0 r1 r2 r3 -> r0 (r1 r2 r3)"


def test_reshape_mixed_block_refines_both_sides():
    sig = op_form("reshape", [(4, 6)], {"shape": (2, 12)}).signature
    assert sig.text() == "(r0 r1) r2 -> r0 (r1 r2)"


def test_reshape_size_one_dims_are_broadcast_groups():
    sig = op_form("reshape", [(2, 3, 1, 1)], {"shape": (6,)}).signature
    assert sig.text() == "r0 r1 () () -> (r0 r1)"


def test_reshape_without_refinement_is_frozen():
    sig = op_form("reshape", [(6, 4)], {"shape": (4, 6)}).signature
    assert all(d.kind is F for d in sig.loop_dims)
    assert sig.text() == "r0 r1 -> r2 r3"


@pytest.mark.parametrize(
    ("target", "match"),
    [((4, 5), r"cannot reshape \(6, 4\) \(24 elements\) into \(4, 5\)"),
     ((-1, -1), "at most one -1"),
     ((5, -1), r"into \(5, 4\)")],
)
def test_reshape_bad_targets(target, match):
    with pytest.raises(ShapeError, match=match):
        op_form("reshape", [(6, 4)], {"shape": target})


@st.composite
def reshape_pair(draw):
    factors = draw(st.lists(st.sampled_from([1, 2, 3, 4, 5]), min_size=1, max_size=6))
    x, y = [], []
    for target in (x, y):
        pool = list(draw(st.permutations(factors)))
        while pool:
            k = draw(st.integers(1, len(pool)))
            target.append(math.prod(pool[:k]))
            pool = pool[k:]
    return tuple(x), tuple(y)


@settings(max_examples=150, deadline=None)
@given(reshape_pair())
def test_reshape_groups_match_both_shapes(pair):
    """Loop dims are consistent with both shapes; refinable reshapes keep row-major order."""
    x, y = pair
    sig = op_form("reshape", [x], {"shape": y}).signature
    extents = sig.extents
    assert tuple(group_extent(g, extents) for g in sig.inputs[0]) == x
    assert tuple(group_extent(g, extents) for g in sig.outputs[0]) == y
    if all(d.kind is P for d in sig.loop_dims):
        flat_in = [n for g in sig.inputs[0] for n in g]
        flat_out = [n for g in sig.outputs[0] for n in g]
        assert flat_in == flat_out == [d.name for d in sig.loop_dims]


# -- broadcasting ------------------------------------------------------------------------------


def test_binary_broadcasting_groups():
    form = op_form("add", [(4, 1, 3), (5, 3)], {})
    assert form.output_shapes == ((4, 5, 3),)
    assert form.signature.inputs == ((("d0",), (), ("d2",)), (("d1",), ("d2",)))
    assert form.flops == 60


def test_binary_broadcast_against_a_scalar_tensor():
    form = op_form("mul", [(2, 3), ()], {})
    assert form.output_shapes == ((2, 3),)
    assert form.signature.inputs[1] == ()


def test_binary_shapes_that_do_not_broadcast():
    with pytest.raises(ShapeError, match=r"do not broadcast at dim 1"):
        op_form("add", [(4, 2), (3,)], {})


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.sampled_from([1, 2, 3]), max_size=4), min_size=1, max_size=3))
def test_broadcasting_agrees_with_numpy(shapes):
    shapes = [tuple(s) for s in shapes]
    assume(any(shapes))
    try:
        expected = np.broadcast_shapes(*shapes)
    except ValueError:
        with pytest.raises(ShapeError):
            op_form("add", shapes, {})
        return
    assert op_form("add", shapes, {}).output_shapes == (expected,)


# -- errors ------------------------------------------------------------------------------------


def test_unknown_kind_suggests_close_names():
    with pytest.raises(UnsupportedOpError, match=r"op kind 'linaer' is not in the catalogue; "
                                                  r"did you mean 'linear'"):
        op_form("linaer", [(2, 3)], {})


@pytest.mark.parametrize(
    ("kind", "shapes", "attrs", "match"),
    [
        ("linear", [(2, 4), (5, 3)], {}, "linear: contraction sizes differ"),
        ("linear", [(2, 4), (2, 5, 4)], {}, r"weight must be 2-D \[out, in\]"),
        ("matmul", [(2, 4), (3, 4, 5)], {}, "right operand must be 2-D"),
        ("bmm", [(2, 3, 4), (3, 4, 5)], {}, "batch dims differ"),
        ("bmm", [(3, 4), (4, 5)], {}, "equal rank >= 3"),
        ("conv2d", [(2, 3, 8, 8), (4, 2, 3, 3)], {}, r"need \[n,c,h,w\] and \[o,c/groups,r,s\]"),
        ("conv2d", [(2, 3, 2, 2), (4, 3, 3, 3)], {}, "too small for kernel"),
        ("pool2d", [(2, 3, 8)], {}, r"input must be \[n,c,h,w\]"),
        ("pool2d", [(2, 3, 2, 2)], {"kernel": 3}, "too small for kernel"),
        ("softmax", [(2, 3)], {"axis": 2}, "axis 2 is out of range for rank 2"),
        ("softmax", [(2, 3), (2, 3)], {}, "softmax takes 1 inputs, got 2"),
        ("layer_norm", [(2, 8), (4,)], {}, r"parameter shape \(4,\) must be \(8,\)"),
        ("batch_norm", [(2, 4, 5, 5), (3,), (4,)], {}, r"need \(4,\)"),
        ("transpose", [(2, 3)], {"perm": (0, 0)}, "not a permutation of rank 2"),
        ("embedding", [(100,), (2, 8)], {}, r"table must be 2-D \[vocab, dim\]"),
        ("concat", [(2, 3), (3, 5)], {"axis": 1}, "differ outside axis 1"),
        ("cross_entropy", [(4, 10), (3,)], {}, "labels .* must match logits"),
        ("einsum", [(2, 3)], {"spec": "a b, b c -> a c"}, "2 operands but 1 inputs"),
        ("einsum", [(2, 3), (4, 5)], {"spec": "a b, b c -> a c"}, "loop dim 'b' has sizes 3, 4"),
    ],
)
def test_shape_errors_name_the_kind(kind, shapes, attrs, match):
    with pytest.raises(ShapeError, match=match):
        op_form(kind, shapes, attrs)


def test_batch_norm_rank_one_input_is_a_shape_error():
    with pytest.raises(ShapeError, match="batch_norm"):
        op_form("batch_norm", [(5,), (5,), (5,)], {})


@pytest.mark.parametrize(("kind", "shapes"), [("reshape", [(2, 3)]), ("transpose", [(2, 3)]),
                                              ("einsum", [(2, 3)]), ("add", [])])
def test_missing_attrs_or_inputs_are_shape_errors(kind, shapes):
    with pytest.raises(ShapeError):
        op_form(kind, shapes, {})
