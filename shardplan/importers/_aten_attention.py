"""The ATen row of fused attention: `aten.scaled_dot_product_attention` -> the catalogue's
`attention` kind (`shardplan.ir.catalogue_attention`).

    sdpa(q [B.., s, d], k [B.., t, d], v [B.., t, e], attn_mask, dropout_p, is_causal,
         scale=, enable_gqa=)  ->  attention(q, k, v (, mask [s, t]), scale=)

- `is_causal=True` becomes a CONSTANT causal mask [s, t] (`causal_mask_SxT`, shared by every
  layer; the engines fill a constant named `causal_mask` with 0 on/below the diagonal and -1e9
  above), only when s == t: torch aligns a rectangular causal mask top-left, which that constant
  does not describe.
- a folded `attn_mask` (computed from constants alone, as transformers builds its masks from
  `arange`) is evaluated (`_static_value`, on the CPU even for a model on the meta device): one
  that keeps every key is dropped, a causal one becomes `causal_mask_SxT`, any other one that
  is the same for every batch element and head a float CONSTANT [s, t] (the graph keeps shapes,
  not values, as for every folded constant); unevaluable, its chain of `expand`s must show that
  it does not vary along the batch and head dims.
- a computed `attn_mask` (from the inputs) must be [s, t] itself up to leading dims of size 1
  (through `expand`s); it is reshaped to [s, t] and, when boolean (True = attend), made
  additive as (m - 1) x 1e9 (counted as approximated: a row with every key masked gets uniform
  weights instead of torch's NaN).
- `enable_gqa` with fewer key/value heads than query heads: q [B, H, s, d] is reshaped to
  [B, KV, H / KV, s, d] (query head h uses key/value head h // (H / KV), torch's
  `repeat_interleave`), attended with k/v broadcast over the group dim, and reshaped back.

Anything else — dropout_p > 0, a per-batch or per-head mask (padding masks, ALiBi biases),
batch dims that differ, `is_causal` with s != t — raises UnsupportedOpError before emitting, so
the importer decomposes the program to core ATen and imports attention as its matmuls and
softmax (never a silently different function). O(rank) per call, plus the evaluation of a
folded mask of at most `EVALUATE_LIMIT` elements: O(the ops it is computed by).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shardplan.errors import UnsupportedOpError
from shardplan.importers._aten_views import _arg, _is_node
from shardplan.ir.op import Role

if TYPE_CHECKING:
    from torch.fx import Node

    from shardplan.importers.torch import _Context

MASKED = 1e9
"""The additive value of a masked key in a converted boolean mask: the engines' causal mask's
(-1e9, `shardplan.engines._common`); exp(-1e9 - max) is 0 in every float format."""


def _sdpa(ctx: _Context, node: Node) -> Any:
    """The rule of `aten.scaled_dot_product_attention.default` (module docstring)."""
    q, k, v = node.args[:3]
    mask, dropout, causal = _arg(node, 3), _arg(node, 4, 0.0), _arg(node, 5, False)
    scale, gqa = node.kwargs.get("scale"), bool(node.kwargs.get("enable_gqa", False))
    qs, ks, vs = ctx.shape(q), ctx.shape(k), ctx.shape(v)
    if dropout:
        raise UnsupportedOpError(f"scaled_dot_product_attention with dropout_p={dropout}")
    heads = _kv_groups(qs, ks, vs, gqa)
    s, t = qs[-2], ks[-2]
    inputs: list[Any] = [q, k, v]
    if causal:
        if mask is not None or s != t:
            raise UnsupportedOpError(
                f"scaled_dot_product_attention is_causal with a mask or {s} queries != {t} keys"
            )
        dtype = ctx.dtype_bytes(node)
        inputs.append(ctx.emitter.tensor(f"causal_mask_{s}x{t}", (s, t), dtype, Role.CONSTANT))
    elif mask is not None:
        additive = _mask_input(ctx, node, mask, s, t)
        inputs += [] if additive is None else [additive]
    attrs = {} if scale is None else {"scale": float(scale)}
    if heads == 1:
        return ctx.emit("attention", inputs, node, **attrs)
    batch, kv = qs[:-3], ks[-3]
    grouped = (*batch, kv, heads, *qs[-2:])
    inputs[0] = ctx.emit("reshape", [q], node, part="groups", shape=grouped)
    out = ctx.emit("attention", inputs, node, part="attention", **attrs)
    return ctx.emit("reshape", [out], node, shape=(*qs[:-1], vs[-1]))


def _kv_groups(qs: tuple[int, ...], ks: tuple[int, ...], vs: tuple[int, ...], gqa: bool) -> int:
    """Query heads per key/value head (1 without grouped-query attention); UnsupportedOpError
    for shapes the catalogue form does not take."""
    if not (len(qs) == len(ks) == len(vs) >= 2) or qs[-1] != ks[-1] or ks[-2] != vs[-2]:
        raise UnsupportedOpError(f"scaled_dot_product_attention of q {qs}, k {ks}, v {vs}")
    if ks[:-2] != vs[:-2]:
        raise UnsupportedOpError(f"scaled_dot_product_attention: k {ks} and v {vs} batch dims")
    if qs[:-2] == ks[:-2]:
        return 1
    if gqa and len(qs) >= 3 and qs[:-3] == ks[:-3] and qs[-3] % ks[-3] == 0:
        return qs[-3] // ks[-3]
    raise UnsupportedOpError(
        f"scaled_dot_product_attention: batch dims of q {qs} and k {ks} differ (broadcast "
        f"batch dims, or enable_gqa={gqa} with these head counts)"
    )


def _mask_input(ctx: _Context, node: Node, mask: Any, s: int, t: int) -> str | None:
    """The [s, t] additive mask the catalogue form reads, or None when it masks nothing
    (module docstring)."""
    if not _is_node(mask):
        raise UnsupportedOpError(f"scaled_dot_product_attention attn_mask {mask!r}")
    if mask in ctx.static:
        return _folded_mask(ctx, node, mask, s, t)
    source = _unexpanded(mask)
    shape = ctx.shape(source)
    if math.prod(shape[:-2]) != 1 or tuple(shape[-2:]) != (s, t):
        raise UnsupportedOpError(
            f"scaled_dot_product_attention attn_mask {ctx.shape(mask)} computed from inputs: "
            f"only a mask shared by every batch and head, [{s}, {t}] itself, has a rule"
        )
    value: Any = source
    if len(shape) != 2:
        value = ctx.emit("reshape", [source], node, part="mask", shape=(s, t))
    if mask.meta["val"].dtype == ctx.torch.bool:  # True = attend: (m - 1) x 1e9 is 0 or -1e9
        value = ctx.emit("cast", [value], node, part="mask_float")
        value = ctx.emit("sub", [value], node, part="mask_shift", scalar=1.0)
        value = ctx.emit("scale", [value], node, part="mask_additive", value=MASKED, approx=True)
    return ctx.tensor(value) if _is_node(value) else value


def _folded_mask(ctx: _Context, node: Node, mask: Node, s: int, t: int) -> str | None:
    """A mask computed from constants alone: evaluated (`_static_value`) to see whether it is
    the same for every batch and head, masks nothing (None) or is causal (the shared causal
    constant); unevaluable (meta tensors), its expand chain must show it shared."""
    torch = ctx.torch
    value = _static_value(ctx, mask)
    dtype = ctx.dtype_bytes(node)
    if value is None:
        shape = ctx.shape(_unexpanded(mask))
        rows = tuple(shape[-2:]) if len(shape) >= 2 else (1, *shape)
        if math.prod(shape[:-2]) != 1 or rows not in ((s, t), (1, t), (s, 1), (1, 1)):
            raise UnsupportedOpError(
                f"scaled_dot_product_attention attn_mask {ctx.shape(mask)}: only a mask shared "
                f"by every batch and head, [{s}, {t}] after broadcasting, has a rule"
            )
        return ctx.emitter.tensor(f"{mask.name}/additive_{s}x{t}", (s, t), dtype, Role.CONSTANT)
    value = value.reshape((1,) * max(0, 2 - value.dim()) + tuple(value.shape))
    full = torch.broadcast_to(value, (*value.shape[:-2], s, t)).reshape(-1, s, t)
    first = full[0]
    if not torch.equal(full, first.expand_as(full)):
        raise UnsupportedOpError(
            f"scaled_dot_product_attention attn_mask {ctx.shape(mask)} differs between batch "
            "elements or heads"
        )
    keep = first if first.dtype == torch.bool else first > -1e4  # exp(-1e4) is 0 in fp32/64
    if first.dtype != torch.bool and not bool((first[keep] == 0).all()):
        keep = None  # an additive bias, not a mask: a constant of its own
    if keep is not None and bool(keep.all()):
        return None  # every query sees every key (transformers' mask without padding)
    causal = torch.ones(s, t, dtype=torch.bool).tril()
    if keep is not None and s == t and torch.equal(keep, causal):
        return ctx.emitter.tensor(f"causal_mask_{s}x{t}", (s, t), dtype, Role.CONSTANT)
    return ctx.emitter.tensor(f"{mask.name}/additive_{s}x{t}", (s, t), dtype, Role.CONSTANT)


EVALUATE_LIMIT = 1 << 24
"""Largest folded mask (elements) evaluated; a bigger one is judged by its shape alone."""


def _static_value(ctx: _Context, node: Node) -> Any:
    """The value of a folded node, computed from the program's buffers and constants by running
    the ops it depends on (O(its ancestors)); None when that cannot be done (meta tensors, an
    op that fails on real values, a value above `EVALUATE_LIMIT` elements). Tensors are
    created on the CPU whatever device the program names, so a model built on the meta device
    (no weights) still has its masks evaluated from `arange` and friends."""
    torch = ctx.torch
    if math.prod(ctx.shape(node)) > EVALUATE_LIMIT:
        return None
    needed, stack = set(), [node]
    while stack:
        n = stack.pop()
        if n not in needed:
            needed.add(n)
            stack.extend(n.all_input_nodes)
    signature = ctx.ep.graph_signature
    stored = {**ctx.ep.state_dict, **ctx.ep.constants}
    names = {**signature.inputs_to_buffers, **signature.inputs_to_lifted_tensor_constants}
    env: dict[Node, Any] = {}
    try:
        for n in ctx.ep.graph.nodes:
            if n not in needed:
                continue
            if n.op == "placeholder":
                env[n] = stored[names[n.name]] if n.name in names else n.meta["val"]
            elif n.op == "call_function":
                args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), env.__getitem__)
                if "device" in kwargs:  # a model on the meta device: its masks on the CPU
                    kwargs = {**kwargs, "device": torch.device("cpu")}
                env[n] = n.target(*args, **kwargs)
            else:
                return None
    except (RuntimeError, TypeError, ValueError, KeyError, IndexError, NotImplementedError):
        return None
    value = env[node]
    if not isinstance(value, torch.Tensor) or value.is_meta or type(value) is not torch.Tensor:
        return None
    return value


def _unexpanded(mask: Node) -> Node:
    """The node `mask` is an `expand` (a broadcast, e.g. transformers' [1, 1, s, t] causal mask
    to [batch, 1, s, t]) of, through any chain of expands: equal values along the expanded
    dims, so its shape says which dims the mask really varies along."""
    while str(mask.target) == "aten.expand.default" and _is_node(mask.args[0]):
        mask = mask.args[0]
    return mask


def register_attention(reg: Callable[..., Callable[[Any], Any]]) -> None:
    """Add this module's row to the ATen table (`reg` is `TranslationTable.register`)."""
    reg("aten.scaled_dot_product_attention.default")(_sdpa)
