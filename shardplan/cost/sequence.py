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

Context parallelism (Megatron-LM's `context_parallel_size`, ring attention) is a layout too:
the stage cuts the sequence in c ways of its data-parallel rounds, so an attention reader of
the keys and values (split along the sequence by their producer) reads them whole — in SPMD
terms an all-gather, which the evaluator prices forward: (c - 1)/c of K and of V. The ring runs
that volume as c - 1 point-to-point steps, each overlapped with the attention of the chunk in
hand (Liu et al., "Ring Attention", 2023; TransformerEngine's `attn_forward_func_with_cp`, p2p),
and in the backward passes K and V around again with the partial dK, dV beside them: twice the
forward volume. `ring_terms` reads the exchange (every activation all-gather of a plan whose
levers say context parallel, in data-parallel rounds only) and its readers' compute; the step
model charges, reader by reader, max(0, G - its forward) forward and max(0, 2 G - its backward)
backward in place of the evaluator's terms for those edges.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from shardplan.cost.evaluate import ScoreCache
from shardplan.cost.presets import CostOptions
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


def param_dims(graph: Graph, cache: ScoreCache | None = None) -> list[set[str]]:
    """Per op (in graph order), the loop dims indexing one of its parameters; kept in `cache`
    (a `ScoreCache` of `graph`) across the plans it scores. O(operands)."""
    if cache is None or cache.graph is not graph:
        return [_param_dims(graph, op) for op in graph.ops]
    found = cache.memo.get("param_dims")
    if found is None:
        found = cache.memo["param_dims"] = [_param_dims(graph, op) for op in graph.ops]
    return found


def tensor_rounds(
    graph: Graph,
    mesh: Mesh,
    strategies: Mapping[str, Strategy],
    cache: ScoreCache | None = None,
) -> tuple[int, ...]:
    """The rounds (q > 1) in which some op cuts a loop dim indexing one of its parameters
    (`cache`: a `ScoreCache` of `graph` keeping its ops' parameter dims)."""
    rounds = set()
    big = [r.q > 1 for r in mesh.rounds]
    for op, pdims in zip(graph.ops, param_dims(graph, cache), strict=True):
        if pdims:
            for r, cut in enumerate(strategies[op.name]):
                if cut is not None and cut in pdims and big[r]:
                    rounds.add(r)
    return tuple(sorted(rounds))


def sequence_parallel_strategies(
    graph: Graph,
    mesh: Mesh,
    strategies: Mapping[str, Strategy],
    cache: ScoreCache | None = None,
    rounds: Sequence[int] | None = None,
) -> dict[str, Strategy]:
    """`strategies` with every op left whole in the tensor-parallel rounds split along a
    parameter-free PARALLEL loop dim there (module docstring); PlanError when the plan has no
    tensor-parallel round. `cache`: as `tensor_rounds`'; `rounds`: its result when known."""
    dims = param_dims(graph, cache)
    rounds = tensor_rounds(graph, mesh, strategies, cache) if rounds is None else rounds
    if not rounds:
        raise PlanError(
            "sequence parallelism splits the tensor-parallel group's replicated regions, but "
            "this plan splits no parameter (no tensor parallelism); use tensor > 1 or drop "
            "sequence_parallel"
        )
    out = dict(strategies)
    for op, pdims in zip(graph.ops, dims, strict=True):
        strategy = strategies[op.name]
        if any(strategy[r] is not None for r in rounds):
            continue  # already tensor-parallel
        extents = op.signature.extents
        for rnd, cut in zip(mesh.rounds, strategy, strict=True):
            if cut is not None:
                extents[cut] //= rnd.q
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


@dataclass(frozen=True, slots=True)
class RingTerms:
    """Context parallelism's K/V exchange in a stage plan (seconds, per micro-batch): the
    evaluator's terms of the activation all-gathers forward (`gather_s`, G) and backward
    (`scatter_s`: their backward edge terms and the readers' all-reduce of the gathered
    operands' gradients — in a context-parallel attention the readers have no other backward
    collective), the forward / backward compute of the ops that read the gathered tensors
    (the attention the ring overlaps with), and what each reader's own compute leaves of its
    exchange: sum over readers of max(0, G_op - forward_op) and max(0, 2 G_op - backward_op)
    (K and V passed around again with the partial dK, dV under the attention's backward)."""

    gather_s: float
    scatter_s: float
    readers_fwd_s: float
    readers_bwd_s: float
    exposed_fwd_s: float = 0.0
    exposed_bwd_s: float = 0.0


def ring_terms(
    graph: Graph,
    mesh: Mesh,
    strategies: Mapping[str, Strategy],
    opts: CostOptions,
    cache: ScoreCache | None = None,
) -> RingTerms:
    """The activation all-gathers of a context-parallel plan and their readers (docstring);
    `cache`: a `ScoreCache` of this graph, mesh and options whose op prices to read. A gather
    is the ring's when every round it gathers in is data-parallel (not `tensor_rounds`): a
    tensor-parallel gather (logits read whole by a loss) runs no ring and stays exposed. Each
    reader's exchange runs under its own compute only (a ring turns inside one attention).
    O(ops x operands x rounds)."""
    cache = cache if cache is not None else ScoreCache(graph, mesh, opts)
    tensor = set(tensor_rounds(graph, mesh, strategies, cache))
    prices = [
        cache.price(op, cid, tuple(strategies[op.name]))
        for op, cid in zip(graph.ops, cache.classes, strict=True)
    ]
    out_layout = {  # `evaluate.output_layouts`
        name: layout
        for op, price in zip(graph.ops, prices, strict=True)
        for name, layout in zip(op.outputs, price.resolved, strict=True)
    }
    gather = scatter = fwd = bwd = exposed_fwd = exposed_bwd = 0.0
    for op, price in zip(graph.ops, prices, strict=True):
        own_gather = own_scatter = 0.0
        reads = False
        for i, name in enumerate(op.inputs):
            src = out_layout.get(name)
            if src is None:
                continue  # graph inputs, parameters, constants
            dst = price.inputs[i]
            gathered = [r for r, (s, d) in enumerate(zip(src, dst, strict=True)) if s >= 0 > d]
            if gathered and not tensor.intersection(gathered):
                terms = cache.move(name, src, dst)  # `evaluate.edge_terms`
                own_gather += terms.redistribution_fwd
                own_scatter += terms.redistribution_bwd
                reads = True
        if reads:  # the SPMD price of the gathered operands' gradients: the reader's all-reduce
            own_scatter += price.intra.intra_bwd  # `evaluate.unary_terms`, `work.forward_compute`
            op_bwd = price.compute - price.forward
            gather, scatter = gather + own_gather, scatter + own_scatter
            fwd, bwd = fwd + price.forward, bwd + op_bwd
            exposed_fwd += max(0.0, own_gather - price.forward)
            exposed_bwd += max(0.0, 2 * own_gather - op_bwd)
    return RingTerms(gather, scatter, fwd, bwd, exposed_fwd, exposed_bwd)


__all__ = [
    "RingTerms",
    "param_dims",
    "ring_terms",
    "sequence_parallel_strategies",
    "tensor_rounds",
]
