"""apply_plan: plans of plain-JAX functions (from_jaxpr) run on 8 fake XLA devices with the
numerics of the unsharded function."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from jax_functions import block_args, mlp, mlp_args, normal, transformer_block  # noqa: E402

from shardplan.engines.jaxpr import apply_plan  # noqa: E402
from shardplan.errors import PlanError  # noqa: E402
from shardplan.importers._build import ReplicatedOpsWarning  # noqa: E402
from shardplan.importers.jaxpr import from_jaxpr  # noqa: E402
from shardplan.ir.traits import OPAQUE_KIND  # noqa: E402
from shardplan.search import plan  # noqa: E402


@pytest.mark.parametrize("method", ["drec", "data-parallel", "megatron"])
def test_mlp_plans_run_sharded_with_unsharded_numerics(devices8, method):
    args = mlp_args()
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
    args = mlp_args()
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


@pytest.mark.parametrize("method", ["drec", "data-parallel", "megatron"])
def test_transformer_block_runs_sharded_with_unsharded_numerics(devices8, method):
    args = block_args()
    g = from_jaxpr(transformer_block, *args)
    p = plan(g, "8", method)
    got = float(apply_plan(transformer_block, p)(*args))
    want = float(jax.jit(transformer_block)(*args))
    assert got == pytest.approx(want, rel=1e-5)


def test_apply_plan_on_a_2x4_mesh_and_mesh_override(devices8):
    args = block_args()
    g = from_jaxpr(transformer_block, *args)
    p = plan(g, "2x4", "megatron")
    want = float(jax.jit(transformer_block)(*args))
    assert float(apply_plan(transformer_block, p)(*args)) == pytest.approx(want, rel=1e-5)
    assert float(apply_plan(transformer_block, p, mesh="8")(*args)) == pytest.approx(want, rel=1e-5)
    with pytest.raises(PlanError, match="rounds"):
        apply_plan(transformer_block, p, mesh="6")


def test_apply_plan_rejects_a_plan_of_another_function(devices8):
    p = plan(from_jaxpr(mlp, *mlp_args()), "8", "data-parallel")
    with pytest.raises(PlanError, match="another graph"):
        apply_plan(mlp, p)(*mlp_args(sizes=(32, 64, 64, 8)))


def test_opaque_ops_plan_and_run(devices8):
    def f(p, x):
        return jnp.sum(jnp.cumsum(jnp.tanh(x @ p), axis=1))

    args = (normal(np.random.default_rng(2), 16, 16), normal(np.random.default_rng(3), 8, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReplicatedOpsWarning)
        g = from_jaxpr(f, *args, unknown="replicate")
    p = plan(g, "8", "data-parallel")
    opaque = next(op for op in g.ops if op.kind == OPAQUE_KIND)
    assert p.strategies[opaque.name] == (None, None, None)
    assert float(apply_plan(f, p)(*args)) == pytest.approx(float(f(*args)), rel=1e-5)
