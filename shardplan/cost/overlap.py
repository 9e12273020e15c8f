"""Tensor-parallel collectives of the backward that run under the weight-gradient GEMMs.

Megatron-LM's column-parallel linear (megatron/core/tensor_parallel/layers.py,
`LinearWithGradAccumulationAndAsyncCommunication.backward`; on by default, Megatron-LM's
`--no-async-tensor-model-parallel-allreduce` turned it off) computes the input gradient
dX = dY W, starts its all-reduce over the tensor-parallel group asynchronously and computes the
weight gradient dW = dY^T X while it runs; under sequence parallelism it re-gathers
the input asynchronously while computing dX, and reduce-scatters dX while computing dW. The
row-parallel linear's forward reduce-scatter becomes, in the backward, an all-gather of the
result's gradient that nothing hides.

So, per op `o` of a stage plan with its own backward collective c = intra_bwd(o) (an op whose
input gradient is reduced: the column-parallel linear), where o has a weight-gradient GEMM (a
parameter that needs a gradient and a REDUCE loop dim: a contraction):
  window(o) = sum of the forward compute of the readers of o's activation input that have a
    weight-gradient GEMM (dW and dX each have the forward's multiply-adds; one fused QKV GEMM
    in Megatron-LM is three such readers here)
  exposed(o) = max(0, c - window(o))                                   (tensor parallelism)
  exposed(o) = max(0, c/2 - window(o)) + max(0, c/2 - window(o))       (sequence parallelism:
    the re-gather under dX, the reduce-scatter under dW, each half the all-reduce's bytes)
and under sequence parallelism every op with a forward all-reduce (the row-parallel linear) adds
half of it: the all-gather of its result's gradient. Backward collectives of other ops stay
exposed. O(ops + operands).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from shardplan.cost.evaluate import OpCost
from shardplan.ir.dims import DimKind
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role


def has_weight_gradient_gemm(graph: Graph, op: Op) -> bool:
    """A contraction (a REDUCE loop dim) with a parameter that needs a gradient."""
    contracts = any(d.kind is DimKind.REDUCE for d in op.signature.loop_dims)
    return contracts and any(
        graph.tensors[t].role is Role.PARAMETER and t in graph.requires_grad for t in op.inputs
    )


def exposed_backward(
    graph: Graph,
    rows: Sequence[OpCost],
    forward: Mapping[str, float],
    sequence_parallel: bool,
) -> float:
    """Seconds of the ops' own backward collectives left exposed (module docstring); `rows` are
    the tensor-parallel plan's `OpCost`s, `forward` each op's forward compute."""
    gemm = {op.name for op in graph.ops if has_weight_gradient_gemm(graph, op)}
    exposed = 0.0
    for op, row in zip(graph.ops, rows, strict=True):
        if sequence_parallel:  # the forward reduce-scatter's backward all-gather
            exposed += row.intra_fwd / 2
        c = row.intra_bwd
        if c <= 0 or op.name not in gemm:
            exposed += max(0.0, c)
            continue
        window = sum(
            forward[graph.ops[i].name]
            for name in op.inputs
            if graph.tensors[name].role is not Role.PARAMETER and name in graph.requires_grad
            for i, _ in graph.consumers[name]
            if graph.ops[i].name in gemm
        )
        if sequence_parallel:
            exposed += 2 * max(0.0, c / 2 - window)
        else:
            exposed += max(0.0, c - window)
    return exposed


__all__ = ["exposed_backward", "has_weight_gradient_gemm"]
