"""The JAX engine's MoE top-k: the order of `jax.lax.top_k`, and no collective when tokens split.

XLA's SPMD partitioner replicates the TopK custom call that `jax.lax.top_k` lowers to: with the
groups split over 8 devices it all-gathers the whole router output first (229,376 B per device
at 64 x 128 x 8 float32, the zoo `moe` at batch 64 x 128 in benchmarks/moe_expert_parallel.py),
although the plan's layout (e whole) needs none. The engine's kernel ranks by comparisons instead.
"""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")

from shardplan.engines import jax as jb  # noqa: E402
from shardplan.fidelity.hlo import parse_collectives  # noqa: E402
from shardplan.ir.graph import GraphBuilder  # noqa: E402
from shardplan.ir.op import Role  # noqa: E402
from shardplan.zoo.layers import dense  # noqa: E402

from .kernel_cases import single_op_graph  # noqa: E402


def _run(kind: str, probs: np.ndarray, **attrs) -> np.ndarray:
    graph, names, out = single_op_graph(kind, [probs], attrs)
    return np.asarray(jb.forward_fn(graph)({}, {names[0]: probs})[out])


@pytest.mark.parametrize("experts", [1, 3, 8])
def test_topk_orders_like_a_stable_descending_sort_with_ties(experts):
    # few distinct values: most rows have ties, which go to the lower expert id first
    probs = np.random.default_rng(experts).integers(0, 3, (2, 16, experts)).astype(np.float32)
    for k in range(1, experts + 1):
        order = np.argsort(-probs, axis=-1, kind="stable")[..., :k]
        ids = _run("moe_topk_ids", probs, k=k)
        assert ids.dtype == np.int32
        np.testing.assert_array_equal(ids, order)
        weights = _run("moe_topk_weights", probs, k=k)
        np.testing.assert_array_equal(weights, np.take_along_axis(probs, order, -1))


def _router(groups: int, tokens: int, hidden: int, experts: int):
    """x -> linear -> softmax -> top-2 ids and weights; the loss reads the weights (a gradient
    flows back through the top-k into the router weight)."""
    b = GraphBuilder("router")
    x = b.input("x", (groups, tokens, hidden))
    probs = b.apply("softmax", dense(b, x, experts, "router", bias=False), name="probs")
    b.apply("moe_topk_ids", probs, k=2, name="topk_ids")
    weights = b.apply("moe_topk_weights", probs, k=2, name="topk_weights")
    b.apply("reduce_sum", b.apply("mul", weights, weights, name="square"), name="loss")
    return b.build()


@pytest.mark.parametrize("train", [False, True])
def test_topk_with_split_groups_sends_nothing(devices8, train):
    graph = _router(groups=64, tokens=128, hidden=16, experts=8)
    split = (0, 0, 0)  # the groups dim on all three rounds of mesh 8
    layouts = {n: split for n, t in graph.tensors.items() if t.role is Role.ACTIVATION and t.shape}
    text = jb.compiled_text(graph, "8", {}, {"x": split}, layouts, train=train)
    collectives = parse_collectives(text)
    # the loss (and, training, the router weight's gradient) is reduced; nothing is gathered
    assert {c.kind for c in collectives} == {"all-reduce"}, collectives
    assert not [c for c in collectives if "topk" in c.op_name], collectives
    params, inputs = jb.init_params(graph), jb.make_inputs(graph)
    got = jb.sharded_call(graph, "8", {}, {"x": split}, layouts, params, inputs)
    want = jax.jit(jb.forward_fn(graph))(params, inputs)
    np.testing.assert_array_equal(np.asarray(got["topk_ids"]), np.asarray(want["topk_ids"]))
    np.testing.assert_allclose(float(got["loss"]), float(want["loss"]), rtol=1e-5)
