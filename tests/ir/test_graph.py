"""GraphBuilder, Graph and verify: ordering, indexes, roles, and the typed errors."""

from __future__ import annotations

import pytest

from shardplan.errors import CycleError, IRError, ShapeError, UnsupportedOpError
from shardplan.ir import (
    Graph,
    GraphBuilder,
    Op,
    Role,
    Signature,
    Tensor,
    make_graph,
    verify,
)
from shardplan.ir.dims import DimKind


def _mlp() -> Graph:
    b = GraphBuilder("tiny")
    x = b.input("x", (4, 8))
    labels = b.input("labels", (4,))
    with b.scope("fc"):
        h = b.apply("linear", x, b.param("weight", (16, 8)), name="linear")
        h = b.apply("bias_add", h, b.param("bias", (16,)), name="bias_add")
    h = b.apply("relu", h, name="act")
    b.apply("cross_entropy", h, labels, name="loss")
    return b.build()


def _copy(name: str, src: str, dst: str, n: int = 4) -> Op:
    """A hand-built `d -> d` op from tensor `src` to tensor `dst`."""
    sig = Signature.parse("d -> d", {"d": n})
    return Op(name, "identity", sig, (src,), (dst,))


def test_built_graph_indexes():
    g = _mlp()
    assert [op.name for op in g.ops] == ["fc.linear", "fc.bias_add", "act", "loss"]
    assert g.producer["act"] == 2
    assert g.consumers["x"] == ((0, 0),)
    assert g.consumers["labels"] == ((3, 1),)
    assert g.outputs == ("loss",)
    assert g.op("fc.linear").layer == "fc"
    assert g.op("act").layer == ""
    assert g.tensor("fc.weight").role is Role.PARAMETER
    assert g.tensor("x").role is Role.INPUT
    assert g.tensor("act").role is Role.ACTIVATION
    assert g.tensor("loss").shape == ()
    assert g.num_params == 16 * 8 + 16
    assert g.param_bytes == 4 * g.num_params
    assert g.flops == sum(op.flops for op in g.ops)
    assert g.op("fc.linear").flops == 2 * 4 * 8 * 16


def test_requires_grad_follows_parameters():
    g = _mlp()
    assert {"fc.weight", "fc.bias", "fc.linear", "act", "loss"} <= g.requires_grad
    assert "x" not in g.requires_grad and "labels" not in g.requires_grad


def test_graph_is_immutable():
    g = _mlp()
    with pytest.raises(TypeError):
        g.tensors["y"] = Tensor("y", (1,))  # type: ignore[index]
    with pytest.raises(AttributeError):
        g.name = "other"  # type: ignore[misc]


def test_fresh_names_and_scopes():
    b = GraphBuilder("g")
    x = b.input("x", (2, 3))
    with b.scope("block"), b.scope("inner"):
        y = b.apply("relu", x)
        p = b.param("w", (3,))
    assert y.startswith("block.inner.relu")
    assert p == "block.inner.w"
    g = b.build()
    assert g.op(y).layer == "block.inner"


def test_ops_added_out_of_order_are_sorted_topologically():
    b = GraphBuilder("g")
    b.input("x", (4,))
    for t in ("a", "c"):
        b.add_tensor(Tensor(t, (4,)))
    b.add_op(_copy("second", "a", "c"))
    b.add_op(_copy("first", "x", "a"))
    g = b.build()
    assert [op.name for op in g.ops] == ["first", "second"]
    assert g.op_index == {"first": 0, "second": 1}


def test_attrs_are_sorted_and_readable():
    b = GraphBuilder("g")
    x = b.input("x", (2, 3, 4))
    y = b.apply("softmax", x, axis=1, name="sm")
    op = b.build().op(y)
    assert op.attr("axis") == 1
    assert op.attr("missing", 7) == 7
    op2 = Op(
        "o",
        "identity",
        Signature.parse("d -> d", {"d": 4}),
        ("x",),
        ("y",),
        attrs=(("z", 1), ("a", 2)),
    )
    assert op2.attrs == (("a", 2), ("z", 1))


# -- errors ------------------------------------------------------------------------------------


def test_cycle_raises_cycle_error_naming_ops():
    b = GraphBuilder("loop")
    for t in ("a", "c"):
        b.add_tensor(Tensor(t, (4,)))
    b.add_op(_copy("ping", "c", "a"))
    b.add_op(_copy("pong", "a", "c"))
    with pytest.raises(
        CycleError, match=r"graph 'loop' has a cycle through ops \['ping', 'pong'\]"
    ):
        b.build()


def test_self_loop_is_a_cycle():
    b = GraphBuilder("self")
    b.add_tensor(Tensor("a", (4,)))
    b.add_op(Op("inc", "add", Signature.parse("d, d -> d", {"d": 4}), ("a", "a"), ("a",)))
    with pytest.raises(CycleError, match="'inc'"):
        b.build()


def test_verify_rejects_use_before_production():
    tensors = {
        "x": Tensor("x", (4,), role=Role.INPUT),
        "a": Tensor("a", (4,)),
        "c": Tensor("c", (4,)),
    }
    ops = (_copy("late", "a", "c"), _copy("early", "x", "a"))
    with pytest.raises(CycleError, match="op 'late' uses 'a' before it is produced by 'early'"):
        verify(make_graph("g", tensors, ops))


def test_dangling_activation_input():
    b = GraphBuilder("g")
    b.add_tensor(Tensor("ghost", (4,)))
    b.add_tensor(Tensor("out", (4,)))
    b.add_op(_copy("use", "ghost", "out"))
    with pytest.raises(IRError, match="op 'use': input 'ghost' is a dangling activation"):
        b.build()


def test_unproduced_activation():
    b = GraphBuilder("g")
    x = b.input("x", (4,))
    b.apply("relu", x, name="r")
    b.add_tensor(Tensor("orphan", (4,)))
    with pytest.raises(IRError, match="activation 'orphan' is never produced"):
        b.build()


def test_duplicate_tensor_names():
    b = GraphBuilder("g")
    b.input("x", (4,))
    with pytest.raises(IRError, match="tensor 'x' is defined twice in graph 'g'"):
        b.param("x", (4,))
    with b.scope("s"):
        b.param("w", (4,))
        with pytest.raises(IRError, match="tensor 's.w' is defined twice"):
            b.param("w", (4,))


def test_duplicate_op_names():
    b = GraphBuilder("g")
    b.input("x", (4,))
    b.add_tensor(Tensor("a", (4,)))
    b.add_tensor(Tensor("c", (4,)))
    b.add_op(_copy("copy", "x", "a"))
    with pytest.raises(IRError, match="op name 'copy' is used twice in graph 'g'"):
        b.add_op(_copy("copy", "a", "c"))


def test_apply_twice_with_one_name():
    b = GraphBuilder("g")
    x = b.input("x", (4,))
    b.apply("relu", x, name="r")
    with pytest.raises(IRError, match="'r'"):
        b.apply("relu", x, name="r")


def test_tensor_produced_twice():
    b = GraphBuilder("g")
    b.input("x", (4,))
    b.add_tensor(Tensor("a", (4,)))
    b.add_op(_copy("one", "x", "a"))
    b.add_op(_copy("two", "x", "a"))
    with pytest.raises(IRError, match="tensor 'a' is produced by both 'one' and 'two'"):
        b.build()


def test_op_must_not_write_a_parameter():
    b = GraphBuilder("g")
    b.input("x", (4,))
    b.param("w", (4,))
    b.add_op(_copy("clobber", "x", "w"))
    with pytest.raises(IRError, match="op 'clobber' writes 'w', which is a parameter"):
        b.build()


def test_unknown_operand_tensor():
    b = GraphBuilder("g")
    with pytest.raises(IRError, match="tensor 'nope' is not defined yet in graph 'g'"):
        b.apply("relu", "nope")
    b.input("x", (4,))
    b.add_op(_copy("copy", "x", "missing"))
    with pytest.raises(
        IRError, match="op 'copy' \\(identity\\): output 0 names unknown tensor 'missing'"
    ):
        b.build()


def test_shape_mismatch_from_apply_names_the_op():
    b = GraphBuilder("g")
    x = b.input("x", (4, 8))
    w = b.param("w", (16, 7))
    with pytest.raises(ShapeError, match=r"op 'fc' \(linear\): linear: contraction sizes differ"):
        b.apply("linear", x, w, name="fc")


def test_shape_mismatch_in_a_hand_built_op_names_op_and_tensor():
    b = GraphBuilder("g")
    b.input("x", (4,))
    b.add_tensor(Tensor("y", (5,)))
    b.add_op(_copy("copy", "x", "y", n=4))
    with pytest.raises(ShapeError, match=r"op 'copy' \(identity\): output 0 'y' dim 0 has size 5"):
        b.build()


def test_rank_mismatch_names_op_and_tensor():
    b = GraphBuilder("g")
    b.input("x", (4, 2))
    b.add_tensor(Tensor("y", (4,)))
    b.add_op(_copy("copy", "x", "y"))
    with pytest.raises(ShapeError, match="op 'copy' \\(identity\\): input 0 'x' has rank 2"):
        b.build()


def test_window_input_groups_match_the_declared_span():
    b = GraphBuilder("g")
    x = b.input("x", (1, 1, 8, 8))
    b.apply("pool2d", x, kernel=2, name="pool")
    assert b.build().tensor("pool").shape == (1, 1, 4, 4)
    for span, ok in ((9, True), (0, False), (10, False)):
        b2 = GraphBuilder("g2")
        b2.input("x", (1, 9))
        b2.add_tensor(Tensor("y", (1, 5)))
        sig = Signature.parse(
            "n y -> n y", {"n": 1, "y": 5}, {"y": DimKind.WINDOW}, spans={"y": span}
        )
        b2.add_op(Op("win", "pool2d", sig, ("x",), ("y",)))
        if ok:
            b2.build()
        else:
            with pytest.raises(ShapeError, match="WINDOW loop dim 'y' declares span"):
                b2.build()


def test_op_operand_count_must_match_signature():
    sig = Signature.parse("d, d -> d", {"d": 4})
    with pytest.raises(IRError, match="op 'bad' \\(add\\): 1 inputs but the signature"):
        Op("bad", "add", sig, ("x",), ("y",))
    with pytest.raises(IRError, match="op 'bad' \\(add\\): 2 outputs"):
        Op("bad", "add", sig, ("x", "x"), ("y", "z"))


def test_unknown_op_kind_names_the_kind():
    b = GraphBuilder("g")
    x = b.input("x", (4,))
    with pytest.raises(UnsupportedOpError, match="op kind 'frobnicate' is not in the catalogue"):
        b.apply("frobnicate", x, name="frob")


def test_unknown_op_kind_names_the_op_instance():
    b = GraphBuilder("g")
    x = b.input("x", (4,))
    with pytest.raises(UnsupportedOpError, match="'frob'"):
        b.apply("frobnicate", x, name="frob")


def test_add_op_needs_declared_outputs():
    b = GraphBuilder("g")
    b.input("x", (4,))
    b.add_op(_copy("copy", "x", "y"))
    with pytest.raises(IRError, match="op 'copy'.*unknown tensor 'y'"):
        b.build()


@pytest.mark.parametrize(
    ("shape", "dtype_bytes", "match"),
    [
        ((4, 0), 4, r"tensor 't' has shape \(4, 0\); every dim must be in \[1, 2\*\*48\]"),
        ((4,), 0, "tensor 't': dtype_bytes 0 must be >= 1"),
    ],
)
def test_bad_tensors(shape, dtype_bytes, match):
    with pytest.raises(IRError, match=match):
        Tensor("t", shape, dtype_bytes)


def test_lookup_of_missing_op_or_tensor():
    g = _mlp()
    with pytest.raises(IRError, match="graph 'tiny' has no op 'nope'"):
        g.op("nope")
    with pytest.raises(IRError, match="graph 'tiny' has no tensor 'nope'"):
        g.tensor("nope")
