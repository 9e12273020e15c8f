"""Signatures and loop dims: parsing, groups, validation errors (shardplan.ir.signature/dims)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplan.errors import IRError, SignatureError
from shardplan.ir.dims import DimKind, LoopDim, Reducer
from shardplan.ir.signature import (
    Signature,
    group_extent,
    loop_names,
    major_positions,
    parse_operands,
)

REDUCE = DimKind.REDUCE


def test_parse_linear_orders_dims_results_first():
    sig = Signature.parse("b s k, n k -> b s n", {"b": 2, "s": 3, "k": 4, "n": 5}, {"k": REDUCE})
    assert [d.name for d in sig.loop_dims] == ["b", "s", "n", "k"]
    assert sig.inputs == ((("b",), ("s",), ("k",)), (("n",), ("k",)))
    assert sig.outputs == ((("b",), ("s",), ("n",)),)
    assert sig.loop_dim("k").kind is REDUCE
    assert sig.loop_dim("k").reducer is Reducer.SUM
    assert sig.loop_dim("n").kind is DimKind.PARALLEL
    assert sig.extents == {"b": 2, "s": 3, "n": 5, "k": 4}
    assert sig.text() == "b s k, n k -> b s n"


def test_parse_groups_and_broadcast_dims():
    sig = Signature.parse("b s (h d), () -> b s h d", {"b": 2, "s": 3, "h": 4, "d": 8})
    assert sig.inputs[0] == (("b",), ("s",), ("h", "d"))
    assert sig.inputs[1] == ((),)
    assert sig.text() == "b s (h d), () -> b s h d"
    # the major loop dim of a group is its first one; minor loop dims are absent
    assert major_positions(sig.inputs[0]) == {"b": 0, "s": 1, "h": 2}
    assert major_positions(sig.inputs[1]) == {}
    assert loop_names(sig.inputs[0]) == {"b", "s", "h", "d"}
    assert group_extent(("h", "d"), sig.extents) == 32
    assert group_extent((), sig.extents) == 1


def test_parse_window_halo_and_reducer():
    sig = Signature.parse("n y, r -> n y", {"n": 2, "y": 8, "r": 3},
                          {"y": DimKind.WINDOW, "r": REDUCE}, halos={"y": 2},
                          reducers={"r": Reducer.MAX})
    assert sig.loop_dim("y").halo == 2
    assert sig.loop_dim("r").reducer is Reducer.MAX


def test_scalar_result_and_no_inputs():
    sig = Signature.parse("d0 v -> ", {"d0": 4, "v": 10}, {"d0": REDUCE, "v": DimKind.FROZEN})
    assert sig.outputs == ((),)
    assert Signature.parse(" -> m", {"m": 3}).inputs == ()


def test_loop_dim_defaults_and_splittable():
    assert LoopDim("k", 4, REDUCE).reducer is Reducer.SUM
    assert LoopDim("m", 4).splittable
    assert not LoopDim("t", 4, DimKind.FROZEN).splittable
    assert LoopDim("y", 4, DimKind.WINDOW, halo=2).splittable


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("k", 0), "'k' has extent 0"),
        (("1k", 4), "'1k' must be an identifier"),
        (("m", 4, DimKind.PARALLEL, Reducer.SUM), "'m': a reducer needs kind REDUCE"),
        (("y", 4, DimKind.WINDOW, None, -1), "'y': halo -1"),
    ],
)
def test_bad_loop_dims(args, match):
    with pytest.raises(SignatureError, match=match):
        LoopDim(*args)


def test_unknown_loop_dim_in_operand():
    with pytest.raises(SignatureError, match="input 1 uses loop dim 'z' that is not declared"):
        Signature((LoopDim("m", 2), LoopDim("k", 3, REDUCE)),
                  ((("m",), ("k",)), (("z",),)), ((("m",),),))


def test_unknown_loop_dim_in_parse_has_no_extent():
    with pytest.raises(SignatureError, match=r"no extent for loop dims \['z'\]"):
        Signature.parse("m z -> m", {"m": 2})


def test_extent_or_kind_for_an_unused_name():
    with pytest.raises(SignatureError, match="loop dim 'q' is given but not used"):
        Signature.parse("m -> m", {"m": 2, "q": 3})
    with pytest.raises(SignatureError, match="loop dim 'q' is given but not used"):
        Signature.parse("m -> m", {"m": 2}, {"q": REDUCE})


def test_duplicate_loop_dim_names():
    with pytest.raises(SignatureError, match=r"duplicate loop dim names in \['m', 'm'\]"):
        Signature((LoopDim("m", 2), LoopDim("m", 2)), ((("m",),),), ((("m",),),))


def test_loop_dim_used_twice_in_one_operand():
    with pytest.raises(SignatureError, match="input 0 uses loop dim 'm' twice"):
        Signature.parse("m m -> m", {"m": 2})
    with pytest.raises(SignatureError, match="output 0 uses loop dim 'h' twice"):
        Signature.parse("h -> (h h)", {"h": 2})


def test_reduce_dim_in_a_result():
    with pytest.raises(SignatureError, match="REDUCE loop dim 'k' must not index a result"):
        Signature.parse("m k -> m k", {"m": 2, "k": 3}, {"k": REDUCE})


def test_parallel_dim_missing_from_result():
    with pytest.raises(SignatureError, match="PARALLEL loop dim 'k' must index every result"):
        Signature.parse("m k -> m", {"m": 2, "k": 3})
    with pytest.raises(SignatureError, match="WINDOW loop dim 'y' must index every result"):
        Signature.parse("y -> y, ()", {"y": 2}, {"y": DimKind.WINDOW})


def test_unused_declared_loop_dim():
    with pytest.raises(SignatureError, match=r"loop dims \['q'\] index no tensor"):
        Signature((LoopDim("m", 2), LoopDim("q", 2)), ((("m",),),), ((("m",),),))


@pytest.mark.parametrize("spec", ["m k, k n", "m -> m -> m", ""])
def test_arrow_count(spec):
    with pytest.raises(SignatureError, match="needs exactly one '->'"):
        Signature.parse(spec, {})


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("((a b) c)", "nested parentheses"),
        ("a b)", r"unbalanced '\)'"),
        ("(a b", r"unbalanced '\('"),
        ("a 1", r"unexpected '1'"),
        ("a + b", r"unexpected '\+'"),
    ],
)
def test_bad_operand_text(text, match):
    with pytest.raises(SignatureError, match=match):
        parse_operands(text)


def test_loop_dim_lookup_names_what_exists():
    sig = Signature.parse("m -> m", {"m": 2})
    with pytest.raises(SignatureError, match=r"no loop dim 'x'; have \['m'\]"):
        sig.loop_dim("x")


def test_signature_error_is_an_ir_error():
    assert issubclass(SignatureError, IRError)


_NAMES = [f"l{i}" for i in range(8)]


@st.composite
def grouped_operand(draw):
    """A permutation of some loop names, chopped into groups (some of them parenthesised)."""
    names = draw(st.permutations(_NAMES))[: draw(st.integers(1, 6))]
    groups, i = [], 0
    while i < len(names):
        size = draw(st.integers(1, 3))
        groups.append(tuple(names[i:i + size]))
        i += size
    return tuple(groups)


@settings(max_examples=100, deadline=None)
@given(grouped_operand(), st.data())
def test_text_round_trip(operand, data):
    names = sorted({n for g in operand for n in g})
    extents = {n: data.draw(st.integers(1, 9)) for n in names}
    sig = Signature.parse(f"{_fmt(operand)} -> {_fmt(operand)}", extents)
    assert sig.inputs == (operand,) and sig.outputs == (operand,)
    again = Signature.parse(sig.text(), extents)
    assert again == sig


def _fmt(operand):
    return " ".join(g[0] if len(g) == 1 else "(" + " ".join(g) + ")" for g in operand)


def test_equal_signatures_hash_alike_and_survive_pickling():
    """Signatures compare by value (their fields as plain values, made once) and pickle without
    a stale key: another process hashes strings under another seed."""
    import copy
    import pickle
    from dataclasses import replace

    a = Signature.parse("m k, n k -> m n", {"m": 4, "k": 8, "n": 2}, {"k": REDUCE})
    b = Signature.parse("m k, n k -> m n", {"m": 4, "k": 8, "n": 2}, {"k": REDUCE})
    c = Signature.parse("m k, n k -> m n", {"m": 4, "k": 8, "n": 3}, {"k": REDUCE})
    assert a == b and hash(a) == hash(b) and a is not b
    assert a != c and {a: 1}.get(c) is None and a != "m k, n k -> m n"
    for copied in (pickle.loads(pickle.dumps(a)), copy.deepcopy(a), replace(a)):
        assert copied == a and hash(copied) == hash(a)
    assert pickle.loads(pickle.dumps(a))._key is None  # made again where it is used
    assert repr(a) == repr(b) and "_key" not in repr(a)
