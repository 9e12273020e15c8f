"""Kernel reference cases shared by the JAX and torch backend tests: one operator on small
operands, checked against a numpy reference.

`cases(index_dtype)` lists (kind, operands, attrs, numpy reference) for every catalogue kind;
ids and labels are `index_dtype` (int32 for JAX, int64 for torch). `IMPORTER_CASES` use the
attributes only the torch backend reads (an importer's `scalar`, `reverse`, `alpha`,
`scalars`). `single_op_graph` builds the one-operator graph a case runs in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.special import erf

from shardplan.ir.graph import Graph, GraphBuilder

Case = tuple[str, list[np.ndarray], dict[str, Any], Callable[..., np.ndarray]]

# -- numpy references ----------------------------------------------------------------------------


def _f(*shape: int, seed: int = 0, positive: bool = False) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return np.abs(x) + 0.5 if positive else x


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _layer_norm(x, g=None, b=None, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps)
    y = y if g is None else y * g
    return y if b is None else y + b


def _rms_norm(x, g, eps=1e-5):
    return x / np.sqrt((x**2).mean(-1, keepdims=True) + eps) * g


def _batch_norm(x, scale, shift, eps=1e-5):
    mu = x.mean((0, 2, 3), keepdims=True)
    var = ((x - mu) ** 2).mean((0, 2, 3), keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * scale[None, :, None, None] + shift[None, :, None, None]


def _conv2d(x, w, stride, pad):
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, _, h, wd = x.shape
    o, _, r, s = w.shape
    oy, ox = (h - r) // stride + 1, (wd - s) // stride + 1
    out = np.zeros((n, o, oy, ox), np.float64)
    for i in range(oy):
        for j in range(ox):
            patch = x[:, :, i * stride : i * stride + r, j * stride : j * stride + s]
            out[:, :, i, j] = np.einsum("ncrs,ocrs->no", patch, w)
    return out


def _pool2d(x, k, stride, pad, mode):
    fill = -np.inf if mode == "max" else 0.0
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=fill)
    oy, ox = (x.shape[2] - k) // stride + 1, (x.shape[3] - k) // stride + 1
    out = np.zeros(x.shape[:2] + (oy, ox), np.float64)
    for i in range(oy):
        for j in range(ox):
            win = x[:, :, i * stride : i * stride + k, j * stride : j * stride + k]
            out[:, :, i, j] = win.max((2, 3)) if mode == "max" else win.mean((2, 3))
    return out


def _cross_entropy(logits, labels):
    logp = np.log(_softmax(logits.astype(np.float64), -1))
    return -np.take_along_axis(logp, labels[..., None], -1).mean()


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


# -- the cases -----------------------------------------------------------------------------------


def _grouped_conv2d(x, w, groups, pad):
    cin, cout = x.shape[1] // groups, w.shape[0] // groups
    parts = [
        _conv2d(x[:, g * cin : (g + 1) * cin], w[g * cout : (g + 1) * cout], 1, pad)
        for g in range(groups)
    ]
    return np.concatenate(parts, axis=1)


def _route(ids, experts, capacity):
    """Loop reference of moe_route: slots in (t, k) order, -1 once an expert is full."""
    out = np.full(ids.shape, -1, np.int64)
    for g in range(ids.shape[0]):
        count = [0] * experts
        for t in range(ids.shape[1]):
            for k in range(ids.shape[2]):
                e = int(ids[g, t, k])
                if count[e] < capacity:
                    out[g, t, k] = e * capacity + count[e]
                count[e] += 1
    return out


def _slots(ids, experts, capacity):
    routes = _route(ids, experts, capacity)
    table = np.full((ids.shape[0], experts * capacity), -1, np.int64)
    for g, t, k in np.ndindex(*ids.shape):
        if routes[g, t, k] >= 0:
            table[g, routes[g, t, k]] = t
    return table.reshape(ids.shape[0], experts, capacity)


def _dispatch(x, table):
    e, c = table.shape[1:]
    out = np.zeros((e, x.shape[0], c, x.shape[2]))
    for g, i, j in np.ndindex(*table.shape):
        if table[g, i, j] >= 0:
            out[i, g, j] = x[g, table[g, i, j]]
    return out


def _combine(y, routes, weights):
    capacity = y.shape[2]
    out = np.zeros((routes.shape[0], routes.shape[1], y.shape[3]))
    for g, t, k in np.ndindex(*routes.shape):
        s = routes[g, t, k]
        if s >= 0:
            out[g, t] += weights[g, t, k] * y[s // capacity, g, s % capacity]
    return out


def _topk(p, k, normalize=False):
    order = np.argsort(-p, axis=-1, kind="stable")[..., :k]
    values = np.take_along_axis(p, order, -1)
    return order, (values / values.sum(-1, keepdims=True) if normalize else values)


def _attention(q, k, v, mask=None, scale=None):
    """float64 reference: every query head of a group against its batch's keys, written with
    explicit (batch, group) axes; the kernels broadcast k and v instead."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    lead, (s, d), (t, e) = k.shape[:-2], q.shape[-2:], v.shape[-2:]
    batch, group = int(np.prod(lead)), int(np.prod(q.shape[len(lead) : -2]))
    qq, kk, vv = q.reshape(batch, group, s, d), k.reshape(batch, t, d), v.reshape(batch, t, e)
    scores = np.einsum("bgsd,btd->bgst", qq, kk) * (d**-0.5 if scale is None else scale)
    if mask is not None:
        scores = scores + np.asarray(mask, np.float64)
    out = np.einsum("bgst,bte->bgse", _softmax(scores, -1), vv)
    return out.reshape(q.shape[:-1] + (e,))


def _causal(s: int) -> np.ndarray:
    """The zoo's and engines' causal mask: 0 on and below the diagonal, -1e9 above."""
    return np.where(np.arange(s)[None, :] > np.arange(s)[:, None], -1e9, 0.0).astype(np.float32)


def _attention_cases() -> list[Case]:
    return [
        # no mask: [b, s, d] x [b, t, d] with t != s
        ("attention", [_f(2, 3, 4), _f(2, 5, 4, seed=1), _f(2, 5, 4, seed=2)], {}, _attention),
        # causal additive mask, batch and heads as two batch dims, an explicit scale
        (
            "attention",
            [_f(2, 2, 4, 8), _f(2, 2, 4, 8, seed=1), _f(2, 2, 4, 8, seed=2), _causal(4)],
            {"scale": 0.3},
            lambda q, k, v, m: _attention(q, k, v, m, 0.3),
        ),
        # one group dim: 3 query heads share each of 2 key/value heads (grouped-query)
        (
            "attention",
            [_f(2, 2, 3, 4, 8), _f(2, 2, 5, 8, seed=1), _f(2, 2, 5, 8, seed=2)],
            {},
            _attention,
        ),
        # d != e, a group dim and a (random) additive mask
        (
            "attention",
            [_f(2, 3, 4, 6), _f(2, 5, 6, seed=1), _f(2, 5, 3, seed=2), _f(4, 5, seed=3)],
            {},
            _attention,
        ),
    ]


def _moe_cases(index_dtype: type[np.integer[Any]]) -> list[Case]:
    # 6 tokens x top-2 over 4 experts with capacity 2: experts 0 and 1 overflow (dropped choices)
    ids = np.array(
        [
            [[0, 1], [0, 2], [1, 0], [3, 1], [0, 1], [2, 3]],
            [[3, 2], [3, 0], [1, 3], [2, 0], [0, 1], [1, 2]],
        ],
        dtype=index_dtype,
    )
    route = {"experts": 4, "capacity": 2}
    table = _slots(ids, 4, 2).astype(index_dtype)
    routes = _route(ids, 4, 2).astype(index_dtype)
    return [
        ("moe_topk_ids", [_f(2, 6, 4)], {"k": 2}, lambda p: _topk(p, 2)[0]),
        ("moe_topk_weights", [_f(2, 6, 4)], {"k": 2}, lambda p: _topk(p, 2)[1]),
        (
            "moe_topk_weights",
            [_f(2, 6, 4, positive=True)],
            {"k": 3, "normalize": True},
            lambda p: _topk(p, 3, True)[1],
        ),
        ("moe_route", [ids], route, lambda i: _route(i, 4, 2)),
        ("moe_slots", [ids], route, lambda i: _slots(i, 4, 2)),
        ("moe_dispatch", [_f(2, 6, 5), table], {}, _dispatch),
        (
            "expert_matmul",
            [_f(4, 2, 2, 5), _f(4, 3, 5, seed=1)],
            {"transpose_b": True},
            lambda x, w: np.einsum("egck,enk->egcn", x, w),
        ),
        (
            "expert_matmul",
            [_f(4, 3, 5), _f(4, 5, 2, seed=1)],
            {},
            lambda x, w: np.einsum("etk,ekn->etn", x, w),
        ),
        ("moe_combine", [_f(4, 2, 2, 5), routes, _f(2, 6, 2, seed=1)], {}, _combine),
        (
            "conv2d",
            [_f(2, 4, 5, 5), _f(4, 1, 3, 3, seed=1)],
            {"groups": 4, "padding": 1},
            lambda x, w: _grouped_conv2d(x, w, 4, 1),
        ),
        (
            "conv2d",
            [_f(2, 4, 5, 5), _f(6, 2, 3, 3, seed=1)],
            {"groups": 2},
            lambda x, w: _grouped_conv2d(x, w, 2, 0),
        ),
    ]


def cases(index_dtype: type[np.integer[Any]]) -> list[Case]:
    """(kind, operands, attrs, numpy reference) covering every catalogue kind."""
    ids = np.random.default_rng(3).integers(0, 7, size=(2, 4)).astype(index_dtype)
    labels = np.random.default_rng(4).integers(0, 5, size=(2, 3)).astype(index_dtype)
    return [
        ("relu", [_f(2, 3, 4)], {}, lambda x: np.maximum(x, 0)),
        ("gelu", [_f(2, 3, 4)], {}, lambda x: 0.5 * x * (1 + erf(x / np.sqrt(2)))),
        ("gelu", [_f(2, 3, 4)], {"approximate": True}, _gelu_tanh),
        ("gelu", [_f(2, 3, 4)], {"approximate": "tanh"}, _gelu_tanh),
        ("silu", [_f(2, 3, 4)], {}, lambda x: x / (1 + np.exp(-x))),
        ("tanh", [_f(2, 3, 4)], {}, np.tanh),
        ("sigmoid", [_f(2, 3, 4)], {}, lambda x: 1 / (1 + np.exp(-x))),
        ("dropout", [_f(2, 3, 4)], {"rate": 0.1}, lambda x: x),
        ("cast", [_f(2, 3, 4)], {}, lambda x: x),
        ("exp", [_f(2, 3, 4)], {}, np.exp),
        ("neg", [_f(2, 3, 4)], {}, np.negative),
        ("scale", [_f(2, 3, 4)], {"value": 0.125}, lambda x: x * 0.125),
        ("sqrt", [_f(2, 3, 4, positive=True)], {}, np.sqrt),
        ("rsqrt", [_f(2, 3, 4, positive=True)], {}, lambda x: 1 / np.sqrt(x)),
        ("identity", [_f(2, 3, 4)], {}, lambda x: x),
        ("add", [_f(2, 3, 4), _f(3, 4, seed=1)], {}, np.add),
        ("add", [_f(2, 3, 4), _f(3, 1, seed=1)], {}, np.add),
        ("sub", [_f(2, 3, 4), _f(4, seed=1)], {}, np.subtract),
        ("mul", [_f(2, 3, 4), _f(2, 3, 4, seed=1)], {}, np.multiply),
        ("div", [_f(2, 3, 4), _f(2, 1, 4, seed=1, positive=True)], {}, np.divide),
        ("maximum", [_f(2, 3, 4), _f(2, 3, 4, seed=1)], {}, np.maximum),
        ("minimum", [_f(2, 3, 4), _f(2, 3, 4, seed=1)], {}, np.minimum),
        ("bias_add", [_f(2, 3, 4), _f(4, seed=1)], {}, lambda x, b: x + b),
        ("bias_add", [_f(2, 3, 4), _f(3, seed=1)], {"axis": 1}, lambda x, b: x + b[:, None]),
        ("softmax", [_f(2, 3, 4)], {"axis": -1}, lambda x: _softmax(x, -1)),
        ("softmax", [_f(2, 3, 4)], {"axis": 1}, lambda x: _softmax(x, 1)),
        ("layer_norm", [_f(2, 3, 8), _f(8, seed=1), _f(8, seed=2)], {}, _layer_norm),
        ("layer_norm", [_f(2, 3, 8)], {"eps": 1e-3}, lambda x: _layer_norm(x, eps=1e-3)),
        ("rms_norm", [_f(2, 3, 8), _f(8, seed=1)], {}, _rms_norm),
        ("batch_norm", [_f(2, 3, 4, 4), _f(3, seed=1), _f(3, seed=2)], {}, _batch_norm),
        ("linear", [_f(2, 3, 4), _f(5, 4, seed=1)], {}, lambda x, w: x @ w.T),
        ("matmul", [_f(3, 4), _f(4, 5, seed=1)], {}, np.matmul),
        ("matmul", [_f(2, 3, 4), _f(5, 4, seed=1)], {"transpose_b": True}, lambda a, b: a @ b.T),
        ("bmm", [_f(2, 3, 4), _f(2, 4, 5, seed=1)], {}, np.matmul),
        (
            "bmm",
            [_f(2, 2, 3, 4), _f(2, 2, 5, 4, seed=1)],
            {"transpose_b": True},
            lambda a, b: a @ np.swapaxes(b, -1, -2),
        ),
        (
            "conv2d",
            [_f(1, 2, 5, 5), _f(3, 2, 3, 3, seed=1)],
            {"stride": 2, "padding": 1},
            lambda x, w: _conv2d(x, w, 2, 1),
        ),
        ("conv2d", [_f(2, 2, 4, 4), _f(3, 2, 2, 2, seed=1)], {}, lambda x, w: _conv2d(x, w, 1, 0)),
        (
            "pool2d",
            [_f(1, 2, 4, 4)],
            {"kernel": 2, "mode": "max"},
            lambda x: _pool2d(x, 2, 2, 0, "max"),
        ),
        (
            "pool2d",
            [_f(1, 2, 5, 5)],
            {"kernel": 3, "stride": 2, "padding": 1, "mode": "max"},
            lambda x: _pool2d(x, 3, 2, 1, "max"),
        ),
        (
            "pool2d",
            [_f(1, 2, 4, 4)],
            {"kernel": 3, "stride": 1, "padding": 1, "mode": "avg"},
            lambda x: _pool2d(x, 3, 1, 1, "avg"),
        ),
        ("reduce_sum", [_f(2, 3, 4)], {"axes": (1,)}, lambda x: x.sum(1)),
        (
            "reduce_sum",
            [_f(2, 3, 4)],
            {"axes": (0, 2), "keepdims": True},
            lambda x: x.sum((0, 2), keepdims=True),
        ),
        ("reduce_mean", [_f(2, 3, 4)], {}, lambda x: x.mean()),
        ("reduce_mean", [_f(2, 3, 4)], {"axes": (1,)}, lambda x: x.mean(1)),
        ("reduce_max", [_f(2, 3, 4)], {"axes": (-1,)}, lambda x: x.max(-1)),
        ("reshape", [_f(2, 3, 4)], {"shape": (6, 4)}, lambda x: x.reshape(6, 4)),
        ("reshape", [_f(2, 3, 4)], {"shape": (2, -1)}, lambda x: x.reshape(2, 12)),
        ("transpose", [_f(2, 3, 4)], {"perm": (2, 0, 1)}, lambda x: x.transpose(2, 0, 1)),
        ("embedding", [_f(7, 3), ids], {}, lambda t, i: t[i]),
        (
            "concat",
            [_f(2, 3), _f(2, 4, seed=1), _f(2, 1, seed=2)],
            {"axis": 1},
            lambda *xs: np.concatenate(xs, 1),
        ),
        ("cross_entropy", [_f(2, 3, 5), labels], {}, _cross_entropy),
        (
            "einsum",
            [_f(2, 3, 4, 2), _f(2, 3, 5, seed=1)],
            {"spec": "b s e c, b s m -> e c m"},
            lambda a, b: np.einsum("bsec,bsm->ecm", a, b),
        ),
        (
            "einsum",
            [_f(2, 3), _f(3, 4, seed=1)],
            {"spec": "bat seq, seq hid -> hid bat"},
            lambda a, b: np.einsum("ij,jk->ki", a, b),
        ),
        *_moe_cases(index_dtype),
        *_attention_cases(),
    ]


IMPORTER_CASES: list[Case] = [
    ("add", [_f(2, 3, 4), _f(4, seed=1)], {"alpha": 2.0}, lambda a, b: a + 2 * b),
    ("add", [_f(2, 3, 4)], {"scalar": 1.5}, lambda x: x + 1.5),
    ("sub", [_f(2, 3, 4)], {"scalar": 1.0, "reverse": True}, lambda x: 1.0 - x),
    ("div", [_f(2, 3, 4, positive=True)], {"scalar": 2.0, "reverse": True}, lambda x: 2.0 / x),
    (
        "maximum",
        [_f(2, 3, 4), _f(2, 3, 4, seed=1), _f(4, seed=2)],
        {"scalars": (0.5,)},
        lambda a, b, c: np.maximum(np.maximum(np.maximum(a, b), c), 0.5),
    ),
]


def attention_graph() -> Graph:
    """A causal grouped-query attention block: x [b, s, h] -> q [b, g, s, d] (one group dim g of
    query heads), k [b, t, d], v [b, t, e] (d != e) -> attention -> projected back to h."""
    b = GraphBuilder("attention-block")
    x = b.input("x", (4, 8, 16))
    q = b.apply("einsum", x, b.param("wq", (16, 2, 8)), spec="b s h, h g d -> b g s d", name="q")
    k = b.apply("einsum", x, b.param("wk", (16, 8)), spec="b t h, h d -> b t d", name="k")
    v = b.apply("einsum", x, b.param("wv", (16, 4)), spec="b t h, h e -> b t e", name="v")
    o = b.apply("attention", q, k, v, b.constant("causal_mask", (8, 8)), name="attn")
    b.apply("einsum", o, b.param("wo", (2, 4, 16)), spec="b g s e, g e h -> b s h", name="out")
    return b.build()


ATTENTION_STRATEGIES: dict[str, dict[str, tuple[str | None, ...]]] = {
    # batch and heads: every device holds whole queries and keys of its (batch, head) block
    "batch-heads": {
        "q": ("b", "g"), "k": ("b", None), "v": ("b", None), "attn": ("b0", "g0"),
        "out": ("b", "g"),
    },
    # queries and value features: keys (t) and features (d) stay whole on every device
    "queries-values": {
        "q": ("s", None), "k": (None, None), "v": (None, "e"), "attn": ("s", "e"),
        "out": ("s", "e"),
    },
}  # fmt: skip
"""Hand strategies (two rounds) for `attention_graph`: its attention cut by batch and heads, or
by queries and value features (t and d are FROZEN, so never cut)."""


def case_ids(items: list[Case]) -> list[str]:
    """`kind-index` test ids."""
    return [f"{c[0]}-{i}" for i, c in enumerate(items)]


def single_op_graph(
    kind: str, operands: list[np.ndarray], attrs: dict[str, Any]
) -> tuple[Graph, list[str], str]:
    """(graph, input names, output name) of one `kind` operator reading `operands` as inputs."""
    b = GraphBuilder(f"one_{kind}")
    names = [
        b.input(f"in{i}", value.shape, dtype_bytes=value.dtype.itemsize)
        for i, value in enumerate(operands)
    ]
    out = b.apply(kind, *names, name="op", **attrs)
    return b.build(), names, out
