"""from_jaxpr / apply_plan: plain-JAX functions become graphs the planner can use, and the plans
run on 8 fake XLA devices with the numerics of the unsharded function."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from shardplan.engines.jaxpr import apply_plan  # noqa: E402
from shardplan.errors import PlanError, UnsupportedOpError  # noqa: E402
from shardplan.importers._build import ReplicatedOpsWarning  # noqa: E402
from shardplan.importers.jaxpr import (  # noqa: E402
    OPAQUE,
    RULES,
    from_jaxpr,
    import_jaxpr,
)
from shardplan.ir.dims import DimKind  # noqa: E402
from shardplan.ir.op import Role  # noqa: E402
from shardplan.search import plan  # noqa: E402


def _normal(rng, *shape, scale=1.0):
    return jnp.asarray(rng.standard_normal(shape) * scale, jnp.float32)


# -- a plain-JAX MLP ------------------------------------------------------------------------------


def mlp(params, x, targets):
    h = x
    for i, layer in enumerate(params["layers"]):
        with jax.named_scope(f"fc{i}"):
            h = h @ layer["w"] + layer["b"]
            if i < len(params["layers"]) - 1:
                h = jax.nn.relu(h)
    logp = jax.nn.log_softmax(h, axis=-1)
    return -jnp.mean(jnp.sum(targets * logp, axis=-1))


def _mlp_args(batch=16, sizes=(32, 64, 64, 16)):
    rng = np.random.default_rng(0)
    params = {
        "layers": [
            {"w": _normal(rng, a, b, scale=0.2), "b": _normal(rng, b, scale=0.1)}
            for a, b in zip(sizes[:-1], sizes[1:], strict=True)
        ]
    }
    x = _normal(rng, batch, sizes[0])
    targets = jax.nn.one_hot(rng.integers(0, sizes[-1], batch), sizes[-1])
    return params, x, targets


def test_mlp_graph_names_roles_and_kinds():
    params, x, targets = _mlp_args()
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


@pytest.mark.parametrize("method", ["drec", "data-parallel", "megatron"])
def test_mlp_plans_run_sharded_with_unsharded_numerics(devices8, method):
    args = _mlp_args()
    g = from_jaxpr(mlp, *args)
    p = plan(g, "8", method)
    sharded = apply_plan(mlp, p)
    want = float(jax.jit(mlp)(*args))
    assert float(sharded(*args)) == pytest.approx(want, rel=1e-5)
    # gradients flow through the constrained program too
    got_g = jax.grad(sharded)(*args)
    want_g = jax.grad(mlp)(*args)
    for a, b in zip(
        jax.tree_util.tree_leaves(got_g), jax.tree_util.tree_leaves(want_g), strict=True
    ):
        np.testing.assert_allclose(
            np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5 * float(np.abs(np.asarray(b)).max())
        )


def test_data_parallel_apply_plan_shards_the_batch(devices8):
    args = _mlp_args()
    g = from_jaxpr(mlp, *args)
    p = plan(g, "8", "data-parallel")
    sharded = apply_plan(mlp, p)
    assert "data-parallel" in sharded.__doc__
    hlo = jax.jit(sharded).lower(*args).compile().as_text()
    from shardplan.fidelity.hlo import parse_collectives

    # the batch is split 8 ways: the mean over it is one scalar all-reduce over all devices
    reduces = [c for c in parse_collectives(hlo) if c.kind == "all-reduce"]
    assert reduces and max(c.group_size for c in reduces) == 8
    assert {c.kind for c in parse_collectives(hlo)} == {"all-reduce"}


# -- a transformer block (no flax / equinox) ------------------------------------------------------


def transformer_block(params, x):
    b, s, d = x.shape
    heads = 4
    hd = d // heads

    def layer_norm(h, g, beta):
        mu = jnp.mean(h, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(h - mu), axis=-1, keepdims=True)
        return (h - mu) * jax.lax.rsqrt(var + 1e-5) * g + beta

    with jax.named_scope("attn"):
        h = layer_norm(x, params["ln1_g"], params["ln1_b"])
        q = (h @ params["wq"]).reshape(b, s, heads, hd).transpose(0, 2, 1, 3)
        k = (h @ params["wk"]).reshape(b, s, heads, hd).transpose(0, 2, 1, 3)
        v = (h @ params["wv"]).reshape(b, s, heads, hd).transpose(0, 2, 1, 3)
        scores = jnp.einsum("bhsd,bhtd->bhst", q, k) / np.sqrt(hd)
        mask = jnp.tril(jnp.ones((s, s), bool))
        scores = jnp.where(mask, scores, -1e9)
        probs = jax.nn.softmax(scores, axis=-1)
        ctx = jnp.einsum("bhst,bhtd->bhsd", probs, v).transpose(0, 2, 1, 3).reshape(b, s, d)
        x = x + ctx @ params["wo"]
    with jax.named_scope("mlp"):
        h = layer_norm(x, params["ln2_g"], params["ln2_b"])
        h = jax.nn.gelu(h @ params["w1"] + params["b1"])
        x = x + h @ params["w2"] + params["b2"]
    return jnp.mean(jnp.square(x))


def _block_args(batch=8, seq=16, d=32):
    rng = np.random.default_rng(1)
    params = {
        "ln1_g": jnp.ones((d,)), "ln1_b": jnp.zeros((d,)),
        "ln2_g": jnp.ones((d,)), "ln2_b": jnp.zeros((d,)),
        "wq": _normal(rng, d, d, scale=0.2), "wk": _normal(rng, d, d, scale=0.2),
        "wv": _normal(rng, d, d, scale=0.2), "wo": _normal(rng, d, d, scale=0.2),
        "w1": _normal(rng, d, 4 * d, scale=0.2), "b1": jnp.zeros((4 * d,)),
        "w2": _normal(rng, 4 * d, d, scale=0.2), "b2": jnp.zeros((d,)),
    }  # fmt: skip
    return params, _normal(rng, batch, seq, d)


def test_transformer_block_import():
    imported = import_jaxpr(transformer_block, *_block_args())
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


@pytest.mark.parametrize("method", ["drec", "data-parallel", "megatron"])
def test_transformer_block_runs_sharded_with_unsharded_numerics(devices8, method):
    args = _block_args()
    g = from_jaxpr(transformer_block, *args)
    p = plan(g, "8", method)
    got = float(apply_plan(transformer_block, p)(*args))
    want = float(jax.jit(transformer_block)(*args))
    assert got == pytest.approx(want, rel=1e-5)


def test_apply_plan_on_a_2x4_mesh_and_mesh_override(devices8):
    args = _block_args()
    g = from_jaxpr(transformer_block, *args)
    p = plan(g, "2x4", "megatron")
    want = float(jax.jit(transformer_block)(*args))
    assert float(apply_plan(transformer_block, p)(*args)) == pytest.approx(want, rel=1e-5)
    assert float(apply_plan(transformer_block, p, mesh="8")(*args)) == pytest.approx(want, rel=1e-5)
    with pytest.raises(PlanError, match="rounds"):
        apply_plan(transformer_block, p, mesh="6")


def test_apply_plan_rejects_a_plan_of_another_function(devices8):
    p = plan(from_jaxpr(mlp, *_mlp_args()), "8", "data-parallel")
    with pytest.raises(PlanError, match="another graph"):
        apply_plan(mlp, p)(*_mlp_args(sizes=(32, 64, 64, 8)))


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
    assert op.kind == OPAQUE and op.attr("primitive") == "cumsum"
    assert all(d.kind is DimKind.FROZEN for d in op.signature.loop_dims)
    assert imported.replicated == (f"{op.name} (cumsum)",)
    with pytest.raises(ValueError, match="unknown"):
        from_jaxpr(f, *args, unknown="ignore")


def test_opaque_ops_plan_and_run(devices8):
    def f(p, x):
        return jnp.sum(jnp.cumsum(jnp.tanh(x @ p), axis=1))

    args = (_normal(np.random.default_rng(2), 16, 16), _normal(np.random.default_rng(3), 8, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReplicatedOpsWarning)
        g = from_jaxpr(f, *args, unknown="replicate")
    p = plan(g, "8", "data-parallel")
    opaque = next(op for op in g.ops if op.kind == OPAQUE)
    assert p.strategies[opaque.name] == (None, None, None)
    assert float(apply_plan(f, p)(*args)) == pytest.approx(float(f(*args)), rel=1e-5)


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
