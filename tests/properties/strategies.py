"""Hypothesis generators: graphs built through the public builder, meshes, corrupt values.

Graphs are chains and DAGs of catalogue ops on small sizes with primes and 1s (so cuts often do
not divide), with shared tensors (one activation read by several ops, one parameter read twice)
and unused ones (an input or parameter no op reads). Meshes include primes and 3-axis meshes.
"""

from __future__ import annotations

import math

from hypothesis import strategies as st

from shardplan.ir.graph import Graph, GraphBuilder

SIZES = st.sampled_from([1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16])
MESHES = st.sampled_from(
    ["1", "2", "3", "4", "5", "6", "7", "8", "12", "16", "2x3", "3x2", "2x2x2", "2x3x2", "4x4"]
)
PRESETS = st.sampled_from(["shardplan", "mindspore"])


@st.composite
def graphs(draw, max_ops: int = 6) -> Graph:
    """A verified graph of 1..max_ops ops (see the module doc)."""
    b = GraphBuilder("prop")
    rank = draw(st.integers(2, 3))
    shape = tuple(draw(SIZES) for _ in range(rank))
    live = [b.input("x", shape)]  # activations (and the input) ops may read
    if draw(st.booleans()):
        b.input("unused_input", (draw(SIZES),))
    if draw(st.booleans()):
        b.param("unused_param", (draw(SIZES), draw(SIZES)))
    shared_w = None
    for i in range(draw(st.integers(1, max_ops))):
        x = draw(st.sampled_from(live))  # not always the last one: a DAG with shared tensors
        xs = b.shape(x)
        kind = draw(
            st.sampled_from(
                [
                    "linear",
                    "unary",
                    "add",
                    "layer_norm",
                    "softmax",
                    "reshape",
                    "transpose",
                    "reduce",
                    "matmul_shared",
                    "attention",
                ]
            )
        )
        name = f"op{i}"
        if kind == "linear":
            w = b.param(f"w{i}", (draw(SIZES), xs[-1]))
            y = b.apply("linear", x, w, name=name)
        elif kind == "matmul_shared":  # one parameter read by several ops
            if shared_w is None or b.shape(shared_w)[1] != xs[-1]:
                shared_w = b.param(f"ws{i}", (xs[-1], xs[-1]))
            y = b.apply("linear", x, shared_w, name=name)
        elif kind == "unary":
            y = b.apply(draw(st.sampled_from(["relu", "neg", "gelu"])), x, name=name)
        elif kind == "add":
            same = [t for t in live if b.shape(t) == xs]
            y = b.apply("add", x, draw(st.sampled_from(same)), name=name)
        elif kind == "layer_norm":
            y = b.apply("layer_norm", x, b.param(f"g{i}", (xs[-1],)), name=name)
        elif kind == "softmax":
            y = b.apply("softmax", x, name=name)
        elif kind == "reshape":
            if len(xs) >= 2 and draw(st.booleans()):
                target = (*xs[:-2], xs[-2] * xs[-1])  # merge the last two dims
            else:
                last = xs[-1]
                split = next((d for d in (2, 3, 5) if last % d == 0 and last > d), None)
                target = (*xs[:-1], split, last // split) if split else (*xs, 1)
            y = b.apply("reshape", x, shape=target, name=name)
        elif kind == "attention" and len(xs) >= 2:  # self-attention over the last two dims
            mask = [b.constant(f"mask{i}", (xs[-2], xs[-2]))] if draw(st.booleans()) else []
            y = b.apply("attention", x, x, x, *mask, name=name)
        elif kind == "attention":  # a vector has no sequence to attend over
            y = b.apply("relu", x, name=name)
        elif kind == "transpose":
            perm = tuple(draw(st.permutations(list(range(len(xs))))))
            y = b.apply("transpose", x, perm=perm, name=name)
        else:
            y = b.apply("reduce_sum", x, axes=(len(xs) - 1,), name=name) if len(xs) > 1 else x
        if y not in live:
            live.append(y)
    return b.build()


JSON_JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.sampled_from([math.nan, math.inf, -math.inf, -7, -1, 0, 0.5, 2.5, 1e308]),
    st.text(max_size=8),
    st.lists(st.integers(-3, 3), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    st.integers(1, 200).map(lambda d: [[]] * 0 if d == 0 else _nested(d)),
)


def _nested(depth: int) -> list:
    out: list = []
    for _ in range(depth):
        out = [out]
    return out
