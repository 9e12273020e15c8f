"""Plain-JAX functions (an MLP, a transformer block) and their example arguments, shared by the
jaxpr importer tests and the apply_plan engine tests. Import only after `importorskip("jax")`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def normal(rng, *shape, scale=1.0):
    return jnp.asarray(rng.standard_normal(shape) * scale, jnp.float32)


def mlp(params, x, targets):
    h = x
    for i, layer in enumerate(params["layers"]):
        with jax.named_scope(f"fc{i}"):
            h = h @ layer["w"] + layer["b"]
            if i < len(params["layers"]) - 1:
                h = jax.nn.relu(h)
    logp = jax.nn.log_softmax(h, axis=-1)
    return -jnp.mean(jnp.sum(targets * logp, axis=-1))


def mlp_args(batch=16, sizes=(32, 64, 64, 16)):
    rng = np.random.default_rng(0)
    params = {
        "layers": [
            {"w": normal(rng, a, b, scale=0.2), "b": normal(rng, b, scale=0.1)}
            for a, b in zip(sizes[:-1], sizes[1:], strict=True)
        ]
    }
    x = normal(rng, batch, sizes[0])
    targets = jax.nn.one_hot(rng.integers(0, sizes[-1], batch), sizes[-1])
    return params, x, targets


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


def block_args(batch=8, seq=16, d=32):
    rng = np.random.default_rng(1)
    params = {
        "ln1_g": jnp.ones((d,)), "ln1_b": jnp.zeros((d,)),
        "ln2_g": jnp.ones((d,)), "ln2_b": jnp.zeros((d,)),
        "wq": normal(rng, d, d, scale=0.2), "wk": normal(rng, d, d, scale=0.2),
        "wv": normal(rng, d, d, scale=0.2), "wo": normal(rng, d, d, scale=0.2),
        "w1": normal(rng, d, 4 * d, scale=0.2), "b1": jnp.zeros((4 * d,)),
        "w2": normal(rng, 4 * d, d, scale=0.2), "b2": jnp.zeros((d,)),
    }  # fmt: skip
    return params, normal(rng, batch, seq, d)
