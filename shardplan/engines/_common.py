"""Helpers both executors (JAX and torch) share: the deterministic values a graph runs on,
framework-neutral kernel pieces, attribute pairs and einsum letter specs.

Values (`init_params`, `init_inputs`) are numpy arrays, deterministic in (seed, tensor name):
every tensor has its own generator, so a tensor's values do not depend on the others, and the JAX
and torch engines run on the same numbers.
"""

from __future__ import annotations

import string
import zlib
from typing import Any

import numpy as np

from shardplan.errors import UnsupportedOpError
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role, Tensor
from shardplan.ir.traits import Trait, has_trait, traits_of

# -- values --------------------------------------------------------------------------------------


def value_rng(seed: int, name: str) -> np.random.Generator:
    """One generator per (seed, tensor name): a tensor's values do not depend on the others."""
    return np.random.default_rng([int(seed), zlib.crc32(name.encode())])


def index_bound(graph: Graph, name: str) -> int | None:
    """Exclusive upper bound when tensor `name` holds embedding ids or class labels, else None."""
    bound: int | None = None
    for op_index, position in graph.consumers.get(name, ()):
        op = graph.ops[op_index]
        index = traits_of(op.kind).index
        if index is not None and position == index.position:
            high = graph.tensors[op.inputs[index.bound_operand]].shape[index.bound_dim]
            bound = high if bound is None else min(bound, high)
    return bound


def init_params(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """float32 values for every parameter: normal * 0.02, except norm scales (gamma) = 1."""
    norm_scales = {
        op.inputs[1]
        for op in graph.ops
        if has_trait(op.kind, Trait.SCALE_OPERAND) and len(op.inputs) > 1
    }
    out: dict[str, np.ndarray] = {}
    for t in graph.parameters:
        if t.name in norm_scales:
            out[t.name] = np.ones(t.shape, np.float32)
        else:
            normal = value_rng(seed, t.name).standard_normal(t.shape)
            out[t.name] = (normal * 0.02).astype(np.float32)
    return out


def _constant_value(tensor: Tensor, rng: np.random.Generator) -> np.ndarray:
    shape = tensor.shape
    leaf = tensor.name.replace("/", ".").split(".")[-1]
    if "causal_mask" in tensor.name and len(shape) >= 2 and shape[-1] and not shape[-2] % shape[-1]:
        # [g x s, s]: the zoo's grouped-query heads stacked along the queries, row r is query
        # r mod s of its group
        mask = np.triu(np.full((shape[-1], shape[-1]), -1e9, np.float32), k=1)
        mask = np.tile(mask, (shape[-2] // shape[-1], 1))
        return np.array(np.broadcast_to(mask, shape), np.float32)
    if leaf.endswith("ones"):
        return np.ones(shape, np.float32)
    if leaf.endswith("zeros"):
        return np.zeros(shape, np.float32)
    return rng.standard_normal(shape).astype(np.float32)


def init_inputs(
    graph: Graph, seed: int = 0, index_dtype: type[np.integer[Any]] = np.int64
) -> dict[str, np.ndarray]:
    """Values for every input and constant tensor of `graph`.

    A tensor that feeds an embedding's ids or a cross_entropy's labels is `index_dtype` in
    [0, rows or classes) (`index_bound`), whatever its dtype_bytes; other inputs are float32
    standard normal. Constants: a `causal_mask` [s, s] is 0 on/below the diagonal and -1e9
    above (one [g x s, s] is g of them stacked: the zoo's grouped-query heads); a name ending in
    `ones` / `zeros` is that; any other constant (an importer's folded values: masks, index
    positions) is float32 standard normal, because the graph does not store its values.
    """
    out: dict[str, np.ndarray] = {}
    for t in graph.tensors.values():
        if t.role not in (Role.INPUT, Role.CONSTANT):
            continue
        rng = value_rng(seed, t.name)
        high = index_bound(graph, t.name)
        if high is not None:
            out[t.name] = rng.integers(0, high, size=t.shape, dtype=index_dtype)
        elif t.role is Role.CONSTANT:
            out[t.name] = _constant_value(t, rng)
        else:
            out[t.name] = rng.standard_normal(t.shape).astype(np.float32)
    return out


# -- kernel pieces (array-API: the same code on jax and torch arrays) ---------------------------


def bias_add(op: Op, x: Any, bias: Any) -> Any:
    """x + bias along `op`'s `axis` (default the last)."""
    axis = int(op.attr("axis", -1)) % x.ndim
    shape = [1] * x.ndim
    shape[axis] = bias.shape[0]
    return x + bias.reshape(shape)


def affine(y: Any, gamma: Any, beta: Any) -> Any:
    """A norm's optional scale and shift."""
    y = y if gamma is None else y * gamma
    return y if beta is None else y + beta


def attention(op: Op, softmax: Any, q: Any, k: Any, v: Any, mask: Any = None) -> Any:
    """Fused attention (`shardplan.ir.catalogue_attention`) in plain array ops, as its math:
    softmax(q k^T x scale + mask) v over the keys. `softmax(x)` normalises the last axis.

    q [B.., G.., s, d], k [B.., t, d], v [B.., t, e]: k and v get a singleton axis per group
    dim G so that matmul broadcasts them over q's query heads (grouped-query attention). The
    default scale is d ** -0.5 with d the signature's (global) extent; d and t are FROZEN, so a
    device's operands always hold every key and feature and the kernel is also right on shards.
    """
    groups = q.ndim - k.ndim
    lead = k.ndim - 2
    k = k.reshape(tuple(k.shape[:lead]) + (1,) * groups + tuple(k.shape[lead:]))
    v = v.reshape(tuple(v.shape[:lead]) + (1,) * groups + tuple(v.shape[lead:]))
    scale = op.attr("scale")
    if scale is None:
        scale = op.signature.extents["d"] ** -0.5
    scores = (q @ k.swapaxes(-1, -2)) * float(scale)
    if mask is not None:  # additive [s, t], broadcast over the batch and group dims
        scores = scores + mask
    return softmax(scores) @ v


# -- attributes ----------------------------------------------------------------------------------


def pair(value: Any) -> tuple[int, int]:
    """An int or a 2-sequence attribute (stride, padding, kernel) as (y, x)."""
    if isinstance(value, int):
        return value, value
    a, b = value
    return int(a), int(b)


def einsum_letters(spec: str) -> str:
    """`"b s e c, b s m -> e c m"` -> `"bsec,bsm->ecm"`: multi-letter loop names become letters."""
    from shardplan.ir.signature import parse_operands

    lhs, rhs = spec.split("->")
    sides = [parse_operands(lhs), parse_operands(rhs)]
    letters: dict[str, str] = {}
    for operands in sides:
        for dims in operands:
            for group in dims:
                if len(group) != 1:
                    raise UnsupportedOpError(
                        f"einsum spec {spec!r}: grouped dims {group} are not supported"
                    )
                if group[0] not in letters:
                    if len(letters) >= len(string.ascii_letters):
                        raise UnsupportedOpError(f"einsum spec {spec!r} has too many loop dims")
                    letters[group[0]] = string.ascii_letters[len(letters)]

    def side(operands: Any) -> str:
        return ",".join("".join(letters[g[0]] for g in dims) for dims in operands)

    return f"{side(sides[0])}->{side(sides[1])}"
