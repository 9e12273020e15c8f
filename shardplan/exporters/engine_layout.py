"""The engine layout of a TrainingPlan: the parallel degrees and switches the engines configure.

`read_layout(tp, menu)` reads off the plan, checking every construct against the engine's menu
(`shardplan.search.step.menus`): each stage plan must be one of the layouts the engines run, as
the step search and the Megatron recipe construct them — tensor parallelism of degree t on the
innermost rounds with Megatron-style cuts (`experts.megatron`), data parallelism on the other ways
(t = 1: `experts.data_parallel`), optionally expert parallelism e ways (`recipes.expert_parallel`)
or context parallelism c ways (`recipes.context_rounds` + `experts.context_parallel`) on the
rounds next to it, recognised by equality with that construction, never by op names — with the
same (t, c, e) on every stage; the same levers on every stage (the sequence-parallel lever, the
context-parallel lever agreeing with c, `tp_comm_overlap` only in an engine that has it:
`Menu.tp_comm_overlap`), each allowed by the menu, as are v model chunks per stage
(`TrainingPlan.virtual_stages`); stage boundaries
at layer boundaries (`menus.layer_split` over the stages' segment fingerprints) split as the
engine can say; each micro-batch divisible over the data-parallel ways; a precision the engine
trains in; and no lever or plan field this module does not map (a lever added to the step model
later is refused by name until its mapping is written). Anything else is a PlanError naming the
stage, op and construct and suggesting `--target`. `architecture` resolves the model's
hyper-parameters from the zoo (MoE sizes included). Cost: O(stages x layouts x expert pass), the
layouts being the tensor degrees x (1 + context and expert degrees).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from shardplan.cost.step import Levers, Recompute
from shardplan.errors import PlanError
from shardplan.ir.graph import Graph, make_graph
from shardplan.ir.op import Role, Tensor
from shardplan.ir.segments import segments
from shardplan.mesh import Mesh
from shardplan.plans import Plan
from shardplan.search import experts
from shardplan.search.step.menus import Menu, graph_layers
from shardplan.search.step.profiles import data_degrees, stage_tensor_degrees
from shardplan.search.step.recipes import context_rounds, expert_dim, expert_parallel
from shardplan.search.step.uneven import chunk_layers, stage_counts
from shardplan.sharding import Strategy
from shardplan.training import TrainingPlan

_MAPPED_LEVERS = frozenset(
    {
        "recompute", "zero", "sequence_parallel", "context_parallel", "overlap_grad_reduce",
        "overlap_p2p", "prefetch", "bucket_elements", "tp_comm_overlap",
    }
)  # fmt: skip
"""Levers fields the exporters map; any other field set away from its default is refused."""
_MAPPED_PLAN = frozenset(
    {
        "model", "mesh", "batch", "micro_batches", "stages", "method", "tokens_per_sample",
        "axes", "search_seconds", "notes", "step", "problem", "virtual_stages", "step_floor_s",
    }
)  # fmt: skip
_MAPPED_STAGE = frozenset({"plan", "levers"})


@dataclass(frozen=True, slots=True)
class EngineLayout:
    """What an engine's configuration says for one training plan."""

    engine: str
    model: str
    world: int
    pipeline: int
    tensor: int
    data: int
    batch: int
    micro_batches: int
    micro_batch_size: int
    """Samples per data-parallel rank per micro-batch."""
    seq_len: int
    layers: tuple[int, ...]
    """Transformer layers per model chunk: S x v entries in model order, chunk c on pipeline
    stage c mod S (v = 1: one entry per pipeline stage)."""
    recompute: Recompute
    zero: int
    precision: str
    step_s: float
    sequence_parallel: bool = False
    """Megatron-LM sequence parallelism over the tensor-parallel group (the stage lever)."""
    context: int = 1
    """Context-parallel ways (the sequence split next to tensor parallelism)."""
    expert: int = 1
    """Expert-parallel ways (inside the data-parallel group)."""
    virtual: int = 1
    """Model chunks per pipeline stage (interleaved 1F1B when > 1)."""
    moe: bool = False
    """The model has expert layers (the engines need their expert count and routing)."""
    overlap_grad_reduce: bool = False
    """The gradient sync overlapped with the backward (the stage lever, `cost.overlap`)."""
    overlap_p2p: bool = False
    """Pipeline sends overlapped with compute (the stage lever)."""
    tp_comm_overlap: bool = False
    """Sequence parallelism's all-gathers / reduce-scatters run under their GEMMs (the stage
    lever; one switch for the whole run: Megatron-LM `--tp-comm-overlap`, torchtitan
    `enable_async_tensor_parallel`)."""
    prefetch: bool = False
    """ZeRO-3's parameter gathers prefetched under the compute (the stage lever at ZeRO-3:
    Megatron-LM `--overlap-param-gather`; FSDP2 and DeepSpeed stage 3 by default)."""


def _refuse(engine: str, where: str, construct: str) -> PlanError:
    return PlanError(
        f"{engine} cannot express {where}: {construct}; plan with `shardplan plan MODEL ... "
        f"--target {engine}` to search within what {engine} can run"
    )


def _check_fields(tp: TrainingPlan, engine: str) -> None:
    """Refuse a plan or lever field that has no mapping yet (set away from its default)."""
    checks: list[tuple[str, object, frozenset[str]]] = [("the plan", tp, _MAPPED_PLAN)]
    for s, stage in enumerate(tp.stages):
        checks += [
            (f"stage {s}", stage, _MAPPED_STAGE),
            (f"stage {s}", stage.levers, _MAPPED_LEVERS),
        ]
    for where, obj, mapped in checks:
        for f in dataclasses.fields(obj):  # type: ignore[arg-type]
            if f.name in mapped:
                continue
            default = f.default if f.default is not dataclasses.MISSING else None
            value = getattr(obj, f.name)  # the generic guard; mapped fields are read by name
            if value != default:
                raise _refuse(engine, where, f"{type(obj).__name__}.{f.name} = {value!r}")


@dataclass(frozen=True, slots=True)
class _Degrees:
    """A stage plan's layout: tensor, context and expert ways."""

    tensor: int
    context: int = 1
    expert: int = 1


def _layouts(graph: Graph, mesh: Mesh, moe: bool) -> Iterator[tuple[_Degrees, Callable[[], Any]]]:
    """Every engine layout of a stage, as the step search and the recipe construct it: data
    parallelism, Megatron at each tensor degree t (innermost rounds), with expert parallelism
    e ways (`recipes.expert_parallel`, a model with expert layers) or context parallelism c
    ways (`recipes.context_rounds` + `experts.context_parallel`) on the rounds next to it."""
    yield _Degrees(1), lambda: experts.data_parallel(graph, mesh)
    for t in stage_tensor_degrees(mesh):
        yield _Degrees(t), lambda t=t: experts.megatron(graph, mesh, t)
    for t in (1, *stage_tensor_degrees(mesh)):
        for d in data_degrees(mesh, t):
            if moe:
                yield (
                    _Degrees(t, expert=d),
                    lambda t=t, d=d: expert_parallel(
                        graph, mesh, experts.megatron(graph, mesh, t), d
                    ),
                )
            yield _Degrees(t, context=d), lambda t=t, d=d: _context(graph, mesh, t, d)


def _context(graph: Graph, mesh: Mesh, t: int, c: int) -> dict[str, Strategy]:
    st = experts.megatron(graph, mesh, t)
    return experts.context_parallel(graph, mesh, st, context_rounds(mesh, st, graph, c))


def _stage_degrees(plan: Plan, s: int, engine: str, moe: bool) -> _Degrees:
    """The layout whose construction equals the stage plan's strategies (PlanError if none)."""
    mesh, graph = plan.mesh, plan.graph
    closest: tuple[int, _Degrees, str] | None = None  # (matching ops, layout, first differing op)
    for degrees, construct in _layouts(graph, mesh, moe):
        try:
            want = construct()
        except PlanError:  # ways that do not divide this stage's dims: not its layout
            continue
        differ = [
            op.name for op in graph.ops if tuple(want[op.name]) != tuple(plan.strategies[op.name])
        ]
        if not differ:
            return degrees
        if closest is None or len(graph.ops) - len(differ) > closest[0]:
            closest = (len(graph.ops) - len(differ), degrees, differ[0])
    assert closest is not None
    _, degrees, op = closest
    cuts = plan.strategies[op]
    rounds = ", ".join(
        f"{r.axis_name}/{r.q}: {c or '-'}" for r, c in zip(mesh.rounds, cuts, strict=True)
    )
    raise _refuse(
        engine,
        f"stage {s}, op {op!r}",
        f"its cuts ({rounds}) are not the engine's {_degrees_text(degrees)} or any other "
        "tensor x context x expert x data layout",
    )


def _degrees_text(d: _Degrees) -> str:
    if d.tensor == 1 and d.context == 1 and d.expert == 1:
        return "data parallelism"
    text = f"tensor parallelism x{d.tensor} (Megatron cuts)"
    text += f" with context parallelism x{d.context}" if d.context > 1 else ""
    return text + (f" with expert parallelism x{d.expert}" if d.expert > 1 else "")


def joined(tp: TrainingPlan) -> Graph:
    """The whole model again: the stage graphs' ops in order, the boundary activations that
    stages read as inputs made activations again (so segments see the residual stream)."""
    tensors: dict[str, Tensor] = {}
    produced: set[str] = set()
    ops = []
    for stage in tp.stages:
        g = stage.plan.graph
        for name, t in g.tensors.items():
            if name in produced and t.role is Role.INPUT:
                t = replace(t, role=Role.ACTIVATION)
            tensors.setdefault(name, t)
            if name in produced:
                tensors[name] = replace(tensors[name], role=Role.ACTIVATION)
        for op in g.ops:
            produced.update(op.outputs)
            ops.append(op)
    return make_graph(tp.model, tensors, tuple(ops))


def _stage_layers(tp: TrainingPlan, menu: Menu) -> tuple[int, ...]:
    """Layers per stage; PlanError when a stage boundary falls inside a layer."""
    whole = joined(tp)
    segs = segments(whole)
    split = graph_layers(whole)
    layer_starts = [segs[split.layer_start(i)].start for i in range(split.layers)]
    starts, at = [], 0
    for stage in tp.stages:
        starts.append(at)
        at += len(stage.plan.graph.ops)
    out = []
    for s, (a, stage) in enumerate(zip(starts, tp.stages, strict=True)):
        if s > 0 and a not in layer_starts:
            first = stage.plan.graph.ops[0].name
            raise _refuse(
                menu.engine,
                f"stage {s}",
                f"it starts at op {first!r}, inside a transformer layer (the engines split "
                "pipelines at layer boundaries)",
            )
        b = starts[s + 1] if s + 1 < len(starts) else at
        out.append(sum(1 for x in layer_starts if a <= x < b))
    return tuple(out)


def read_layout(tp: TrainingPlan, menu: Menu) -> EngineLayout:
    """The engine layout of `tp` (module docstring); PlanError naming what `menu` cannot say."""
    engine = menu.engine
    _check_fields(tp, engine)
    graphs = [stage.plan.graph for stage in tp.stages]
    moe = any(expert_dim(g, op) is not None for g in graphs for op in g.ops)
    degrees = [_stage_degrees(stage.plan, s, engine, moe) for s, stage in enumerate(tp.stages)]
    if len(set(degrees)) > 1:
        texts = [_degrees_text(d) for d in degrees]
        raise _refuse(engine, "the plan", f"stage layouts differ between stages ({texts})")
    levers = [stage.levers for stage in tp.stages]
    _check_tp_comm_overlap(levers, menu)
    if len(set(levers)) > 1:
        raise _refuse(engine, "the plan", f"levers differ between stages ({_levers_text(levers)})")
    lv, d, n = levers[0], degrees[0], tp.pipeline_stages
    _check_parallelism(tp, menu, lv, d)
    if (lv.recompute, lv.zero) not in {(x.recompute, x.zero) for x in menu.levers(n)}:
        raise _refuse(
            engine,
            "the plan",
            f"{lv.recompute.value} recomputation with ZeRO-{lv.zero} on {n} pipeline stage(s)",
        )
    opts = tp.stages[0].plan.options
    precision = opts.precision.name if opts.precision is not None else "fp32"
    if precision not in menu.precisions:
        raise _refuse(engine, "the plan", f"training in {precision}")
    data = tp.mesh.size // (d.tensor * d.context * n)
    micro = tp.batch // tp.micro_batches
    if micro % data:
        raise _refuse(
            engine, "the plan", f"micro-batches of {micro} samples over {data} data-parallel ways"
        )
    layers = _stage_layers(tp, menu)
    _check_split(layers, menu, tp.virtual_stages)
    _check_overlaps(lv, menu, tp.virtual_stages)
    assert tp.step is not None
    return EngineLayout(
        engine=engine,
        model=tp.model,
        world=tp.mesh.size,
        pipeline=n,
        tensor=d.tensor,
        data=data,
        batch=tp.batch,
        micro_batches=tp.micro_batches,
        micro_batch_size=micro // data,
        seq_len=tp.tokens_per_sample,
        layers=layers,
        recompute=lv.recompute,
        zero=lv.zero,
        precision=precision,
        step_s=tp.step.step_s,
        sequence_parallel=lv.sequence_parallel,
        context=d.context,
        expert=d.expert,
        virtual=tp.virtual_stages,
        moe=moe,
        overlap_grad_reduce=lv.overlap_grad_reduce,
        overlap_p2p=lv.overlap_p2p,
        tp_comm_overlap=lv.tp_comm_overlap,
        prefetch=lv.prefetch and lv.zero == 3,
    )


def _check_overlaps(lv: Levers, menu: Menu, virtual: int) -> None:
    """What the plan priced as overlapped, the engine must run overlapped: its default or a
    switch its configuration has (`Menu.with_overlaps`); else the run would be slower than the
    plan says."""
    p2p = menu.overlap_p2p or menu.p2p_switch
    grad = (*menu.overlap_grad_reduce, *menu.grad_reduce_switch)
    prefetch = (*menu.prefetch, *menu.prefetch_switch)
    missing = [
        what
        for what, priced, runs in (
            ("pipeline sends under compute (overlap_p2p)", lv.overlap_p2p, p2p and virtual > 1),
            ("the gradient sync under the backward", lv.overlap_grad_reduce, lv.zero in grad),
            ("ZeRO-3 prefetch", lv.prefetch and lv.zero == 3, 3 in prefetch),
        )
        if priced and not runs
    ]
    if lv.prefetch and lv.zero == 3 and menu.prefetch_needs_grad_reduce:
        if not lv.overlap_grad_reduce:
            missing.append("ZeRO-3 prefetch without the gradient sync overlapped")
    if missing:
        raise _refuse(
            menu.engine,
            "the plan",
            f"{'; '.join(missing)} at ZeRO-{lv.zero}{' interleaved' if virtual > 1 else ''} "
            f"(the plan priced it so; docs/engines.md): re-plan without that overlap flag, or "
            f"with --target {menu.engine}",
        )


def _check_tp_comm_overlap(levers: list[Levers], menu: Menu) -> None:
    """The tensor-parallel communication overlap: one switch for the whole run, in an engine
    that can say it (`Menu.tp_comm_overlap`). Sequence parallelism with it needs no check here:
    a TrainingPlan cannot hold the lever without it (`cost.step.stage_cost` refuses it)."""
    engine, where = menu.engine, "the plan"
    on = [s for s, lv in enumerate(levers) if lv.tp_comm_overlap]
    if not on:
        return
    if not menu.tp_comm_overlap:
        raise _refuse(
            engine,
            where,
            f"tp_comm_overlap on stage(s) {on} (sequence parallelism's all-gathers and reduce-"
            f"scatters under their GEMMs; {engine} has no equivalent): re-plan without it (drop "
            "--tp-comm-overlap / tp_comm_overlap=True), or export with `--to megatron` "
            "(--tp-comm-overlap) or `--to torchtitan` (async tensor parallelism)",
        )
    off = [s for s in range(len(levers)) if s not in on]
    if off:
        raise _refuse(
            engine,
            where,
            f"tp_comm_overlap on stage(s) {on} but not on {off} ({engine} switches it for the "
            "whole run); re-plan with tp_comm_overlap on every stage or on none",
        )


def _check_parallelism(tp: TrainingPlan, menu: Menu, lv: Levers, d: _Degrees) -> None:
    """The sequence / context / expert / virtual choices: consistent and sayable by `menu`."""
    engine, where = menu.engine, "the plan"
    if lv.context_parallel != (d.context > 1):
        raise _refuse(
            engine,
            where,
            f"the context-parallel lever is {'on' if lv.context_parallel else 'off'} but the "
            f"stage plans split the sequence {d.context} ways",
        )
    if lv.sequence_parallel and d.tensor == 1:
        raise _refuse(engine, where, "sequence parallelism without tensor parallelism")
    if d.tensor > 1 and menu.tensor_needs_sequence_parallel and not lv.sequence_parallel:
        raise _refuse(
            engine,
            where,
            f"tensor parallelism x{d.tensor} without sequence parallelism ({engine}'s tensor "
            "parallelism always shards the norms over the sequence: the SP lever must be on)",
        )
    wanted = (
        (lv.sequence_parallel, menu.sequence_parallel, "sequence parallelism"),
        (d.context > 1, menu.context, f"context parallelism x{d.context}"),
        (d.expert > 1, menu.expert, f"expert parallelism x{d.expert}"),
        (tp.virtual_stages > 1, menu.virtual, f"{tp.virtual_stages} model chunks per stage "
         "(interleaved 1F1B)"),
    )  # fmt: skip
    for used, sayable, what in wanted:
        if used and not sayable:
            raise _refuse(engine, where, what + (f" ({menu.instead})" if menu.instead else ""))


def _check_split(layers: tuple[int, ...], menu: Menu, virtual: int = 1) -> None:
    """Megatron says first/last stage layer counts apart from an even middle, each stage's
    layers in `virtual` equal chunks (`uneven.chunk_layers`); the others split pipelines evenly
    (DeepSpeed's type:transformer partition) or by module list per chunk (torchtitan)."""
    if menu.stage_layers == "any" or len(set(layers)) <= 1:
        return
    stages = len(layers) // virtual
    counts = stage_counts(layers, stages)
    middle = counts[1:-1]
    equal = not any(c % virtual for c in counts) and layers == chunk_layers(counts, virtual)
    if menu.stage_layers == "first-last" and len(set(middle)) <= 1 and equal:
        return
    what = "per model chunk" if virtual > 1 else "per pipeline stage"
    raise PlanError(
        f"{menu.engine} cannot express layers {what} {list(layers)}"
        f"{f' with {virtual} chunks per stage' if virtual > 1 else ''}; plan with `shardplan "
        f"plan MODEL ... --target {menu.engine}`"
    )


def _levers_text(levers: list[Levers]) -> str:
    return "; ".join(
        f"stage {s}: {lv.recompute.value}, ZeRO-{lv.zero}"
        + (", SP" if lv.sequence_parallel else "")
        + (", CP" if lv.context_parallel else "")
        + (", TP comm overlap" if lv.tp_comm_overlap else "")
        for s, lv in enumerate(levers)
    )


def architecture(
    name: str, small: bool = False, overrides: Mapping[str, Any] | None = None
) -> dict[str, int]:
    """The zoo model's hyper-parameters (layers, hidden, heads, seq, vocab, max_positions):
    builder defaults <- entry defaults <- small sizes <- overrides; {} for a non-zoo model."""
    from shardplan import zoo

    entry = zoo.MODELS.get(name)
    if entry is None:
        return {}
    params = inspect.signature(entry.builder).parameters
    values: dict[str, Any] = {
        k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty
    }
    values.update(entry.defaults)
    if small:
        values.update(entry.small)
    values.update({k: v for k, v in (overrides or {}).items() if v is not None})
    keys = ("layers", "hidden", "heads", "kv_heads", "ffn", "seq", "vocab", "max_positions")
    keys += ("experts", "top_k", "expert_ffn", "shared", "dense_layers", "q_rank")
    out = {k: int(values[k]) for k in keys if isinstance(values.get(k), int)}
    if "max_positions" not in out and "seq" in out:
        out["max_positions"] = out["seq"]
    return out


FAMILIES: Mapping[str, str] = {
    "llm.llama": "llama",
    "transformer.gpt": "gpt",
    "llm.moe_llm": "llama",  # Mixtral: Llama blocks with routed gated-MLP experts
}
"""Zoo builders whose architecture the engines name (gated MLP, RMSNorm, RoPE for "llama")."""


def family(name: str) -> str | None:
    """The architecture family of a zoo model ("llama", "gpt"), None when not mapped."""
    from shardplan import zoo

    entry = zoo.MODELS.get(name)
    return FAMILIES.get(entry.builder_path) if entry is not None else None


__all__ = ["FAMILIES", "EngineLayout", "architecture", "family", "read_layout"]
