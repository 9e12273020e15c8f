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


def _contiguous(shape: Any) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


REWRITES = {
    "aten.mean.dim": _mean_as_sum,
    "aten.embedding.default": _vocab_parallel_embedding,
}
"""ATen ops run in another, equivalent form on DTensors (a workaround each, named by the op)."""
