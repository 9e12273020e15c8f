"""`shardplan.jax.shard`: a plain-JAX transformer block trained under a plan on 8 fake devices,
with PartitionSpecs over the user's mesh axes ("data", "model")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

from shardplan import Mesh, Plan, from_jaxpr  # noqa: E402
from shardplan import plan as make_plan  # noqa: E402
from shardplan.errors import PlanError  # noqa: E402
from shardplan.jax import axis_layouts, partition_specs, shard  # noqa: E402

MESH = Mesh((2, 4), ("data", "model"))


def block(params, x):
    """Pre-norm attention + MLP, mean-square loss (no flax / equinox)."""
    b, s, d = x.shape
    heads, hd = 4, d // 4

    def norm(h, g):
        mu = jnp.mean(h, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(h - mu), axis=-1, keepdims=True)
        return (h - mu) * jax.lax.rsqrt(var + 1e-5) * g

    h = norm(x, params["g1"])
    q = (h @ params["wq"]).reshape(b, s, heads, hd).transpose(0, 2, 1, 3)
    k = (h @ params["wk"]).reshape(b, s, heads, hd).transpose(0, 2, 1, 3)
    v = (h @ params["wv"]).reshape(b, s, heads, hd).transpose(0, 2, 1, 3)
    probs = jax.nn.softmax(jnp.einsum("bhsd,bhtd->bhst", q, k) / np.sqrt(hd), axis=-1)
    ctx = jnp.einsum("bhst,bhtd->bhsd", probs, v).transpose(0, 2, 1, 3).reshape(b, s, d)
    x = x + ctx @ params["wo"]
    h = jax.nn.gelu(norm(x, params["g2"]) @ params["w1"])
    x = x + h @ params["w2"]
    return jnp.mean(jnp.square(x))


def block_args(batch=8, seq=8, d=32):
    rng = np.random.default_rng(0)

    def normal(*shape):
        return jnp.asarray(rng.normal(0, 0.2, shape), jnp.float32)

    params = {"g1": jnp.ones((d,)), "g2": jnp.ones((d,)), "wq": normal(d, d),
              "wk": normal(d, d), "wv": normal(d, d), "wo": normal(d, d),
              "w1": normal(d, 4 * d), "w2": normal(4 * d, d)}  # fmt: skip
    return params, normal(batch, seq, d)


def sgd_steps(loss_fn, params, x, steps=3, lr=0.1):
    losses = []
    grad = jax.value_and_grad(loss_fn)
    for _ in range(steps):
        loss, g = grad(params, x)
        params = jax.tree_util.tree_map(lambda p, dp: p - lr * dp, params, g)
        losses.append(float(loss))
    return losses, params


@pytest.fixture(scope="module")
def block_plan():
    params, x = block_args()
    return make_plan(from_jaxpr(block, params, x), MESH, "megatron")


def test_specs_name_the_users_axes(block_plan):
    specs = partition_specs(block_plan, ("data", "model"))
    assert axis_layouts(block_plan) is not None
    assert str(specs["x"]) == str(jax.sharding.PartitionSpec("data", None, None))
    used = {
        a
        for spec in specs.values()
        for e in spec
        if e
        for a in (e if isinstance(e, tuple) else (e,))
    }
    assert used == {"data", "model"}


def test_three_sgd_steps_equal_unsharded(devices8, block_plan):
    params, x = block_args()
    sharded = shard(block, block_plan)
    assert sharded.axis_names == ("data", "model")
    assert dict(sharded.mesh.shape) == {"data": 2, "model": 4}
    got_losses, got = sgd_steps(sharded, params, x)
    want_losses, want = sgd_steps(jax.jit(block), params, x)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5)
    assert want_losses[2] < want_losses[0]
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)
    # the parameters the plan splits over "model" really are split on the devices
    w1 = jax.device_put(
        params["w1"],
        sharded.mesh
        and jax.sharding.NamedSharding(
            sharded.mesh, partition_specs(block_plan, ("data", "model"))["w1"]
        ),
    )
    assert w1.addressable_shards[0].data.shape != params["w1"].shape


def test_user_jax_mesh_with_own_axis_names(devices8, block_plan):
    params, x = block_args()
    devices = np.asarray(jax.devices()[:8]).reshape(2, 4)
    mine = jax.sharding.Mesh(devices, ("dp", "tp"))
    sharded = shard(block, block_plan, mesh=mine)
    assert sharded.axis_names == ("dp", "tp")
    assert float(sharded(params, x)) == pytest.approx(float(jax.jit(block)(params, x)), rel=1e-5)


def test_plan_not_expressible_on_axes_uses_round_axes(devices8):
    """Batch in the first round of "model" and Megatron's cut in the second: no PartitionSpec over
    ("data", "model") says that, so specs name rounds and the mesh is round-shaped."""
    params, x = block_args()
    graph = from_jaxpr(block, params, x)
    dp = make_plan(graph, MESH, "data-parallel").strategies
    tp = make_plan(graph, MESH, "megatron").strategies
    mixed = Plan(graph, MESH, {n: (dp[n][0], dp[n][1], tp[n][2]) for n in dp}, "mixed")
    assert axis_layouts(mixed) is None
    with pytest.raises(PlanError, match="round axes"):
        partition_specs(mixed, ("data", "model"))
    sharded = shard(block, mixed)
    assert sharded.axis_names is None and sharded.mesh.axis_names == ("r0", "r1", "r2")
    got_losses, _ = sgd_steps(sharded, params, x, steps=1)
    want_losses, _ = sgd_steps(jax.jit(block), params, x, steps=1)
    np.testing.assert_allclose(got_losses, want_losses, rtol=1e-5)


def test_wrong_axis_names_and_meshes_are_plan_errors(block_plan):
    with pytest.raises(PlanError, match="axis names"):
        partition_specs(block_plan, ("data",))
    with pytest.raises(PlanError, match="rounds"):
        shard(block, block_plan, mesh="6")


def test_readme_training_loop(devices8):
    """The README's JAX example (copied verbatim between the markers)."""
    # README-jax-begin
    import jax

    import shardplan
    from shardplan.jax import shard

    params, x = block_args()  # block(params, x) -> loss, plain JAX
    graph = shardplan.from_jaxpr(block, params, x)
    plan = shardplan.plan(graph, shardplan.Mesh((2, 4), ("data", "model")), "megatron")
    sharded = shard(block, plan)  # PartitionSpecs over ("data", "model")
    step = jax.jit(jax.value_and_grad(sharded))
    losses = []
    for _ in range(3):
        loss, grads = step(params, x)
        params = jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads)
        losses.append(float(loss))
    # README-jax-end
    want, _ = sgd_steps(jax.jit(block), block_args()[0], x)
    np.testing.assert_allclose(losses, want, rtol=1e-5)
    assert _snippet() in (Path(__file__).parents[2] / "README.md").read_text()


def _snippet() -> str:
    import inspect
    import textwrap

    source = inspect.getsource(test_readme_training_loop)
    body = source.split("# README-jax-begin\n")[1].split("# README-jax-end")[0]
    return textwrap.dedent(body).strip()
