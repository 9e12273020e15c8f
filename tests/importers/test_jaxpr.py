"""from_jaxpr: plain-JAX functions become graphs the planner can use (running their plans:
tests/engines/test_jaxpr.py)."""

from __future__ import annotations

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from jax_functions import block_args, mlp, mlp_args, transformer_block  # noqa: E402

from shardplan.errors import UnsupportedOpError  # noqa: E402
from shardplan.importers._build import ReplicatedOpsWarning  # noqa: E402
from shardplan.importers.jaxpr import (  # noqa: E402
    RULES,
    from_jaxpr,
    import_jaxpr,
)
from shardplan.ir.dims import DimKind  # noqa: E402
from shardplan.ir.op import Role  # noqa: E402
from shardplan.ir.traits import OPAQUE_KIND  # noqa: E402

# -- a plain-JAX MLP ------------------------------------------------------------------------------


def test_mlp_graph_names_roles_and_kinds():
    params, x, targets = mlp_args()
    g = from_jaxpr(mlp, params, x, targets)
    assert g.name == "mlp"
    roles = {n: t.role for n, t in g.tensors.items()}
    assert {n for n, r in roles.items() if r is Role.PARAMETER} == {
        f"layers.{i}.{k}" for i in range(3) for k in "wb"
    }
    assert roles["x"] is Role.INPUT and roles["targets"] is Role.INPUT
    assert g.num_params == sum(int(np.prod(v.shape)) for v in jax.tree_util.tree_leaves(params))
    kinds = [op.kind for op in g.ops]
    assert kinds.count("matmul") == 3 and kinds.count("maximum") == 3  # 2 relu + log_softmax
    assert {"reduce_max", "reduce_sum", "exp", "sub", "div", "neg"} <= set(kinds)
    first = g.ops[0]
    assert first.name == "fc0.dot_general1" and first.layer == "fc0"
    assert first.inputs == ("x", "layers.0.w")
    assert g.tensors[g.outputs[0]].shape == ()


# -- a transformer block (no flax / equinox) ------------------------------------------------------


def test_transformer_block_import():
    imported = import_jaxpr(transformer_block, *block_args())
    g = imported.graph
    kinds = [op.kind for op in g.ops]
    assert kinds.count("bmm") == 2  # scores and context (leading batch dims b, h)
    assert kinds.count("matmul") == 6
    assert "reshape" in kinds and "transpose" in kinds and "tanh" in kinds
    assert {op.layer for op in g.ops} >= {"attn", "mlp"}
    assert imported.replicated == ()
    assert set(imported.approximated) <= {"select_n", "ge", "lt", "integer_pow"}  # x**3 (gelu)
    # the causal mask is computed from constants only: folded into a CONSTANT tensor
    assert any(t.role is Role.CONSTANT and t.shape == (16, 16) for t in g.tensors.values())
    scores = next(op for op in g.ops if op.kind == "bmm")
    assert scores.attr("transpose_b") is True


# -- the translation table ------------------------------------------------------------------------


def _kinds(fn, *args):
    return [op.kind for op in from_jaxpr(fn, *args).ops]


def test_dot_general_forms():
    w = jnp.ones((8, 4))
    x = jnp.ones((2, 3, 8))
    assert _kinds(lambda p, x: x @ p, w, x) == ["matmul"]
    assert _kinds(
        lambda p, x: jax.lax.dot_general(x, p, (((2,), (1,)), ((), ()))), jnp.ones((4, 8)), x
    ) == ["linear"]
    assert _kinds(lambda p, x: x @ p.T, jnp.ones((4, 8)), x) == ["transpose", "matmul"]
    assert _kinds(lambda p, x: jnp.einsum("bij,bjk->bik", x, p), jnp.ones((2, 8, 5)), x) == ["bmm"]
    g = from_jaxpr(lambda p, x: jnp.einsum("bsh,hb->s", x, p), jnp.ones((8, 2)), x)
    (op,) = g.ops
    assert op.kind == "einsum" and g.tensors[op.outputs[0]].shape == (3,)
    reduced = {d.name for d in op.signature.loop_dims if d.kind is DimKind.REDUCE}
    assert len(reduced) == 2  # h contracted; b a batch dim summed away


def test_conv_forms():
    w = jnp.ones((4, 3, 3, 3))
    x = jnp.ones((2, 3, 8, 8))

    def nchw(p, x):
        return jax.lax.conv_general_dilated(x, p, (2, 2), ((1, 1), (1, 1)))

    g = from_jaxpr(nchw, w, x)
    (op,) = g.ops
    assert op.kind == "conv2d" and op.attr("stride") == (2, 2) and op.attr("padding") == (1, 1)
    assert g.tensors[op.outputs[0]].shape == (2, 4, 4, 4)

    def nhwc(p, x):
        return jax.lax.conv_general_dilated(
            x, p, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
        )

    kinds = _kinds(nhwc, jnp.ones((3, 3, 3, 4)), jnp.ones((2, 8, 8, 3)))
    assert kinds == ["transpose", "transpose", "conv2d", "transpose"]

    def dilated(p, x):
        return jax.lax.conv_general_dilated(x, p, (1, 1), "VALID", rhs_dilation=(2, 2))

    with pytest.raises(UnsupportedOpError, match="dilation"):
        from_jaxpr(dilated, w, x)


def test_broadcast_is_an_exact_add_of_a_small_zeros_constant():
    g = from_jaxpr(lambda p, x: x + p[:, None], jnp.ones((3,)), jnp.ones((3, 5)))
    kinds = [op.kind for op in g.ops]
    assert kinds == ["reshape", "add"]
    g = from_jaxpr(lambda p, x: x * jnp.broadcast_to(p, (4, 3)), jnp.ones((3,)), jnp.ones((4, 3)))
    add = next(op for op in g.ops if op.kind == "add")
    zeros = add.inputs[1]
    assert g.tensors[zeros].role is Role.CONSTANT and g.tensors[zeros].shape == (4, 1)


def test_sub_jaxprs_are_inlined():
    @jax.custom_vjp
    def scaled(x):
        return 2.0 * x

    scaled.defvjp(lambda x: (2.0 * x, None), lambda _, g: (2.0 * g,))

    @jax.jit
    def inner(x, w):
        return jax.nn.relu(x @ w)

    def f(p, x):
        return jax.checkpoint(lambda y: scaled(inner(y, p)))(x)

    kinds = _kinds(f, jnp.ones((4, 4)), jnp.ones((2, 4)))
    assert kinds == ["matmul", "maximum", "mul"]


def test_unknown_primitive_is_named_or_replicated():
    def f(p, x):
        return jnp.cumsum(x @ p, axis=0)

    args = (jnp.ones((4, 4)), jnp.ones((8, 4)))
    with pytest.raises(UnsupportedOpError, match="'cumsum'"):
        from_jaxpr(f, *args)
    with pytest.warns(ReplicatedOpsWarning, match="cumsum"):
        imported = import_jaxpr(f, *args, unknown="replicate")
    op = imported.graph.ops[-1]
    assert op.kind == OPAQUE_KIND and op.attr("primitive") == "cumsum"
    assert all(d.kind is DimKind.FROZEN for d in op.signature.loop_dims)
    assert imported.replicated == (f"{op.name} (cumsum)",)
    with pytest.raises(ValueError, match="unknown"):
        from_jaxpr(f, *args, unknown="ignore")


def test_one_table_keyed_by_primitive():
    for prim in (
        "dot_general",
        "conv_general_dilated",
        "add",
        "sub",
        "mul",
        "div",
        "max",
        "tanh",
        "exp",
        "logistic",
        "reduce_sum",
        "reduce_max",
        "reshape",
        "transpose",
        "broadcast_in_dim",
        "integer_pow",
        "concatenate",
        "gather",
    ):
        assert prim in RULES, prim


def test_integer_pow_two_is_an_exact_mul():
    g = from_jaxpr(lambda p, x: (x @ p) ** 2, jnp.ones((3, 3)), jnp.ones((2, 3)))
    sq = g.ops[-1]
    assert sq.kind == "mul" and sq.inputs[0] == sq.inputs[1]


def test_embedding_lookup_is_an_embedding():
    g = from_jaxpr(
        lambda p, ids: p["table"][ids].sum(),
        {"table": jnp.ones((10, 4))},
        jnp.zeros((2, 3), jnp.int32),
    )
    assert "embedding" in [op.kind for op in g.ops]
    assert g.tensors["table"].role is Role.PARAMETER and g.tensors["ids"].role is Role.INPUT
