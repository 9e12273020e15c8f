"""A training plan as a DeepSpeed config JSON (Megatron-DeepSpeed style runs).

Read off `engine_layout.read_layout` with the DeepSpeed menu: `train_batch_size` (the global
batch), `train_micro_batch_size_per_gpu`, `gradient_accumulation_steps` (= the micro-batches,
which DeepSpeed's pipeline engine also runs per step), `zero_optimization.stage` (with
`overlap_comm`, the gradient-sync overlap lever, at stages >= 1, and at stage 3
`stage3_prefetch_bucket_size: 0` when the plan was priced without the prefetch), bf16 / fp16,
`activation_checkpointing` under full recomputation and the `pipeline` stage count. Tensor and
pipeline sizes go on the Megatron-DeepSpeed command line (`megatron_deepspeed_flags`). The config
JSON has no sequence, context or expert parallelism and DeepSpeed's PipelineEngine no interleaved
schedule: such plans are refused by the DeepSpeed menu, naming `--to megatron` (Megatron-LM's
flags, which Megatron-DeepSpeed inherits) as the route; so is a model with expert layers in
`megatron_deepspeed_flags` (its MoE flags are not mapped). DeepSpeed has no equivalent of the
tensor-parallel communication overlap lever (`tp_comm_overlap`: Megatron-LM `--tp-comm-overlap`,
torchtitan's async TP): a plan or layout with it is refused, naming the lever and saying to
re-plan without it. O(1).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from shardplan.cost.step import Recompute
from shardplan.errors import PlanError
from shardplan.exporters.engine_layout import EngineLayout, read_layout
from shardplan.search.step.menus import MENUS
from shardplan.training import TrainingPlan


def deepspeed_layout(tp: TrainingPlan) -> EngineLayout:
    return read_layout(tp, MENUS["deepspeed"])


def _no_tp_comm_overlap(layout: EngineLayout) -> None:
    """A layout read for another engine may carry the lever; DeepSpeed cannot say it."""
    if layout.tp_comm_overlap:
        raise PlanError(
            "deepspeed cannot express tp_comm_overlap (sequence parallelism's collectives "
            "overlapped with their GEMMs; DeepSpeed has no equivalent): re-plan without it "
            "(drop --tp-comm-overlap / tp_comm_overlap=True), or export with `--to megatron`"
        )


def deepspeed_config(layout: EngineLayout) -> dict[str, Any]:
    """The config dict (see the module docstring)."""
    _no_tp_comm_overlap(layout)
    full = layout.recompute is Recompute.FULL
    cfg: dict[str, Any] = {
        "train_batch_size": layout.batch,
        "train_micro_batch_size_per_gpu": layout.micro_batch_size,
        "gradient_accumulation_steps": layout.micro_batches,
        "zero_optimization": {"stage": layout.zero},
        "bf16": {"enabled": layout.precision == "bf16"},
        "fp16": {"enabled": layout.precision == "fp16"},
        "pipeline": {"stages": layout.pipeline, "activation_checkpoint_interval": int(full)},
    }
    if layout.zero >= 1:  # DeepSpeed's own default: on at stage 3 only
        cfg["zero_optimization"]["overlap_comm"] = layout.overlap_grad_reduce
    if layout.zero == 3 and not layout.prefetch:  # its default prefetches: 0 switches it off
        cfg["zero_optimization"]["stage3_prefetch_bucket_size"] = 0
    if full:
        cfg["activation_checkpointing"] = {
            "partition_activations": False,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
        }
    return cfg


def megatron_deepspeed_flags(
    layout: EngineLayout, arch: Mapping[str, int] | None = None
) -> list[str]:
    """Megatron-DeepSpeed `pretrain_gpt.py` flags that go with the config."""
    _no_tp_comm_overlap(layout)
    if layout.moe:
        raise PlanError(
            f"megatron-deepspeed: {layout.model!r} has expert layers and this exporter writes no "
            "Megatron-DeepSpeed MoE flags; export with `--to megatron` (Megatron-LM's MoE flags)"
        )
    arch = arch or {}
    flags = [
        "--tensor-model-parallel-size", str(layout.tensor),
        "--pipeline-model-parallel-size", str(layout.pipeline),
        "--micro-batch-size", str(layout.micro_batch_size),
        "--global-batch-size", str(layout.batch),
        "--zero-stage", str(layout.zero),
        "--num-layers", str(sum(layout.layers)),
    ]  # fmt: skip
    for key, flag in (("hidden", "--hidden-size"), ("heads", "--num-attention-heads")):
        if key in arch:
            flags += [flag, str(arch[key])]
    flags += ["--seq-length", str(arch.get("seq", layout.seq_len))]
    if layout.precision in ("bf16", "fp16"):
        flags.append(f"--{layout.precision}")
    if layout.recompute is Recompute.FULL:
        flags.append("--checkpoint-activations")
    return flags + ["--deepspeed", "--deepspeed_config", "ds_config.json"]


def to_deepspeed(tp: TrainingPlan) -> str:
    return json.dumps(deepspeed_config(deepspeed_layout(tp)), indent=2) + "\n"


__all__ = ["deepspeed_config", "deepspeed_layout", "megatron_deepspeed_flags", "to_deepspeed"]
