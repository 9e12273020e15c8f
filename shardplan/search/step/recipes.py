"""Hand-made training recipes as ordinary TrainingPlans, scored by the same step model.

megatron_recipe — Megatron-LM as Narayanan et al. (SC'21) and Korthikanti et al. (MLSys'23) run
it: tensor parallelism on the innermost mesh ways (within a node), pipeline parallelism over the
outermost axis (nodes), data parallelism on the remaining ways; the model cut into pipeline x v
chunks of equal whole layers as Megatron-LM cuts it (`stages.aligned_starts`: the embedding with
the first, the head with the last), FLOP-balanced over segments when the layers do not divide
evenly (the same cuts the search tries), device group d holding chunks d, d + S, ...
(interleaved 1F1B when v > 1); m = batch / (data-parallel ways x micro-batch size)
micro-batches. Knobs as published: recomputation (full, the SC'21 setting;
selective; none), sequence parallelism (`cost.sequence`), v model chunks per device, the
distributed optimizer (ZeRO-1 over the data-parallel group, `cost.zero`), expert parallelism
(`expert_parallel`: the experts split over the innermost data-parallel ways, all-to-alls priced
by the evaluator), context parallelism (`experts.context_parallel`: the sequence split on the
innermost data-parallel rounds, the K/V ring exchange priced by `cost.sequence.ring_terms`), and
Megatron-LM's overlap knobs (`overlap_grad_reduce`, `overlap_p2p`: `cost.overlap`).
One expert pass per chunk: O(S v (|V| + |E|) rounds).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from shardplan import checks
from shardplan.cost import CostOptions
from shardplan.cost.evaluate import ScoreCache
from shardplan.cost.overlap import megatron_bucket
from shardplan.cost.sequence import tensor_rounds
from shardplan.cost.step import Levers, Recompute, profile_stage
from shardplan.errors import PlanError
from shardplan.ir.dims import DimKind
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role
from shardplan.ir.signature import loop_names, major_positions
from shardplan.mesh import Mesh
from shardplan.plans import Plan
from shardplan.search.experts import context_parallel, megatron
from shardplan.search.step.notes import axis_summary
from shardplan.search.step.stages import (
    megatron_starts,
    stage_graphs,
    stage_mesh,
    tokens_per_sample,
)
from shardplan.sharding import Strategy, cut_problem
from shardplan.training import TrainingPlan, assemble, at_precision

KNOBS = (
    "micro_batch_size",
    "recompute",
    "sequence_parallel",
    "virtual_stages",
    "context",
    "distributed_optimizer",
    "expert",
    "overlap_grad_reduce",
    "overlap_p2p",
    "tp_comm_overlap",
)
"""The recipe's keyword knobs after (build, batch, mesh, opts, tensor, pipeline)."""


def _positive(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise PlanError(f"megatron-recipe: {name} must be a positive integer, got {value!r}")
    return value


def _flag(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise PlanError(f"megatron-recipe: {name} must be True or False, got {value!r}")
    return value


def _recompute(value: object) -> Recompute:
    if isinstance(value, Recompute):
        return value
    try:
        return Recompute(value)
    except ValueError:
        raise PlanError(
            f"megatron-recipe: recompute must be one of {[r.value for r in Recompute]}, "
            f"got {value!r}"
        ) from None


def _check_knobs(
    mesh: Mesh, batch: int, tensor: int, pipeline: int, mbs: int, v: int, context: int, expert: int
) -> tuple[int, int]:
    """(data-parallel ways, micro-batches) of the knobs on `mesh`, or a PlanError naming the
    knob that does not fit."""
    for name, value in (("tensor", tensor), ("pipeline", pipeline), ("batch", batch)):
        _positive(name, value)
    _positive("micro_batch_size", mbs)
    _positive("virtual_stages", v)
    if _positive("context", context) > 1 and expert > 1:
        raise PlanError(
            f"megatron-recipe: context={context} with expert={expert}: context and expert "
            "parallelism together are not modelled yet; use one of them"
        )
    _positive("expert", expert)
    if mesh.shape[0] % pipeline:
        raise PlanError(
            f"pipeline degree {pipeline} does not divide the outermost mesh axis {mesh.shape[0]}"
            " (pipeline stages split it); pick --pipeline among its divisors"
        )
    if mesh.size % (tensor * pipeline):
        raise PlanError(
            f"tensor {tensor} x pipeline {pipeline} does not divide {mesh.size} devices; pick "
            "--tensor and --pipeline whose product divides the mesh"
        )
    if v > 1 and pipeline == 1:
        raise PlanError(
            f"megatron-recipe: virtual_stages={v} interleaves model chunks over pipeline stages; "
            "it needs pipeline > 1"
        )
    if (mesh.size // (tensor * pipeline)) % context:
        raise PlanError(
            f"megatron-recipe: context={context} must divide the "
            f"{mesh.size // (tensor * pipeline)} ways left by tensor x pipeline"
        )
    data = mesh.size // (tensor * pipeline * context)
    if data % expert:
        raise PlanError(
            f"megatron-recipe: expert={expert} must divide the {data} data-parallel ways "
            "(expert parallelism runs inside the data-parallel group)"
        )
    per_step = data * mbs
    if batch % per_step:
        raise PlanError(
            f"batch {batch} is not a multiple of data-parallel ways {data} x micro-batch size "
            f"{mbs}; use a batch that is, a smaller --micro-batch-size, or more tensor or "
            "pipeline ways"
        )
    m = batch // per_step
    if v > 1 and m % pipeline:
        raise PlanError(
            f"megatron-recipe: the interleaved schedule needs the {m} micro-batches to be a "
            f"multiple of pipeline {pipeline} (as Megatron-LM requires)"
        )
    return data, m


def context_rounds(
    mesh: Mesh,
    strategies: dict[str, Strategy],
    graph: Graph,
    c: int,
    cache: ScoreCache | None = None,
) -> list[int]:
    """The innermost rounds outside tensor parallelism whose q multiply to `c` (context
    parallelism next to tensor parallelism, as Megatron-LM orders its ranks); PlanError if none.
    `cache`: a `ScoreCache` of `graph` keeping its ops' parameter dims."""
    return _free_rounds(mesh, strategies, graph, c, "context", cache)


def _free_rounds(
    mesh: Mesh,
    strategies: dict[str, Strategy],
    graph: Graph,
    ways: int,
    knob: str,
    cache: ScoreCache | None = None,
) -> list[int]:
    """The innermost rounds no op splits a parameter in whose q multiply to `ways` (the fast
    links first); PlanError naming `knob` when they do not."""
    tensor = set(tensor_rounds(graph, mesh, strategies, cache))
    rounds, got = [], 1
    for r in reversed(mesh.rounds):
        if r.index not in tensor and got < ways and r.q > 1:
            rounds.append(r.index)
            got *= r.q
    if got != ways:
        raise PlanError(
            f"megatron-recipe: {knob}={ways} is not a product of the data-parallel rounds "
            f"{[r.q for r in mesh.rounds if r.index not in tensor]} of the stage mesh"
        )
    return rounds


def expert_parallel(
    graph: Graph,
    mesh: Mesh,
    strategies: dict[str, Strategy],
    expert: int,
    expert_dims: Mapping[str, str | None] | None = None,
    cache: ScoreCache | None = None,
) -> dict[str, Strategy]:
    """`strategies` with expert parallelism `expert` ways on the innermost data-parallel rounds
    (the rounds no op splits a parameter in, innermost first: the fast links carry the
    all-to-alls): there each op with a PARALLEL loop dim that indexes both a parameter and an
    activation (the experts of an expert matmul) cuts it instead of the batch; the evaluator
    prices the layout change around it (tokens split by group -> by expert) as the all-to-all
    it is. PlanError when the rounds or the model do not allow it. `expert_dims`: each op's
    `expert_dim` when known; `cache`: as `context_rounds`'."""
    if expert == 1:
        return strategies
    rounds = _free_rounds(mesh, strategies, graph, expert, "expert", cache)
    out, found = dict(strategies), False
    split_at: dict[str, int] = {}  # tensor -> the dim the experts split it along
    for op in graph.ops:
        dim = expert_dim(graph, op) if expert_dims is None else expert_dims[op.name]
        if (
            dim is None
            and op.inputs
            and op.inputs[0] in split_at
            and not any(graph.tensors[t].role is Role.PARAMETER for t in op.inputs)
        ):  # an op between expert matmuls (the activation) keeps the expert split
            group = op.signature.inputs[0][split_at[op.inputs[0]]]
            dim = group[0] if group else None
            required = False
        else:
            required = True
        if dim is None:
            continue
        cut = _cut_rounds(op, strategies[op.name], dim, rounds, mesh)
        if cut is None:
            if required:
                raise PlanError(
                    f"megatron-recipe: expert={expert} does not divide loop dim {dim!r} "
                    f"(extent {op.signature.extents[dim]}) of op {op.name!r}"
                )
            continue
        out[op.name], found = cut, True
        for i, dims in enumerate(op.signature.outputs):
            position = major_positions(dims).get(dim)
            if position is not None:
                split_at[op.outputs[i]] = position
    if not found:
        raise PlanError(
            f"megatron-recipe: expert={expert}, but {graph.name!r} has no op whose parameter and "
            "activation share a parallel dim (an expert layer); use expert=1"
        )
    return out


def expert_dim(graph: Graph, op: Op) -> str | None:
    """The experts of an expert matmul: a PARALLEL loop dim indexing both an activation and a
    parameter that is contracted (carries a REDUCE dim: a weight, not a bias), if any."""
    roles = [graph.tensors[t].role is Role.PARAMETER for t in op.inputs]
    if not any(roles):  # no parameter: no experts
        return None
    pdims = set().union(*(loop_names(op.signature.inputs[i]) for i, p in enumerate(roles) if p))
    adims = set().union(*(loop_names(op.signature.inputs[i]) for i, p in enumerate(roles) if not p))
    kinds = {d.name: d.kind for d in op.signature.loop_dims}
    if not any(kinds[d] is DimKind.REDUCE for d in pdims):
        return None
    for d in op.signature.loop_dims:
        if d.kind is DimKind.PARALLEL and d.name in pdims & adims:
            return d.name
    return None


def _cut_rounds(
    op: Op, strategy: Strategy, dim: str, rounds: list[int], mesh: Mesh
) -> Strategy | None:
    """`strategy` cutting `dim` in `rounds` instead (None when that is not a valid cut)."""
    out = list(strategy)
    if any(c == dim for r, c in enumerate(out) if r not in rounds):
        return None
    extents = op.signature.extents
    for r, cut in enumerate(out):
        if cut is not None and r not in rounds:
            extents[cut] //= mesh.rounds[r].q
    for r in sorted(rounds):
        if cut_problem(op, dim, extents[dim], mesh.rounds[r].q) is not None:
            return None
        extents[dim] //= mesh.rounds[r].q
        out[r] = dim
    return tuple(out)


def _recipe_note(
    tensor: int,
    pipeline: int,
    data: int,
    micro_batch_size: int,
    m: int,
    lv: Levers,
    context: int,
    expert: int,
    v: int,
) -> str:
    """The recipe's one-line summary of its knobs."""
    schedule = f" (interleaved 1F1B, {v} chunks per device)" if v > 1 else ""
    return (
        f"Megatron-LM recipe: tensor x{tensor}, pipeline x{pipeline}{schedule}, data "
        f"x{data}, micro-batch size {micro_batch_size} ({m} micro-batches), "
        f"{lv.recompute.value} recomputation, "
        + ("sequence parallel, " if lv.sequence_parallel else "")
        + (f"expert parallel x{expert}, " if expert > 1 else "")
        + (f"context parallel x{context}, " if context > 1 else "")
        + ("distributed optimizer (ZeRO-1)" if lv.zero else "no ZeRO")
        + (", gradient reduce overlapped with the backward" if lv.overlap_grad_reduce else "")
        + (", p2p overlapped with compute" if lv.overlap_p2p else "")
        + (", tensor-parallel collectives overlapped with GEMMs" if lv.tp_comm_overlap else "")
    )


def megatron_recipe(
    build: Callable[[int], Graph | None],
    batch: int,
    mesh: Mesh,
    opts: CostOptions,
    tensor: int,
    pipeline: int,
    micro_batch_size: int = 1,
    recompute: Recompute | str = Recompute.FULL,
    *,
    sequence_parallel: bool = False,
    virtual_stages: int = 1,
    context: int = 1,
    distributed_optimizer: bool = False,
    expert: int = 1,
    overlap_grad_reduce: bool = False,
    overlap_p2p: bool = True,
    tp_comm_overlap: bool = False,
) -> TrainingPlan:
    """The Megatron-LM plan with `tensor` x `pipeline` model parallelism on `mesh` and the
    published knobs (module docstring); PlanError for a knob that is unknown or does not fit.
    Overlap at Megatron-LM's defaults (`cost.overlap`): `overlap_grad_reduce` off (megatron-
    core's buckets when on), `overlap_p2p` on, applied to the interleaved schedule only,
    `tp_comm_overlap` off (`--tp-comm-overlap`, needs sequence parallelism)."""
    tensor = checks.positive_int(tensor, "Megatron recipe tensor degree")
    pipeline = checks.positive_int(pipeline, "Megatron recipe pipeline degree")
    micro_batch_size = checks.positive_int(micro_batch_size, "Megatron recipe micro-batch size")
    batch = checks.positive_int(batch, "global batch")
    mesh = at_precision(mesh, opts)
    rec = _recompute(recompute)
    sp_on = _flag("sequence_parallel", sequence_parallel)
    zero = 1 if _flag("distributed_optimizer", distributed_optimizer) else 0
    v = virtual_stages
    grad_overlap = _flag("overlap_grad_reduce", overlap_grad_reduce)
    p2p_overlap = _flag("overlap_p2p", overlap_p2p) and v > 1
    tp_overlap = _flag("tp_comm_overlap", tp_comm_overlap)
    data, m = _check_knobs(mesh, batch, tensor, pipeline, micro_batch_size, v, context, expert)
    if sp_on and tensor == 1:
        raise PlanError(
            "megatron-recipe: sequence_parallel splits the tensor-parallel group's replicated "
            "regions; it needs tensor > 1"
        )
    if tp_overlap and not sp_on:
        raise PlanError(
            "megatron-recipe: tp_comm_overlap overlaps sequence parallelism's all-gathers and "
            "reduce-scatters with their GEMMs (Megatron-LM's --tp-comm-overlap needs "
            "--sequence-parallel); set sequence_parallel=True"
        )
    probe = build(batch)
    graph = build(data * micro_batch_size)  # a micro-batch of every data-parallel replica
    if probe is None or graph is None:
        raise PlanError("the Megatron recipe needs the model at the micro-batch size (zoo models)")
    smesh = stage_mesh(mesh, pipeline)
    levers = Levers(  # every chunk alike; megatron-core buckets over the data x context group
        rec,
        zero,
        sp_on,
        context > 1,
        overlap_grad_reduce=grad_overlap,
        overlap_p2p=p2p_overlap,
        bucket_elements=megatron_bucket(data * context) if grad_overlap else 0,
        tp_comm_overlap=tp_overlap,
    )
    stages = []
    for sub in stage_graphs(graph, megatron_starts(probe, pipeline * v)):
        strategies = expert_parallel(sub, smesh, megatron(sub, smesh, tensor), expert)
        if context > 1:
            rounds = context_rounds(smesh, strategies, sub, context)
            strategies = context_parallel(sub, smesh, strategies, rounds)
        prof = profile_stage(
            sub, smesh, strategies, opts, sequence_parallel=sp_on, context_parallel=context > 1
        )
        plan = Plan(sub, smesh, strategies, "megatron", opts, cost=prof.breakdown)
        stages.append((plan, prof, levers))
    tp = assemble(
        probe.name, mesh, batch, stages, m, "megatron-recipe", tokens_per_sample(probe, batch), v
    )
    note = _recipe_note(tensor, pipeline, data, micro_batch_size, m, levers, context, expert, v)
    return replace(tp, axes=axis_summary(tp), notes=(note,), step=tp.step)
