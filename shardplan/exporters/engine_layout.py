"""The engine layout of a TrainingPlan: the parallel degrees and switches the engines configure.

`read_layout(tp, menu)` reads off the plan, checking every construct against the engine's menu
(`shardplan.search.step.menus`): each stage plan must be one of the expert layouts the engines run —
tensor parallelism of degree t on the innermost rounds with Megatron-style cuts
(`experts.megatron`), data parallelism on the other ways (t = 1: `experts.data_parallel`) — with
the same t on every stage; the same levers on every stage, allowed by the menu; stage boundaries
at layer boundaries (`menus.layer_split` over the stages' segment fingerprints) split as the
engine can say; each micro-batch divisible over the data-parallel ways; a precision the engine
trains in; and no lever or plan field this module does not map (a lever added to the step model
later is refused by name until its mapping is written). Anything else is a PlanError naming the
stage, op and construct and suggesting `--target`. `architecture` resolves the model's
hyper-parameters from the zoo. Cost: O(stages x tensor degrees x expert pass).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from shardplan.cost.step import Levers, Recompute
from shardplan.errors import PlanError
from shardplan.ir.graph import Graph, make_graph
from shardplan.ir.op import Role, Tensor
from shardplan.ir.segments import segments
from shardplan.plans import Plan
from shardplan.search import experts
from shardplan.search.step.menus import Menu, graph_layers, tensor_degrees
from shardplan.training import TrainingPlan

_MAPPED_LEVERS = frozenset({"recompute", "zero"})
"""Levers fields the exporters map; any other field set away from its default is refused."""
_MAPPED_PLAN = frozenset(
    {
        "model", "mesh", "batch", "micro_batches", "stages", "method", "tokens_per_sample",
        "axes", "search_seconds", "notes", "step", "problem",
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
    """Transformer layers per pipeline stage."""
    recompute: Recompute
    zero: int
    precision: str
    step_s: float


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


def _tensor_degree(plan: Plan, s: int, menu: Menu) -> int:
    """The t whose expert layout equals the stage plan's strategies (PlanError if none)."""
    mesh, graph = plan.mesh, plan.graph
    closest: tuple[int, int, str] | None = None  # (matching ops, t, first differing op)
    for t in tensor_degrees(mesh):
        want = experts.data_parallel(graph, mesh) if t == 1 else experts.megatron(graph, mesh, t)
        differ = [
            op.name for op in graph.ops if tuple(want[op.name]) != tuple(plan.strategies[op.name])
        ]
        if not differ:
            if t not in menu.tensor_degrees(mesh):
                raise _refuse(
                    menu.engine,
                    f"stage {s}",
                    f"tensor parallelism x{t} without sequence-parallel norms ({menu.engine} "
                    "always shards norms over the sequence; the step model has no such lever yet)",
                )
            return t
        if closest is None or len(graph.ops) - len(differ) > closest[0]:
            closest = (len(graph.ops) - len(differ), t, differ[0])
    assert closest is not None
    _, t, op = closest
    cuts = plan.strategies[op]
    rounds = ", ".join(
        f"{r.axis_name}/{r.q}: {c or '-'}" for r, c in zip(mesh.rounds, cuts, strict=True)
    )
    layout = "data parallelism" if t == 1 else f"tensor parallelism x{t} (Megatron cuts)"
    raise _refuse(
        menu.engine,
        f"stage {s}, op {op!r}",
        f"its cuts ({rounds}) are not the engine's {layout} or any other tensor x data layout",
    )


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
    degrees = [_tensor_degree(stage.plan, s, menu) for s, stage in enumerate(tp.stages)]
    if len(set(degrees)) > 1:
        raise _refuse(engine, "the plan", f"tensor degrees {degrees} differ between stages")
    levers = [stage.levers for stage in tp.stages]
    keys = {(lv.recompute, lv.zero) for lv in levers}  # the mapped fields (_MAPPED_LEVERS)
    if len(keys) > 1:
        raise _refuse(engine, "the plan", f"levers differ between stages ({_levers_text(levers)})")
    if keys.pop() not in {(lv.recompute, lv.zero) for lv in menu.levers(tp.pipeline_stages)}:
        raise _refuse(
            engine,
            "the plan",
            f"{levers[0].recompute.value} recomputation with ZeRO-{levers[0].zero} on "
            f"{tp.pipeline_stages} pipeline stage(s)",
        )
    opts = tp.stages[0].plan.options
    precision = opts.precision.name if opts.precision is not None else "fp32"
    if precision not in menu.precisions:
        raise _refuse(engine, "the plan", f"training in {precision}")
    t, n = degrees[0], tp.pipeline_stages
    data = tp.mesh.size // (t * n)
    micro = tp.batch // tp.micro_batches
    if micro % data:
        raise _refuse(
            engine, "the plan", f"micro-batches of {micro} samples over {data} data-parallel ways"
        )
    layers = _stage_layers(tp, menu)
    _check_split(layers, menu)
    assert tp.step is not None
    return EngineLayout(
        engine=engine,
        model=tp.model,
        world=tp.mesh.size,
        pipeline=n,
        tensor=t,
        data=data,
        batch=tp.batch,
        micro_batches=tp.micro_batches,
        micro_batch_size=micro // data,
        seq_len=tp.tokens_per_sample,
        layers=layers,
        recompute=levers[0].recompute,
        zero=levers[0].zero,
        precision=precision,
        step_s=tp.step.step_s,
    )


def _check_split(layers: tuple[int, ...], menu: Menu) -> None:
    """Megatron says first/last stage layer counts apart from an even middle; the others split
    pipelines evenly (DeepSpeed's type:transformer partition) or by module list (torchtitan)."""
    if menu.stage_layers == "any" or len(set(layers)) <= 1:
        return
    middle = layers[1:-1]
    if menu.stage_layers == "first-last" and len(set(middle)) <= 1:
        return
    raise PlanError(
        f"{menu.engine} cannot express layers per pipeline stage {list(layers)}; plan with "
        f"`shardplan plan MODEL ... --target {menu.engine}`"
    )


def _levers_text(levers: list[Levers]) -> str:
    return "; ".join(
        f"stage {s}: {lv.recompute.value}, ZeRO-{lv.zero}" for s, lv in enumerate(levers)
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
    out = {k: int(values[k]) for k in keys if isinstance(values.get(k), int)}
    if "max_positions" not in out and "seq" in out:
        out["max_positions"] = out["seq"]
    return out


FAMILIES: Mapping[str, str] = {"llm.llama": "llama", "transformer.gpt": "gpt"}
"""Zoo builders whose architecture the engines name (gated MLP, RMSNorm, RoPE for "llama")."""


def family(name: str) -> str | None:
    """The architecture family of a zoo model ("llama", "gpt"), None when not mapped."""
    from shardplan import zoo

    entry = zoo.MODELS.get(name)
    return FAMILIES.get(entry.builder_path) if entry is not None else None


__all__ = ["FAMILIES", "EngineLayout", "architecture", "family", "read_layout"]
