"""ATen ops `shardplan.torch.parallelize` runs in another, equivalent form on DTensors: each a
workaround for a DTensor rule that cannot carry a plan's layouts, named by the op it replaces.
O(1) per call beyond the op itself. torch is imported inside the functions (a lazy extra)."""

from __future__ import annotations

from typing import Any


def _mean_as_sum(x: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Any:
    """`mean` as `sum / count`: DTensor's mean over a split dim leaves `Partial("avg")`, whose
    backward cannot take the `Partial("sum")` gradients DTensor's other ops produce."""
    import math

    import torch

    dims = [d % x.dim() for d in dim] if dim else list(range(x.dim()))
    total = torch.ops.aten.sum.dim_IntList(x, dims, keepdim, dtype=dtype)
    return total / math.prod(x.shape[d] for d in dims)


def _vocab_parallel_embedding(
    weight: Any,
    indices: Any,
    padding_idx: int = -1,
    scale_grad_by_freq: bool = False,
    sparse: bool = False,
) -> Any:
    """`embedding` with the table split by rows (vocab-parallel) as Megatron computes it: each
    rank looks up the ids in its rows, zeroes the others, and the result is a plain
    `Partial(sum)`. DTensor's own rule leaves a `MaskPartial` whose mask lives only until the
    next op reads it, which breaks once the plan reads the result in another layout."""
    import torch
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    lookup = torch.ops.aten.embedding.default
    row_split = isinstance(weight, DTensor) and any(p.is_shard(0) for p in weight.placements)
    if not row_split or padding_idx not in (-1, None) or scale_grad_by_freq or sparse:
        return lookup(weight, indices, padding_idx, scale_grad_by_freq, sparse)
    mesh = weight.device_mesh
    rows, offset = compute_local_shape_and_global_offset(weight.shape, mesh, weight.placements)
    if isinstance(indices, DTensor):
        ids, id_placements = indices.to_local(), tuple(indices.placements)
    else:
        ids, id_placements = indices, (Replicate(),) * mesh.ndim
    local_ids = ids - offset[0]
    inside = (local_ids >= 0) & (local_ids < rows[0])
    # a table replicated where the ids are split gets partial gradients from each piece
    grads = tuple(
        held if held.is_shard() else Partial() if ids_at.is_shard() else Replicate()
        for held, ids_at in zip(weight.placements, id_placements, strict=True)
    )
    table = weight.to_local(grad_placements=grads)
    out = lookup(table, local_ids.clamp(0, max(rows[0] - 1, 0)))
    out = out * inside.unsqueeze(-1).to(out.dtype)
    placements = []
    for held, ids_at in zip(weight.placements, id_placements, strict=True):
        if held.is_shard(0):
            placements.append(Partial())
        elif held.is_shard(1):
            placements.append(Shard(out.dim() - 1))
        elif ids_at.is_shard():
            placements.append(Shard(ids_at.dim))
        else:
            placements.append(Replicate())
    shape = torch.Size((*indices.shape, weight.shape[1]))
    return DTensor.from_local(
        out, mesh, placements, run_check=False, shape=shape, stride=_contiguous(shape)
    )


def _convolution(
    x: Any,
    weight: Any,
    bias: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    transposed: bool,
    output_padding: Any,
    groups: int,
) -> Any:
    """`convolution` on DTensors computed on the local pieces, per mesh dim one of: batch split
    (input Shard(0), weight replicated), output channels split (weight and bias Shard(0), input
    replicated -> Shard(1)), input channels split (input and weight Shard(1) -> Partial(sum),
    bias added after); any other layout is first redistributed to replicated (or the batch
    split). DTensor's own rule keeps the input's placements whatever the weight's, so a channel
    split ran a local convolution of mismatched pieces."""
    import torch
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

    conv = torch.ops.aten.convolution.default
    args = (stride, padding, dilation, transposed, output_padding, groups)
    if not isinstance(x, DTensor) or not isinstance(weight, DTensor):
        return conv(x, weight, bias, *args)
    mesh = x.device_mesh
    if bias is not None and not isinstance(bias, DTensor):
        bias = DTensor.from_local(bias, mesh, (Replicate(),) * mesh.ndim, run_check=False)
    plain = groups == 1 and not transposed  # channel splits need one group, weight (out, in, ...)
    want_x, want_w, out, gx, gw = [], [], [], [], []
    for xp, wp in zip(x.placements, weight.placements, strict=True):
        if plain and wp.is_shard(0) and not xp.is_shard():
            cut = (Replicate(), Shard(0), Shard(1), Partial(), Shard(0))  # output channels
        elif plain and wp.is_shard(1) and xp.is_shard(1):
            cut = (Shard(1), Shard(1), Partial(), Shard(1), Shard(1))  # input channels
        elif xp.is_shard(0):
            cut = (Shard(0), Replicate(), Shard(0), Shard(0), Partial())  # batch
        else:
            cut = (Replicate(),) * 3 + (Replicate(), Replicate())
        for seq, p in zip((want_x, want_w, out, gx, gw), cut, strict=True):
            seq.append(p)
    x = x.redistribute(mesh, want_x)
    weight = weight.redistribute(mesh, want_w)
    local_bias = None
    split_in = any(p.is_partial() for p in out)
    if bias is not None and not split_in:
        # the bias follows the output channels: split with them, else replicated
        want_b = [Shard(0) if w.is_shard(0) else Replicate() for w in want_w]
        gb = [Shard(0) if w.is_shard(0) else Partial() if o.is_shard(0) else Replicate()
              for w, o in zip(want_w, out, strict=True)]  # fmt: skip
        local_bias = bias.redistribute(mesh, want_b).to_local(grad_placements=gb)
    local = conv(x.to_local(grad_placements=gx), weight.to_local(grad_placements=gw),
                 local_bias, *args)  # fmt: skip
    channels = weight.shape[1] * groups if transposed else weight.shape[0]
    shape = torch.Size((x.shape[0], channels, *local.shape[2:]))
    result = DTensor.from_local(
        local, mesh, out, run_check=False, shape=shape, stride=_contiguous(shape)
    )
    if bias is not None and split_in:  # added once to the sum, not on every partial piece
        result = result + bias.reshape(1, -1, *([1] * (local.dim() - 2)))
    return result


def dropout(x: Any, p: float, train: bool | None, *, training: bool, seed: int) -> Any:
    """`native_dropout` as the plan needs it: off when the module is in eval mode (the export
    baked `train=True` in), else one mask for the whole (global) tensor drawn from `seed`, the
    same on every rank, each rank keeping the piece its shard covers — so the copies of a
    replicated activation get the same mask and the shards of a split one independent parts of
    it (Megatron-LM keeps a model-parallel RNG state for the same reason). A partial sum takes
    the whole mask on every piece (dropout is linear in its input)."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not (training and train) or p <= 0:
        return x, torch.ones_like(x, dtype=torch.bool)
    gen = torch.Generator().manual_seed(seed)
    keep = torch.rand(tuple(x.shape), generator=gen) >= p  # drawn whole on every rank
    scale = 0.0 if p >= 1 else 1.0 / (1.0 - p)
    if not isinstance(x, DTensor):
        return x * keep.to(x.dtype) * scale, keep
    mesh, placements = x.device_mesh, tuple(x.placements)
    shape, offset = compute_local_shape_and_global_offset(x.shape, mesh, placements)
    piece = keep[tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))]
    local = x.to_local(grad_placements=placements) * piece.to(x.dtype) * scale
    stride = _contiguous(x.shape)
    out = DTensor.from_local(local, mesh, placements, run_check=False, shape=x.shape, stride=stride)
    mask_placements = tuple(Replicate() if q.is_partial() else q for q in placements)
    mask = DTensor.from_local(piece, mesh, mask_placements, run_check=False, shape=x.shape,
                              stride=stride)  # fmt: skip
    return out, mask


def _dims(value: Any, n: int) -> list[int]:
    """A conv argument (an int or a list of 1 or n) as a list of n."""
    if isinstance(value, (list, tuple)):
        return list(value) * n if len(value) == 1 else list(value)
    return [value] * n


def _conv_nd(n: int) -> Any:
    """`conv1d` / `conv2d` (export's own forms, kept by the one import path) as `convolution`."""

    def run(x: Any, weight: Any, bias: Any = None, stride: Any = 1, padding: Any = 0,
            dilation: Any = 1, groups: int = 1) -> Any:  # fmt: skip
        return _convolution(x, weight, bias, _dims(stride, n), _dims(padding, n),
                            _dims(dilation, n), False, [0] * n, groups)  # fmt: skip

    return run


def _pad(x: Any, pad: Any, mode: str = "constant", value: Any = None) -> Any:
    """`pad` on a DTensor: gathered whole, padded, replicated (DTensor has no pad rule; the
    planned layout of the reader is applied after it)."""
    import torch
    from torch.distributed.tensor import DTensor, Replicate

    pad_op = torch.ops.aten.pad.default
    if not isinstance(x, DTensor):
        return pad_op(x, pad, mode, value)
    mesh = x.device_mesh
    whole = x.redistribute(mesh, (Replicate(),) * mesh.ndim).to_local()
    out = pad_op(whole, pad, mode, value)
    return DTensor.from_local(out, mesh, (Replicate(),) * mesh.ndim, run_check=False)


def _dropout_one(x: Any, p: float, train: bool | None, *, training: bool, seed: int) -> Any:
    """`dropout` (export's own form: the result only) as `dropout` above."""
    return dropout(x, p, train, training=training, seed=seed)[0]


def _attention(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    *,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> Any:
    """`scaled_dot_product_attention` as its math (matmul, softmax, matmul; the reference form
    in torch's documentation): on CPU it runs as `_scaled_dot_product_flash_attention_for_cpu`,
    whose backward has no DTensor rule. The importer translates only dropout_p == 0."""
    import math

    import torch
    from torch.distributed.tensor import DTensor, Replicate

    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    if not isinstance(query, DTensor) or dropout_p:
        return sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                    enable_gqa=enable_gqa)  # fmt: skip
    heads, kv = query.shape[-3] if query.dim() > 2 else 1, key.shape[-3] if key.dim() > 2 else 1
    if enable_gqa and heads != kv:  # query head h reads key/value head h // (heads / kv)
        key = key.repeat_interleave(heads // kv, dim=-3)
        value = value.repeat_interleave(heads // kv, dim=-3)
    factor = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = torch.matmul(query, key.transpose(-2, -1)) * factor
    s, t = query.shape[-2], key.shape[-2]
    if is_causal:
        keep = torch.ones(s, t, dtype=torch.bool).tril()
        attn_mask = DTensor.from_local(keep, query.device_mesh,
                                       (Replicate(),) * query.device_mesh.ndim)  # fmt: skip
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros_like(attn_mask, dtype=scores.dtype).masked_fill(
                attn_mask.logical_not(), float("-inf")
            )
        scores = scores + attn_mask
    return torch.matmul(torch.softmax(scores, dim=-1), value)


def _contiguous(shape: Any) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


REWRITES = {
    "aten.mean.dim": _mean_as_sum,
    "aten.embedding.default": _vocab_parallel_embedding,
    "aten.convolution.default": _convolution,
    "aten.conv1d.default": _conv_nd(1),
    "aten.conv2d.default": _conv_nd(2),
    "aten.pad.default": _pad,
    "aten.scaled_dot_product_attention.default": _attention,
}
"""ATen ops run in another, equivalent form on DTensors (a workaround each, named by the op)."""

RANDOM = {"aten.native_dropout.default": dropout, "aten.dropout.default": _dropout_one}
"""Random ops: run with the module's train/eval mode and a seed shared by every rank."""
