"""Sequence parallelism (Korthikanti et al., MLSys'23 §4.2.2) as a layout of a tensor-parallel plan.

Tensor-parallel rounds T of a plan: the rounds in which some op cuts a loop dim that indexes one
of its parameters (a weight split by tensor parallelism; data-parallel rounds cut only dims no
parameter carries). The ops a plan leaves whole in every round of T run redundantly on each
device of the tensor group — in a transformer the layer norms, residual adds and the bias adds
after the row-parallel linears. Sequence parallelism splits each of them along a PARALLEL loop
dim no parameter of the op carries (the sequence, or the batch when it divides), q ways in each
round of T: their compute and their results (the activations kept for the backward) are 1/t of
the tensor-parallel plan's, t = prod_{r in T} q_r, and a parameter they read (a norm's gain and
bias) has its gradient all-reduced over the tensor group (what the evaluator prices for a cut
that does not index the parameter). At the boundaries the all-reduce of the row-parallel
linear's partial sums becomes a reduce-scatter into the split region and an all-gather out of
it: the same ring volume, 2 (t - 1)/t of the tensor (§4.2.2), so the step model keeps the
tensor-parallel plan's collectives (`cost.step.profile_stage`). O(ops x rounds x dims).
"""

from __future__ import annotations

from collections.abc import Mapping

from shardplan.errors import PlanError
from shardplan.ir.dims import DimKind
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role
from shardplan.ir.signature import loop_names
from shardplan.mesh import Mesh
from shardplan.sharding import Strategy, cut_problem


def _param_dims(graph: Graph, op: Op) -> set[str]:
    """Loop dims that index one of `op`'s parameter operands."""
    out: set[str] = set()
    for i, name in enumerate(op.inputs):
        if graph.tensors[name].role is Role.PARAMETER:
            out |= loop_names(op.signature.inputs[i])
    return out


def tensor_rounds(graph: Graph, mesh: Mesh, strategies: Mapping[str, Strategy]) -> tuple[int, ...]:
    """The rounds (q > 1) in which some op cuts a loop dim indexing one of its parameters."""
    rounds = set()
    for op in graph.ops:
        pdims = _param_dims(graph, op)
        for r, cut in enumerate(strategies[op.name]):
            if cut is not None and cut in pdims and mesh.rounds[r].q > 1:
                rounds.add(r)
    return tuple(sorted(rounds))


def sequence_parallel_strategies(
    graph: Graph, mesh: Mesh, strategies: Mapping[str, Strategy]
) -> dict[str, Strategy]:
    """`strategies` with every op left whole in the tensor-parallel rounds split along a
    parameter-free PARALLEL loop dim there (module docstring); PlanError when the plan has no
    tensor-parallel round."""
    rounds = tensor_rounds(graph, mesh, strategies)
    if not rounds:
        raise PlanError(
            "sequence parallelism splits the tensor-parallel group's replicated regions, but "
            "this plan splits no parameter (no tensor parallelism); use tensor > 1 or drop "
            "sequence_parallel"
        )
    out = dict(strategies)
    for op in graph.ops:
        strategy = strategies[op.name]
        if any(strategy[r] is not None for r in rounds):
            continue  # already tensor-parallel
        extents = op.signature.extents
        for rnd, cut in zip(mesh.rounds, strategy, strict=True):
            if cut is not None:
                extents[cut] //= rnd.q
        pdims = _param_dims(graph, op)
        for d in op.signature.loop_dims:
            if d.kind is not DimKind.PARALLEL or d.name in pdims or d.name in strategy:
                continue
            left, ok = extents[d.name], True
            for r in rounds:
                if cut_problem(op, d.name, left, mesh.rounds[r].q) is not None:
                    ok = False
                    break
                left //= mesh.rounds[r].q
            if ok:
                out[op.name] = tuple(d.name if r in rounds else c for r, c in enumerate(strategy))
                break
    return out


__all__ = ["sequence_parallel_strategies", "tensor_rounds"]
