"""What a training plan says about itself: per-axis summary and the notes on its levers.

`axis_summary` reads, per mesh axis, what the heaviest stage's parameter ops cut on its rounds
(data: the batch loop dim the data-parallel expert cuts; tensor: any other dim), weighted by
FLOPs; `lever_notes` says which levers each stage needed and why. O(ops x rounds).
"""

from __future__ import annotations

from shardplan import units
from shardplan.cost.step import Recompute
from shardplan.search.experts import data_parallel
from shardplan.training import TrainingPlan

_FLAG_NOTES = (
    (
        "sequence_parallel",
        "sequence parallelism (norms and residual adds split along the sequence over the "
        "tensor-parallel group: their compute and activations / t)",
    ),
    (
        "tp_comm_overlap",
        "tensor-parallel all-gathers and reduce-scatters overlapped with their GEMMs "
        "(tp_comm_overlap: Megatron-LM --tp-comm-overlap, torchtitan async tensor parallelism)",
    ),
)
"""Boolean levers the notes name, with what each does, in this order."""


def lever_notes(tp: TrainingPlan, budget: float | None) -> tuple[str, ...]:
    """Say which levers the plan uses and why: the fastest set that fits the budget (a lever is
    on to fit, or because it is faster: ZeRO 1-3 also shard the optimizer step)."""
    notes: list[str] = []
    if tp.pipeline_stages > 1:
        step = tp.step
        assert step is not None
        schedule = (
            f"interleaved 1F1B, {tp.virtual_stages} chunks per device"
            if tp.virtual_stages > 1
            else "1F1B"
        )
        notes.append(
            f"{tp.pipeline_stages} pipeline stages ({schedule}) with {tp.micro_batches} "
            f"micro-batches: bubble {step.bubble_s / step.step_s:.1%} of the step"
        )
    elif tp.micro_batches > 1:
        notes.append(f"{tp.micro_batches} micro-batches (gradient accumulation)")
    word = "chunk" if tp.virtual_stages > 1 else "stage"
    why = (
        f"(the fastest levers that fit {units.nbytes(budget)} per device)"
        if budget
        else "(faster under the model)"
    )
    grouped: dict[str, list[int]] = {}  # the same levers on many stages: one note
    for s, stage in enumerate(tp.stages):
        lv = stage.levers
        used = []
        if lv.recompute is not Recompute.NONE:
            used.append(f"{lv.recompute.value} recomputation")
        if lv.zero:
            used.append(f"ZeRO-{lv.zero}")
        if used:
            grouped.setdefault(" and ".join(used), []).append(s)
    for used_text, where in grouped.items():
        plural = "s" if len(where) > 1 else ""
        notes.append(f"{word}{plural} {_ranges(where)}: {used_text} {why}")
    for flag, text in _FLAG_NOTES:
        on = [s for s, stage in enumerate(tp.stages) if getattr(stage.levers, flag)]
        if on:
            notes.append(f"{word}{'s' if len(on) > 1 else ''} {_ranges(on)}: {text}")
    return tuple(notes)


def _ranges(xs: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    out: list[str] = []
    for x in xs:
        if out and out[-1][1] == x - 1:
            out[-1] = (out[-1][0], x)
        else:
            out.append((x, x))  # type: ignore[arg-type]
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in out)  # type: ignore[misc]


def axis_summary(tp: TrainingPlan) -> tuple[str, ...]:
    """Per mesh axis: "pipeline xS", then what the stage plans' parameter ops cut on it
    (data: the batch loop dim, which the data-parallel expert cuts; tensor: any other dim)."""
    plan = max((s.plan for s in tp.stages), key=lambda p: p.graph.flops)
    dp = data_parallel(plan.graph, plan.mesh)
    param_ops = [
        op
        for op in plan.graph.ops
        if any(plan.graph.tensors[t].role.value == "parameter" for t in op.inputs)
    ]
    out = []
    for axis, name in enumerate(tp.mesh.names):
        parts = []
        if axis == 0 and tp.pipeline_stages > 1:
            parts.append(f"pipeline x{tp.pipeline_stages}")
        kinds: dict[str, int] = {}
        for r in plan.mesh.rounds:
            if r.mesh_axis != axis:
                continue
            weight = {"data": 0.0, "tensor": 0.0, "replicated": 0.0}
            for op in param_ops:
                cut = plan.strategies[op.name][r.index]
                kind = (
                    "replicated"
                    if cut is None
                    else "data"
                    if cut == dp[op.name][r.index]
                    else "tensor"
                )
                weight[kind] += op.flops
            kind = max(weight, key=lambda k: weight[k])
            kinds[kind] = kinds.get(kind, 1) * r.q
        parts += [f"{k} x{v}" for k, v in kinds.items()]
        out.append(f"{name} axis: {' + '.join(parts) or 'unused'}")
    return tuple(out)


def steps_note(tp: TrainingPlan) -> str:
    step = tp.step
    assert step is not None
    return (
        f"step {units.seconds(step.step_s)}, {units.rate(step.tokens_per_s, 'tokens')}, "
        f"{units.flop_rate(step.tflops_per_device * 1e12)} per device "
        f"({step.peak_fraction:.1%} of peak)"
    )
