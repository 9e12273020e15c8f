"""The training-step model's values: the levers a stage runs under, and what the step costs.

`Levers` are per-stage choices (recomputation, ZeRO, sequence / context parallelism) and what
the engine overlaps beyond tensor and context parallelism (`cost.overlap`: the gradient sync
bucket by bucket under the backward, pipeline sends under compute, ZeRO-3 gathers prefetched);
`StageCost` / `StepCost` are `cost.step`'s results. Frozen values, no logic beyond checks and
the JSON-ready dict. O(stages).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from shardplan.cost.zero import check_stage
from shardplan.errors import PlanError

LEVER_FLAGS = (
    "sequence_parallel",
    "context_parallel",
    "overlap_grad_reduce",
    "overlap_p2p",
    "prefetch",
    "tp_comm_overlap",
)
"""The `Levers` fields that are True or False (what a training JSON stores as flags)."""


class Recompute(enum.Enum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


@dataclass(frozen=True, slots=True)
class Levers:
    """Per-stage choices: activation recomputation, the ZeRO stage (0-3), sequence and context
    parallelism, and the engine's overlap of its data-parallel and pipeline collectives
    (all off by default: today's model, every collective added)."""

    recompute: Recompute = Recompute.NONE
    zero: int = 0
    sequence_parallel: bool = False
    """Megatron-LM sequence parallelism over the stage's tensor-parallel group (`cost.sequence`).
    The distributed optimizer of Megatron-LM is `zero=1` over the data-parallel group."""
    context_parallel: bool = False
    """The stage plan's activation all-gathers are context parallelism's ring exchange of K/V,
    overlapped with the attention (`cost.sequence.ring_terms`)."""
    overlap_grad_reduce: bool = False
    """The gradient all-reduce / reduce-scatter runs bucket by bucket under the backward
    (megatron-core `overlap_grad_reduce`, PyTorch DDP, FSDP; `cost.overlap.zero_exposed`)."""
    overlap_p2p: bool = False
    """Pipeline sends run under the chunk's compute (megatron-core `overlap_p2p_comm`)."""
    prefetch: bool = False
    """ZeRO-3: the gather of the next unit runs under the compute of this one (FSDP prefetch,
    DeepSpeed stage-3 prefetch)."""
    bucket_elements: int = 0
    """Gradient elements per bucket under `overlap_grad_reduce` at ZeRO 0-2 (0: one bucket, the
    whole stage's gradient; ZeRO-3 reduces unit by unit whatever this is)."""
    tp_comm_overlap: bool = False
    """Sequence parallelism's all-gathers and reduce-scatters run piece by piece under the GEMMs
    that read or write them (megatron-core `tp_comm_overlap` on Transformer Engine's userbuffers,
    torchtitan's async tensor parallelism; `cost.overlap.tensor_overlap_exposed`). A stage
    prices it only with `sequence_parallel` (`cost.step.stage_cost` refuses it without)."""

    def __post_init__(self) -> None:
        check_stage(self.zero)
        for name in LEVER_FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise PlanError(f"{name} must be True or False, got {getattr(self, name)!r}")
        b = self.bucket_elements
        if isinstance(b, bool) or not isinstance(b, int) or b < 0:
            raise PlanError(f"bucket_elements must be a whole number >= 0, got {b!r}")

    @property
    def overlaps(self) -> bool:
        """Does the stage overlap anything beyond tensor and context parallelism (whose own
        overlap, `tp_comm_overlap`, does not grow with the recomputation's window)?"""
        return self.overlap_grad_reduce or self.overlap_p2p or self.prefetch


def with_overlap(levers: Levers, overlap: Levers) -> Levers:
    """`levers` with the overlap fields of `overlap` (what an engine or a knob overlaps; the
    tensor-parallel overlap only where `levers` runs sequence parallelism, which it needs)."""
    return replace(
        levers,
        overlap_grad_reduce=overlap.overlap_grad_reduce,
        overlap_p2p=overlap.overlap_p2p,
        prefetch=overlap.prefetch,
        bucket_elements=overlap.bucket_elements,
        tp_comm_overlap=overlap.tp_comm_overlap and levers.sequence_parallel,
    )


@dataclass(frozen=True, slots=True)
class StageCost:
    """One stage under its levers: per-micro-batch times, per-step sync, memory per device."""

    fwd_s: float
    bwd_s: float
    recompute_s: float
    zero_per_micro_batch_s: float
    comm_s: float
    """Collectives per micro-batch (forward, backward, ZeRO gathers), not counting recompute."""
    sync_s: float
    param_bytes: float
    activation_bytes: float
    in_flight: float
    """Micro-batches of this stage's kept activations held at its peak (fractional when
    interleaved: chunks of 1/v of the stage)."""
    kept_bytes: float = 0.0
    """Activations kept per micro-batch for the backward (under the recomputation lever)."""
    rebuilt_bytes: float = 0.0
    """The recomputation working set during one backward."""
    optimizer_s: float = 0.0
    """The optimizer step once per training step, after the pipeline has drained."""
    sync_hidden_s: float = 0.0
    """Of the per-step gradient sync, the seconds run under the backward (not in `sync_s`)."""
    zero_hidden_s: float = 0.0
    """Of the per-micro-batch ZeRO collectives, the seconds run under compute (not in
    `fwd_s` / `bwd_s`)."""

    @property
    def memory_bytes(self) -> float:
        return self.param_bytes + self.activation_bytes


@dataclass(frozen=True, slots=True)
class StepCost:
    """The whole training step. Times in seconds; memory in bytes per device."""

    step_s: float
    pipeline_s: float
    bubble_s: float
    p2p_s: float
    sync_s: float
    recompute_s: float
    micro_batches: int
    stages: tuple[StageCost, ...]
    samples_per_s: float
    tokens_per_s: float
    model_flops: float
    hardware_flops: float
    tflops_per_device: float
    hardware_tflops_per_device: float
    peak_fraction: float
    optimizer_s: float = 0.0
    """The slowest device's optimizer step (`StageCost.optimizer_s`)."""
    sync_hidden_s: float = 0.0
    """Gradient sync run under the backward: the sync without overlap minus `sync_s`."""
    p2p_hidden_s: float = 0.0
    """Pipeline sends run under compute (not in `p2p_s`)."""
    zero_hidden_s: float = 0.0
    """ZeRO collectives run under compute, m x the slowest device's per micro-batch."""

    @property
    def memory_per_device(self) -> float:
        return max(s.memory_bytes for s in self.stages)

    @property
    def hidden_s(self) -> float:
        """Everything the engine's overlap hides beyond tensor and context parallelism."""
        return self.sync_hidden_s + self.p2p_hidden_s + self.zero_hidden_s

    def to_dict(self) -> dict[str, object]:
        """JSON-ready; the hidden terms appear only when something is hidden."""
        hidden = {
            "sync_hidden_s": self.sync_hidden_s,
            "p2p_hidden_s": self.p2p_hidden_s,
            "zero_hidden_s": self.zero_hidden_s,
        }
        return {
            "step_s": self.step_s,
            "pipeline_s": self.pipeline_s,
            "bubble_s": self.bubble_s,
            "p2p_s": self.p2p_s,
            "sync_s": self.sync_s,
            "optimizer_s": self.optimizer_s,
            "recompute_s": self.recompute_s,
            "micro_batches": self.micro_batches,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "model_flops": self.model_flops,
            "tflops_per_device": self.tflops_per_device,
            "hardware_tflops_per_device": self.hardware_tflops_per_device,
            "peak_fraction": self.peak_fraction,
            "memory_per_device_bytes": self.memory_per_device,
            **(hidden if self.hidden_s > 0 else {}),
            "stages": [
                {
                    "fwd_s": s.fwd_s,
                    "bwd_s": s.bwd_s,
                    "recompute_s": s.recompute_s,
                    "comm_s": s.comm_s,
                    "sync_s": s.sync_s,
                    "param_bytes": s.param_bytes,
                    "activation_bytes": s.activation_bytes,
                    "in_flight": s.in_flight,
                }
                for s in self.stages
            ],
        }


__all__ = ["LEVER_FLAGS", "Levers", "Recompute", "StageCost", "StepCost", "with_overlap"]
