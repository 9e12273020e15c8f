"""A training plan as Megatron-LM `pretrain_gpt.py` flags and Megatron-core config arguments.

Read off `engine_layout.read_layout` with the Megatron menu: tensor / pipeline parallel sizes
(data parallelism is the rest of the world), micro and global batch, precision, recomputation
(selective: `--recompute-granularity selective`; full: granularity full, method uniform, one
layer per checkpoint), ZeRO-1 as `--use-distributed-optimizer`, ZeRO-2 / 3 as Megatron-FSDP
(`--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads / optim_grads_params`, with
`--ckpt-format fsdp_dtensor --no-gradient-accumulation-fusion` as its examples run it; no
pipeline stages), uneven first / last stages as
`--decoder-first/last-pipeline-num-layers`, the sequence-parallel lever as `--sequence-parallel`,
context parallelism c as `--context-parallel-size` (Megatron orders ranks tp-cp-ep-dp-pp: CP next
to TP, as the plan's context rounds are), v model chunks per stage as
`--num-virtual-stages-per-pipeline-rank` (interleaved 1F1B, chunk c on stage c mod S, as the
plan's chunks; the p2p-overlap lever off as `--no-overlap-p2p-communication`, Megatron-LM's
default being on since 2023-10 and required at pipeline 2, where the run then overlaps what the
plan priced exposed), the gradient-sync overlap as `--overlap-grad-reduce` (megatron-core's
default buckets, what the lever prices), and a model with expert layers as `--num-experts` /
`--moe-router-topk` / `--moe-ffn-hidden-size` from the zoo with `--expert-model-parallel-size` e
(the experts split inside the data-parallel group; expert tensor parallelism = t, Megatron's
default), and the tensor-parallel communication overlap lever as `--tp-comm-overlap`
(megatron-core `TransformerConfig.tp_comm_overlap`: sequence parallelism's all-gathers and
reduce-scatters under their GEMMs with Transformer Engine's userbuffers, the default
`--transformer-impl transformer_engine`; Megatron-LM's `validate_args` asserts
`--sequence-parallel` with it, which the plan's lever implies). Model sizes come from the zoo
(`architecture`). `megatron_kwargs` are the same choices as `TransformerConfig` keyword arguments
(dtype names as strings; `transformer_config` builds the object with megatron.core, imported
lazily). O(1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardplan.cost.step import Recompute
from shardplan.errors import PlanError
from shardplan.exporters.engine_layout import EngineLayout, family, read_layout
from shardplan.search.step.engine_menus import MEGATRON_SIZE_FLAGS
from shardplan.search.step.menus import MENUS
from shardplan.search.step.uneven import stage_counts
from shardplan.training import TrainingPlan

FSDP_STRATEGIES = {1: "optim", 2: "optim_grads", 3: "optim_grads_params"}
"""Megatron-FSDP's `--data-parallel-sharding-strategy` per ZeRO stage (megatron-core
`DistributedDataParallelConfig.data_parallel_sharding_strategy`)."""


def megatron_layout(tp: TrainingPlan) -> EngineLayout:
    return read_layout(tp, MENUS["megatron"])


def megatron_flags(layout: EngineLayout, arch: Mapping[str, int] | None = None) -> list[str]:
    """The command-line flags (each flag and its value as separate items)."""
    flags = [
        "--tensor-model-parallel-size", str(layout.tensor),
        "--pipeline-model-parallel-size", str(layout.pipeline),
        "--micro-batch-size", str(layout.micro_batch_size),
        "--global-batch-size", str(layout.batch),
    ]  # fmt: skip
    first, last = _uneven(layout)
    if first is not None:
        flags += ["--decoder-first-pipeline-num-layers", str(first)]
    if last is not None:
        flags += ["--decoder-last-pipeline-num-layers", str(last)]
    if layout.precision in ("bf16", "fp16"):
        flags.append(f"--{layout.precision}")
    if layout.recompute is Recompute.SELECTIVE:
        flags += ["--recompute-granularity", "selective"]
    elif layout.recompute is Recompute.FULL:
        flags += ["--recompute-granularity", "full", "--recompute-method", "uniform"]
        flags += ["--recompute-num-layers", "1"]
    if layout.zero >= 1:
        flags.append("--use-distributed-optimizer")
    if layout.zero >= 2:  # Megatron-FSDP shards gradients (2) and parameters too (3)
        flags += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy"]
        flags.append(FSDP_STRATEGIES[layout.zero])
        # its checkpoints are DTensor ones; its buffers take no fused gradient accumulation
        flags += ["--ckpt-format", "fsdp_dtensor", "--no-gradient-accumulation-fusion"]
    if layout.sequence_parallel:
        flags.append("--sequence-parallel")
    if layout.tp_comm_overlap:  # Megatron-LM asserts --sequence-parallel with it
        flags.append("--tp-comm-overlap")
    if layout.context > 1:
        flags += ["--context-parallel-size", str(layout.context)]
    if layout.virtual > 1:
        flags += ["--num-virtual-stages-per-pipeline-rank", str(layout.virtual)]
        if not layout.overlap_p2p and layout.pipeline > 2:  # Megatron-LM overlaps by default
            flags.append("--no-overlap-p2p-communication")
    if layout.overlap_grad_reduce:
        flags.append("--overlap-grad-reduce")
    if layout.prefetch:  # Megatron-FSDP's gathers; asserted with --overlap-grad-reduce
        flags.append("--overlap-param-gather")
    moe = _moe(layout, arch)
    for key, flag in _MOE_FLAGS:
        if key in moe:
            flags += [flag, str(moe[key])]
    arch = dict(arch or {})
    arch.setdefault("layers", sum(layout.layers))
    arch.setdefault("seq", layout.seq_len)
    for key, flag in MEGATRON_SIZE_FLAGS:
        if key in arch:
            flags += [flag, str(arch[key])]
    if "kv_heads" in arch and arch["kv_heads"] != arch.get("heads"):
        flags += ["--group-query-attention", "--num-query-groups", str(arch["kv_heads"])]
    return flags + list(_FAMILY_FLAGS.get(family(layout.model) or "", ()))


_MOE_FLAGS = (
    ("num_moe_experts", "--num-experts"),
    ("moe_router_topk", "--moe-router-topk"),
    ("moe_ffn_hidden_size", "--moe-ffn-hidden-size"),
    ("expert_model_parallel_size", "--expert-model-parallel-size"),
)
_UNMAPPED_MOE = ("shared", "dense_layers", "q_rank")
"""Zoo MoE fields with no Megatron mapping written yet (shared experts, dense layers, MLA)."""


def _moe(layout: EngineLayout, arch: Mapping[str, int] | None) -> dict[str, int]:
    """The MoE TransformerConfig arguments of an expert model ({} for a dense one); PlanError
    when the plan has expert layers whose count or routing the zoo does not give."""
    if not layout.moe:
        return {}
    arch = arch or {}
    missing = [k for k in ("experts", "top_k", "expert_ffn") if k not in arch]
    if missing:
        raise PlanError(
            f"megatron: the plan's model {layout.model!r} has expert layers but its {missing} "
            "are unknown (not a zoo MoE model); Megatron needs --num-experts, --moe-router-topk "
            "and --moe-ffn-hidden-size: add them to the flags by hand"
        )
    for key in _UNMAPPED_MOE:
        if arch.get(key):
            raise PlanError(
                f"megatron: {layout.model!r} has {key}={arch[key]}; this exporter has no mapping "
                f"for {key} yet (Megatron's shared-expert / layer-frequency / MLA flags): "
                "write those flags by hand"
            )
    return {
        "num_moe_experts": arch["experts"],
        "moe_router_topk": arch["top_k"],
        "moe_ffn_hidden_size": arch["expert_ffn"],
        "expert_model_parallel_size": layout.expert,
    }


_FAMILY_FLAGS = {
    # Llama: gated SiLU MLP, RMSNorm, rotary positions, no biases, untied head (Megatron-LM's
    # Llama recipes)
    "llama": (
        "--swiglu", "--normalization", "RMSNorm", "--position-embedding-type", "rope",
        "--disable-bias-linear", "--untie-embeddings-and-output-weights",
    ),
}  # fmt: skip
_FAMILY_KWARGS: dict[str, dict[str, Any]] = {
    "llama": {"gated_linear_unit": True, "normalization": "RMSNorm", "add_bias_linear": False},
}


def _uneven(layout: EngineLayout) -> tuple[int | None, int | None]:
    """First / last stage layer counts when they differ from the (even) middle (a stage's v
    chunks summed)."""
    counts = stage_counts(layout.layers, layout.pipeline)
    if len(set(counts)) <= 1:
        return None, None
    middle = counts[1:-1] or (None,)
    first = counts[0] if counts[0] != middle[0] else None
    last = counts[-1] if counts[-1] != middle[0] else None
    return first, last


def megatron_kwargs(layout: EngineLayout, arch: Mapping[str, int] | None = None) -> dict[str, Any]:
    """`megatron.core.transformer.TransformerConfig` keyword arguments (dtypes by name)."""
    arch = arch or {}
    dtype = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[layout.precision]
    kw: dict[str, Any] = {
        "tensor_model_parallel_size": layout.tensor,
        "pipeline_model_parallel_size": layout.pipeline,
        "sequence_parallel": layout.sequence_parallel,
        "context_parallel_size": layout.context,
        "bf16": layout.precision == "bf16",
        "fp16": layout.precision == "fp16",
        "params_dtype": dtype,
        "pipeline_dtype": dtype,
        "num_layers": sum(layout.layers),
    }
    if layout.tp_comm_overlap:  # megatron-core's default is off
        kw["tp_comm_overlap"] = True
    if layout.virtual > 1:
        kw["virtual_pipeline_model_parallel_size"] = layout.virtual
        kw["overlap_p2p_comm"] = layout.overlap_p2p or layout.pipeline <= 2
    kw.update(_moe(layout, arch))
    first, last = _uneven(layout)
    if first is not None:
        kw["num_layers_in_first_pipeline_stage"] = first
    if last is not None:
        kw["num_layers_in_last_pipeline_stage"] = last
    if "hidden" in arch:
        kw["hidden_size"] = arch["hidden"]
    if "heads" in arch:
        kw["num_attention_heads"] = arch["heads"]
    if "kv_heads" in arch:
        kw["num_query_groups"] = arch["kv_heads"]
    if "ffn" in arch:
        kw["ffn_hidden_size"] = arch["ffn"]
    kw.update(_FAMILY_KWARGS.get(family(layout.model) or "", {}))
    if layout.recompute is Recompute.SELECTIVE:
        kw["recompute_granularity"] = "selective"
    elif layout.recompute is Recompute.FULL:
        kw.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    return kw


def transformer_config(kwargs: Mapping[str, Any]) -> Any:
    """Build megatron.core's TransformerConfig of `kwargs` (its __post_init__ validates)."""
    from shardplan.lazy import require

    torch = require("torch", extra="engines", user="transformer_config")
    mc = require(
        "megatron.core.transformer.transformer_config", extra="engines", user="transformer_config"
    )
    TransformerConfig = mc.TransformerConfig  # noqa: N806 - the engine's class
    kw = dict(kwargs)
    for key in ("params_dtype", "pipeline_dtype"):
        kw[key] = getattr(torch, kw[key])  # dtype by name, e.g. torch.bfloat16
    return TransformerConfig(**kw)


def to_megatron(tp: TrainingPlan, arch: Mapping[str, int] | None = None) -> str:
    """The flags as a shell continuation block for `pretrain_gpt.py`."""
    return flag_block(megatron_flags(megatron_layout(tp), arch))


def flag_block(flags: list[str]) -> str:
    """Flags one per line (a flag with its value), joined by shell continuations."""
    pairs: list[str] = []
    for f in flags:
        if f.startswith("--") or not pairs:
            pairs.append(f)
        else:
            pairs[-1] += f" {f}"
    return " \\\n".join(pairs) + "\n"


__all__ = [
    "flag_block",
    "megatron_flags",
    "megatron_kwargs",
    "megatron_layout",
    "to_megatron",
    "transformer_config",
]
