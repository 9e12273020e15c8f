"""Read an engine configuration back into the knobs the step model scores (`--from-config`).

Formats, by content: a torchtitan job TOML (a `[parallelism]` or `[training]` table), a
DeepSpeed config JSON (an object with `train_batch_size` or `train_micro_batch_size_per_gpu`),
else Megatron-LM / Megatron-DeepSpeed command-line flags (shell words; flags shardplan does not
model are listed in `ignored`). Each gives tensor and pipeline degrees, the per-rank micro-batch
size, the global batch when it says one, recomputation, ZeRO stage, precision, the step model's
further levers where the format says them (sequence parallelism — always on under torchtitan's
tensor parallelism —, model chunks per pipeline stage of the interleaved schedule, uneven layers
per stage — Megatron-LM's first / last stage counts, torchtitan's module lists per model part —,
context and expert parallelism, tensor-parallel communication overlap) and whether the gradient
sync and the pipeline sends overlap compute (when the file says; else the engine's default);
`layout` turns them into the `menus.Layout` of a mesh (data ways = devices / (tensor x pipeline x
context)). Approximations are listed in `notes` (torchtitan's selective checkpointing is scored
as the step model's selective recomputation). O(size of the file).
"""

from __future__ import annotations

import json
import re
import shlex
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardplan.cost.step import Levers, Recompute
from shardplan.errors import ArgumentError, PlanError
from shardplan.mesh import Mesh
from shardplan.search.step.engine_menus import MEGATRON_SIZE_FLAGS
from shardplan.search.step.menus import Layout
from shardplan.search.step.uneven import chunk_layers


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """The knobs of one engine configuration."""

    engine: str
    tensor: int
    pipeline: int
    micro_batch_size: int
    batch: int | None
    recompute: Recompute
    zero: int
    dtype: str | None
    notes: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    overlap_grad_reduce: bool | None = None
    """The configuration's own choice of overlapping the gradient sync (Megatron-LM
    `--overlap-grad-reduce`, DeepSpeed `zero_optimization.overlap_comm`); None: the engine's
    default (`menus.Menu.engine_levers`)."""
    prefetch: bool | None = None
    """... of prefetching ZeRO-3's gathers (Megatron-LM `--overlap-param-gather`)."""
    sequence_parallel: bool = False
    virtual: int = 1
    """Model chunks per pipeline stage (interleaved 1F1B)."""
    layers_per_chunk: int | None = None
    """... said as layers per chunk instead (`layout` divides the model's layers by it)."""
    context: int = 1
    expert: int = 1
    tp_comm_overlap: bool = False
    overlap_p2p: bool | None = None
    """The configuration's own choice of overlapping the interleaved schedule's sends (Megatron-LM
    `--no-overlap-p2p-communication`); None: the engine's default."""
    first_layers: int | None = None
    """Transformer layers on the first pipeline stage when apart from the even rest (Megatron-LM
    `--decoder-first-pipeline-num-layers`), and on the last:"""
    last_layers: int | None = None
    chunk_layers: tuple[int, ...] = ()
    """Layers per model chunk as listed (torchtitan `module_fqns_per_model_part`), S x v counts;
    (): not listed."""
    arch: tuple[tuple[str, str, int], ...] = ()
    """The model sizes the configuration says, as (zoo hyper-parameter, flag, value): Megatron-LM
    `--num-layers`, `--hidden-size`, ... (`engine_menus.MEGATRON_SIZE_FLAGS`), checked against the
    model planned (`check_architecture`)."""

    def check_architecture(self, model: str, sizes: Mapping[str, int]) -> None:
        """PlanError naming the first size the configuration says that `model` (its zoo
        hyper-parameters `sizes`) does not have: the config trains another model."""
        for key, flag, value in self.arch:
            if key in sizes and sizes[key] != value:
                raise PlanError(
                    f"the {self.engine} config says {flag} {value}, but {model} has {key} "
                    f"{sizes[key]}: plan the model the config trains (e.g. --{key} {value}) or "
                    "correct the flag"
                )

    def layout(self, mesh: Mesh, batch: int, layers: int | None = None) -> Layout:
        """The layout on `mesh` for a global batch `batch` (PlanError when they disagree);
        `layers`: the model's layer count, needed when the chunks are said in layers."""
        ways = self.tensor * self.pipeline * self.context
        if mesh.size % ways:
            cp = f" x context {self.context}" if self.context > 1 else ""
            raise PlanError(
                f"the {self.engine} config's tensor {self.tensor} x pipeline {self.pipeline}{cp} "
                f"does not divide the {mesh.size} devices of mesh {mesh.text()}"
            )
        data = mesh.size // ways
        per = data * self.micro_batch_size
        if batch % per:
            raise PlanError(
                f"global batch {batch} is not a multiple of {data} data-parallel ways x "
                f"micro-batch size {self.micro_batch_size} ({self.engine} config)"
            )
        levers = Levers(
            self.recompute,
            self.zero,
            self.sequence_parallel,
            self.context > 1,
            tp_comm_overlap=self.tp_comm_overlap,
        )
        v = self._virtual(layers)
        return Layout(
            self.tensor,
            self.pipeline,
            batch // per,
            levers,
            v,
            self.context,
            self.expert,
            self._stage_layers(layers),
        )

    @property
    def uneven(self) -> bool:
        """The configuration says its layers per stage or chunk (`layout` needs the count)."""
        return (
            self.first_layers is not None or self.last_layers is not None or bool(self.chunk_layers)
        )

    def _stage_layers(self, layers: int | None) -> tuple[int, ...]:
        """Layers per model chunk when said unevenly (`Layout.stage_layers`), else ()."""
        if self.chunk_layers:
            if layers is not None and sum(self.chunk_layers) != layers:
                raise PlanError(
                    f"the {self.engine} config's model parts hold {sum(self.chunk_layers)} layers "
                    f"({list(self.chunk_layers)}), but the model has {layers}: plan the model the "
                    "config trains, or correct module_fqns_per_model_part"
                )
            return self.chunk_layers if len(set(self.chunk_layers)) > 1 else ()
        first, last, n = self.first_layers, self.last_layers, self.pipeline
        if first is None and last is None:
            return ()
        said = "--decoder-first/last-pipeline-num-layers"
        if layers is None or n < 2:
            raise PlanError(f"{said} need pipeline stages (--pipeline-model-parallel-size > 1)")
        if self.layers_per_chunk is not None:  # as Megatron-LM asserts
            raise PlanError(
                f"{said} with --num-layers-per-virtual-pipeline-stage: Megatron-LM takes "
                "--num-virtual-stages-per-pipeline-rank with uneven stages"
            )
        if n == 2:  # one of them fixes the other
            first = layers - last if first is None and last is not None else first
            last = layers - first if last is None and first is not None else last
        rest = layers - (first or 0) - (last or 0)
        middle = n - (first is not None) - (last is not None)
        if rest < middle or middle < 1 and rest or middle and rest % middle:
            raise PlanError(
                f"{said} {first}/{last}: the other {rest} of the model's {layers} layers do not "
                f"split evenly over the other {middle} pipeline stages"
            )
        even = rest // middle if middle else 0
        counts = (first if first is not None else even, *[even] * (n - 2))
        counts += (last if last is not None else even,) if n > 1 else ()
        if len(set(counts)) <= 1:
            return ()
        try:  # each stage's layers in v equal chunks, as megatron-core's TransformerConfig checks
            return chunk_layers(counts, self.virtual)
        except PlanError as err:
            raise PlanError(f"{said} {first}/{last}: {err}") from None

    def _virtual(self, layers: int | None) -> int:
        per = self.layers_per_chunk
        if per is None:
            return self.virtual
        if layers is None or layers % (self.pipeline * per):
            raise PlanError(
                f"the {self.engine} config's {per} layers per model chunk x {self.pipeline} "
                f"pipeline stages do not divide the model's {layers} layers"
            )
        return layers // (self.pipeline * per)


def _int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ArgumentError(f"config field {name} = {value!r} is not a whole number")
    try:
        out = int(value)
    except ValueError as e:
        raise ArgumentError(f"config field {name} = {value!r} is not a whole number") from e
    if out < 1 and name != "data_parallel_shard_degree":
        raise ArgumentError(f"config field {name} = {out} must be at least 1")
    return out


def read_torchtitan(data: dict[str, Any]) -> EngineConfig:
    par, train = data.get("parallelism", {}), data.get("training", {})
    ac = data.get("activation_checkpoint", {}).get("mode", "selective")  # torchtitan's default
    t = _int(par.get("tensor_parallel_degree", 1), "tensor_parallel_degree")
    n = _int(par.get("pipeline_parallel_degree", 1), "pipeline_parallel_degree")
    shard = _int(par.get("data_parallel_shard_degree", -1), "data_parallel_shard_degree")
    local = _int(train.get("local_batch_size", 8), "local_batch_size")
    mbs = _int(par.get("pipeline_parallel_microbatch_size", 1), "pipeline_parallel_microbatch_size")
    glob = train.get("global_batch_size", -1)
    notes = []
    if ac == "selective":
        notes.append("torchtitan's selective checkpointing is scored as selective recomputation")
    recompute = {"none": Recompute.NONE, "full": Recompute.FULL, "selective": Recompute.SELECTIVE}
    if ac not in recompute:
        raise ArgumentError(
            f"activation_checkpoint.mode {ac!r}: shardplan scores none/selective/full"
        )
    dtype = {"bfloat16": "bf16", "float32": "fp32"}.get(train.get("mixed_precision_param", ""))
    virtual, per_chunk, chunk_layers = _torchtitan_chunks(par, n)
    return EngineConfig(
        "torchtitan",
        t,
        n,
        mbs if n > 1 else local,
        _int(glob, "global_batch_size") if isinstance(glob, int) and glob > 0 else None,
        recompute[ac],
        3 if shard != 1 else 0,  # -1 (default) and >1 shard the parameters (FSDP)
        dtype,
        tuple(notes),
        sequence_parallel=t > 1,  # its tensor-parallel plan shards the norms (SequenceParallel)
        virtual=virtual,
        layers_per_chunk=per_chunk,
        chunk_layers=chunk_layers,
        context=_int(par.get("context_parallel_degree", 1), "context_parallel_degree"),
        expert=_int(par.get("expert_parallel_degree", 1), "expert_parallel_degree"),
        tp_comm_overlap=_async_tp(data, t),
    )


def _torchtitan_chunks(par: dict[str, Any], stages: int) -> tuple[int, int | None, tuple[int, ...]]:
    """(model chunks per pipeline stage, layers per chunk when said so, layers per chunk when
    listed) of torchtitan's `pipeline_parallel_schedule`: 1F1B one chunk per stage;
    Interleaved1F1B the chunks of `module_fqns_per_model_part` or
    `pipeline_parallel_layers_per_stage`; a part's layers are its `layers.<i>` modules."""
    schedule = par.get("pipeline_parallel_schedule", "1F1B")
    if stages == 1:
        return 1, None, ()
    if schedule not in ("1F1B", "Interleaved1F1B"):
        raise ArgumentError(
            f"pipeline_parallel_schedule {schedule!r}: shardplan scores 1F1B and "
            "Interleaved1F1B (docs/engines.md)"
        )
    parts = par.get("module_fqns_per_model_part")
    if isinstance(parts, list) and parts:
        chunks = len(parts) // stages
        if len(parts) % stages or (schedule == "1F1B" and chunks != 1):
            raise ArgumentError(
                f"module_fqns_per_model_part has {len(parts)} parts: {schedule} takes "
                f"{'one per' if schedule == '1F1B' else 'a multiple of the'} "
                f"pipeline_parallel_degree {stages}"
            )
        return chunks, None, tuple(_part_layers(part, k) for k, part in enumerate(parts))
    if schedule == "1F1B":
        return 1, None, ()
    per = par.get("pipeline_parallel_layers_per_stage")
    if per is None:
        raise ArgumentError(
            "pipeline_parallel_schedule Interleaved1F1B: say the model chunks with "
            "module_fqns_per_model_part or pipeline_parallel_layers_per_stage"
        )
    return 1, _int(per, "pipeline_parallel_layers_per_stage"), ()


_LAYER_FQN = re.compile(r"(^|\.)layers\.\d+$")
"""A transformer layer's module name in torchtitan's models (`layers.<i>`)."""


def _part_layers(part: Any, k: int) -> int:
    """The transformer layers listed in model part k of `module_fqns_per_model_part`."""
    if not isinstance(part, list) or not all(isinstance(x, str) for x in part):
        raise ArgumentError(f"module_fqns_per_model_part[{k}] = {part!r} is not a list of names")
    return sum(1 for name in part if _LAYER_FQN.search(name))


def _async_tp(data: dict[str, Any], tensor: int) -> bool:
    """torchtitan's `enable_async_tensor_parallel`, which it runs only with tensor parallelism
    and the model under torch.compile (`maybe_enable_async_tp`): an ArgumentError otherwise."""
    if data.get("parallelism", {}).get("enable_async_tensor_parallel") is not True:
        return False
    comp = data.get("compile", {})
    if (
        tensor == 1
        or comp.get("enable") is not True
        or "model" not in comp.get("components", ["model", "loss"])
    ):
        raise ArgumentError(
            "enable_async_tensor_parallel needs tensor_parallel_degree > 1 and [compile] "
            'enable = true with "model" in components (torchtitan refuses it otherwise)'
        )
    return True


def read_deepspeed(data: dict[str, Any]) -> EngineConfig:
    notes = ["tensor degree from tensor_parallel.autotp_size (Megatron-DeepSpeed sets it by flag)"]
    data = _hf_auto(data, notes)
    zero = data.get("zero_optimization", {}).get("stage", 0)
    overlap = data.get("zero_optimization", {}).get("overlap_comm")
    if overlap is not None and not isinstance(overlap, bool):
        raise ArgumentError(
            f"config field zero_optimization.overlap_comm = {overlap!r} is not true or false"
        )
    dtype = "bf16" if data.get("bf16", {}).get("enabled") else None
    dtype = "fp16" if data.get("fp16", {}).get("enabled") else dtype
    batch = data.get("train_batch_size")
    if overlap and not zero:  # `Menu.with_overlaps`: its switch is at stages 1-3
        notes.append(
            "zero_optimization.overlap_comm at stage 0: DeepSpeed's stage-0 engine "
            "all-reduces after the backward, so the gradient sync is priced exposed"
        )
    prefetch = _stage3_prefetch(data.get("zero_optimization", {}), zero, notes)
    return EngineConfig(
        "deepspeed",
        _int(data.get("tensor_parallel", {}).get("autotp_size", 1), "autotp_size"),
        _int(data.get("pipeline", {}).get("stages", 1), "pipeline.stages"),
        _int(data.get("train_micro_batch_size_per_gpu", 1), "train_micro_batch_size_per_gpu"),
        _int(batch, "train_batch_size") if batch is not None else None,
        Recompute.FULL if "activation_checkpointing" in data else Recompute.NONE,
        _int(zero, "zero_optimization.stage") if zero else 0,
        dtype,
        tuple(notes),
        overlap_grad_reduce=overlap,
        prefetch=prefetch,
    )


def _hf_auto(data: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """A DeepSpeed config written for the Hugging Face Trainer, its "auto" values resolved as
    the Trainer fills them (transformers.integrations.deepspeed, HfTrainerDeepSpeedConfig):
    the global batch and the precision from the run's own arguments (here --batch and
    --dtype), stage3_prefetch_bucket_size from the hidden size (int(0.9 h^2) > 0: the prefetch
    on). The micro-batch size is the Trainer's per_device_train_batch_size, which the config
    does not carry: an ArgumentError asks for the number."""
    if data.get("train_micro_batch_size_per_gpu") == "auto":
        raise ArgumentError(
            "config field train_micro_batch_size_per_gpu = 'auto': the Hugging Face Trainer fills "
            "it from its per_device_train_batch_size, which the config does not say; write that "
            "number in the config"
        )
    out = dict(data)
    auto = []
    if out.get("train_batch_size") == "auto":  # world x micro-batch x accumulation: --batch
        del out["train_batch_size"]
        auto.append("train_batch_size (--batch)")
    for key in ("bf16", "fp16"):
        if isinstance(out.get(key), dict) and out[key].get("enabled") == "auto":
            out[key] = {**out[key], "enabled": False}  # the Trainer's --bf16 / --fp16: --dtype
            auto.append(f"{key}.enabled (--dtype)")
    zero_cfg = out.get("zero_optimization")
    if isinstance(zero_cfg, dict) and zero_cfg.get("stage3_prefetch_bucket_size") == "auto":
        out["zero_optimization"] = {
            k: v for k, v in zero_cfg.items() if k != "stage3_prefetch_bucket_size"
        }
        auto.append("stage3_prefetch_bucket_size (0.9 x hidden^2: prefetched)")
    if auto:
        notes.append(
            "Hugging Face Trainer 'auto' values read as the Trainer fills them: " + ", ".join(auto)
        )
    return out


def _stage3_prefetch(zero_cfg: dict[str, Any], zero: object, notes: list[str]) -> bool | None:
    """`stage3_prefetch_bucket_size`: 0 switches ZeRO-3's prefetch off (False; DeepSpeed's
    coordinator prefetches only while it is > 0), else the default (None); below stage 3 it
    is unused, and said so in `notes`."""
    size = zero_cfg.get("stage3_prefetch_bucket_size")
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, int | float) or not size >= 0:
        raise ArgumentError(
            f"config field zero_optimization.stage3_prefetch_bucket_size = {size!r} is not a "
            "number >= 0 (elements gathered ahead of use; 0 switches the prefetch off)"
        )
    if zero != 3:
        notes.append(f"stage3_prefetch_bucket_size: used by ZeRO-3 only, unused at stage {zero}")
        return None
    return False if size == 0 else None


_VALUE_FLAGS = {
    "--tensor-model-parallel-size": "tensor",
    "--pipeline-model-parallel-size": "pipeline",
    "--micro-batch-size": "mbs",
    "--global-batch-size": "batch",
    "--recompute-granularity": "granularity",
    "--zero-stage": "zero",
    "--recompute-method": "method",  # uniform/block: how full recomputation groups layers
    "--recompute-num-layers": "per_checkpoint",
    "--num-virtual-stages-per-pipeline-rank": "virtual",
    "--num-layers-per-virtual-pipeline-stage": "per_chunk",
    "--context-parallel-size": "context",
    "--expert-model-parallel-size": "expert",
    "--data-parallel-sharding-strategy": "sharding",
    "--ckpt-format": "checkpoint",  # how checkpoints are saved: no part of the step
    "--decoder-first-pipeline-num-layers": "first",
    "--decoder-last-pipeline-num-layers": "last",
}
_SWITCHES = {
    "--use-distributed-optimizer",
    "--bf16",
    "--fp16",
    "--checkpoint-activations",
    "--overlap-grad-reduce",
    "--overlap-param-gather",  # ZeRO-3 (Megatron-FSDP) prefetch; asserted with the one above
    "--sequence-parallel",
    "--tp-comm-overlap",
    "--overlap-p2p-communication",  # Megatron-LM before 2023-10 (off unless said)
    "--no-overlap-p2p-communication",  # since: on for the interleaved schedule unless said
    "--group-query-attention",  # with --num-query-groups (`_ARCH`)
    "--use-megatron-fsdp",  # with --data-parallel-sharding-strategy: ZeRO 1-3
    "--use-torch-fsdp2",  # PyTorch FSDP2: ZeRO-3
    "--no-gradient-accumulation-fusion",  # a kernel choice Megatron-FSDP needs: same step
}


_ARCH = {flag: key for key, flag in (*MEGATRON_SIZE_FLAGS, ("kv_heads", "--num-query-groups"))}
"""Megatron-LM's model-size flags, by flag: the zoo hyper-parameter each says."""


def read_megatron(text: str) -> EngineConfig:
    words = shlex.split(text.replace("\\\n", " "), comments=True)  # join continuations
    values: dict[str, str] = {}
    switches: set[str] = set()
    ignored: list[str] = []
    i = 0
    while i < len(words):
        w, _, inline = words[i].partition("=")
        if w in _VALUE_FLAGS or w in _ARCH:
            if not inline and i + 1 >= len(words):
                raise ArgumentError(f"Megatron flag {w} has no value")
            values[_VALUE_FLAGS.get(w, w)] = inline or words[i + 1]
            i += 1 if inline else 2
        elif w in _SWITCHES:
            switches.add(w)
            i += 1
        else:
            if w.startswith("--"):
                ignored.append(w)
            i += 1
    gran = values.get("granularity")
    recompute = {"full": Recompute.FULL, "selective": Recompute.SELECTIVE, None: Recompute.NONE}
    if gran not in recompute:
        raise ArgumentError(f"--recompute-granularity {gran!r}: Megatron takes full or selective")
    rc = recompute[gran]
    if "--checkpoint-activations" in switches:
        rc = Recompute.FULL
    zero = _int(values["zero"], "--zero-stage") if "zero" in values and values["zero"] != "0" else 0
    if "--use-distributed-optimizer" in switches:
        zero = max(zero, 1)
    zero = max(zero, _fsdp_zero(values, switches))
    prefetch = _param_gather(switches)
    if prefetch and zero < 3:  # the distributed optimizer's one gather per step: not modelled
        ignored.append("--overlap-param-gather")
    dtype = "bf16" if "--bf16" in switches else "fp16" if "--fp16" in switches else None
    chunks = _megatron_chunks(values, switches)
    arch = tuple(
        (key, flag, _int(values[flag], flag)) for flag, key in _ARCH.items() if flag in values
    )
    return EngineConfig(
        "megatron",
        _int(values.get("tensor", 1), "--tensor-model-parallel-size"),
        _int(values.get("pipeline", 1), "--pipeline-model-parallel-size"),
        _int(values.get("mbs", 1), "--micro-batch-size"),
        _int(values["batch"], "--global-batch-size") if "batch" in values else None,
        rc,
        zero,
        dtype,
        (),
        tuple(ignored),
        overlap_grad_reduce=True if "--overlap-grad-reduce" in switches else None,
        prefetch=prefetch,
        arch=arch,
        **chunks,
    )


def _param_gather(switches: set[str]) -> bool | None:
    """`--overlap-param-gather`: ZeRO-3's gathers prefetched (True), else the default (None);
    ArgumentError without `--overlap-grad-reduce`, as Megatron-LM asserts."""
    if "--overlap-param-gather" not in switches:
        return None
    if "--overlap-grad-reduce" not in switches:
        raise ArgumentError(
            "--overlap-param-gather without --overlap-grad-reduce: Megatron-LM refuses it "
            "(megatron/training/arguments.py); add --overlap-grad-reduce"
        )
    return True


def _fsdp_zero(values: dict[str, str], switches: set[str]) -> int:
    """The ZeRO stage of Megatron-LM's FSDP flags (`exporters.megatron.FSDP_STRATEGIES`): 3 for
    `--use-torch-fsdp2`; `--use-megatron-fsdp`'s `--data-parallel-sharding-strategy`; else 0."""
    if "--use-torch-fsdp2" in switches:
        return 3
    strategy = values.get("sharding")
    if strategy is None:
        return 0
    stages = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
    if strategy not in stages or "--use-megatron-fsdp" not in switches:
        raise ArgumentError(
            f"--data-parallel-sharding-strategy {strategy!r}: Megatron-LM takes "
            f"{', '.join(stages)}, with --use-megatron-fsdp"
        )
    return stages[strategy]


def _megatron_chunks(values: dict[str, str], switches: set[str]) -> dict[str, Any]:
    """The step model's further levers among Megatron-LM's flags (`EngineConfig` fields)."""
    sp = "--sequence-parallel" in switches
    if "--tp-comm-overlap" in switches and not sp:
        raise ArgumentError(
            "--tp-comm-overlap without --sequence-parallel: Megatron-LM refuses it (it overlaps "
            "sequence parallelism's all-gathers and reduce-scatters); add --sequence-parallel"
        )
    if "virtual" in values and "per_chunk" in values:
        raise ArgumentError(
            "--num-virtual-stages-per-pipeline-rank with --num-layers-per-virtual-pipeline-stage:"
            " Megatron-LM takes one of them"
        )
    p2p = None
    if "--no-overlap-p2p-communication" in switches:
        p2p = False
    elif "--overlap-p2p-communication" in switches:
        p2p = True
    per = values.get("per_chunk")
    per_chunk = None if per is None else _int(per, "--num-layers-per-virtual-pipeline-stage")
    return {
        "sequence_parallel": sp,
        "virtual": _int(values.get("virtual", 1), "--num-virtual-stages-per-pipeline-rank"),
        "layers_per_chunk": per_chunk,
        "context": _int(values.get("context", 1), "--context-parallel-size"),
        "expert": _int(values.get("expert", 1), "--expert-model-parallel-size"),
        "tp_comm_overlap": "--tp-comm-overlap" in switches,
        "overlap_p2p": p2p,
        "first_layers": _int(values["first"], "--decoder-first-pipeline-num-layers")
        if "first" in values
        else None,
        "last_layers": _int(values["last"], "--decoder-last-pipeline-num-layers")
        if "last" in values
        else None,
    }


def read_engine_config(text: str) -> EngineConfig:
    """The knobs of a torchtitan TOML, DeepSpeed JSON or Megatron flag text (module docstring)."""
    stripped = text.lstrip()
    if stripped.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ArgumentError(f"the DeepSpeed config does not parse as JSON: {e}") from e
        return read_deepspeed(data)
    if not stripped.startswith("-"):
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            data = None
        if isinstance(data, dict) and ("parallelism" in data or "training" in data):
            return read_torchtitan(data)
    return read_megatron(text)


__all__ = [
    "EngineConfig",
    "read_deepspeed",
    "read_engine_config",
    "read_megatron",
    "read_torchtitan",
]
