"""Read an engine configuration back into the knobs the step model scores (`--from-config`).

Formats, by content: a torchtitan job TOML (a `[parallelism]` or `[training]` table), a
DeepSpeed config JSON (an object with `train_batch_size` or `train_micro_batch_size_per_gpu`),
else Megatron-LM / Megatron-DeepSpeed command-line flags (shell words; flags shardplan does not
model are listed in `ignored`). Each gives tensor and pipeline degrees, the per-rank micro-batch
size, the global batch when it says one, recomputation, ZeRO stage, precision and whether the
gradient sync overlaps the backward (when the file says; else the engine's default); `layout`
turns them into the `menus.Layout` of a mesh (data ways = devices / (tensor x pipeline)).
Approximations are listed in `notes` (torchtitan's selective checkpointing is scored as the
step model's selective recomputation; its tensor parallelism without sequence parallelism).
O(size of the file).
"""

from __future__ import annotations

import json
import shlex
import tomllib
from dataclasses import dataclass
from typing import Any

from shardplan.cost.step import Levers, Recompute
from shardplan.errors import ArgumentError, PlanError
from shardplan.mesh import Mesh
from shardplan.search.step.menus import Layout


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

    def layout(self, mesh: Mesh, batch: int) -> Layout:
        """The layout on `mesh` for a global batch `batch` (PlanError when they disagree)."""
        ways = self.tensor * self.pipeline
        if mesh.size % ways:
            raise PlanError(
                f"the {self.engine} config's tensor {self.tensor} x pipeline {self.pipeline} does "
                f"not divide the {mesh.size} devices of mesh {mesh.text()}"
            )
        data = mesh.size // ways
        per = data * self.micro_batch_size
        if batch % per:
            raise PlanError(
                f"global batch {batch} is not a multiple of {data} data-parallel ways x "
                f"micro-batch size {self.micro_batch_size} ({self.engine} config)"
            )
        return Layout(self.tensor, self.pipeline, batch // per, Levers(self.recompute, self.zero))


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
    if t > 1:
        notes.append("tensor parallelism scored without torchtitan's sequence-parallel norms")
    recompute = {"none": Recompute.NONE, "full": Recompute.FULL, "selective": Recompute.SELECTIVE}
    if ac not in recompute:
        raise ArgumentError(
            f"activation_checkpoint.mode {ac!r}: shardplan scores none/selective/full"
        )
    dtype = {"bfloat16": "bf16", "float32": "fp32"}.get(train.get("mixed_precision_param", ""))
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
    )


def read_deepspeed(data: dict[str, Any]) -> EngineConfig:
    zero = data.get("zero_optimization", {}).get("stage", 0)
    overlap = data.get("zero_optimization", {}).get("overlap_comm")
    if overlap is not None and not isinstance(overlap, bool):
        raise ArgumentError(
            f"config field zero_optimization.overlap_comm = {overlap!r} is not true or false"
        )
    dtype = "bf16" if data.get("bf16", {}).get("enabled") else None
    dtype = "fp16" if data.get("fp16", {}).get("enabled") else dtype
    batch = data.get("train_batch_size")
    return EngineConfig(
        "deepspeed",
        _int(data.get("tensor_parallel", {}).get("autotp_size", 1), "autotp_size"),
        _int(data.get("pipeline", {}).get("stages", 1), "pipeline.stages"),
        _int(data.get("train_micro_batch_size_per_gpu", 1), "train_micro_batch_size_per_gpu"),
        _int(batch, "train_batch_size") if batch is not None else None,
        Recompute.FULL if "activation_checkpointing" in data else Recompute.NONE,
        _int(zero, "zero_optimization.stage") if zero else 0,
        dtype,
        ("tensor degree from tensor_parallel.autotp_size (Megatron-DeepSpeed sets it by flag)",),
        overlap_grad_reduce=overlap,
    )


_VALUE_FLAGS = {
    "--tensor-model-parallel-size": "tensor",
    "--pipeline-model-parallel-size": "pipeline",
    "--micro-batch-size": "mbs",
    "--global-batch-size": "batch",
    "--recompute-granularity": "granularity",
    "--zero-stage": "zero",
    "--recompute-method": "method",  # uniform/block: how full recomputation groups layers
    "--recompute-num-layers": "per_checkpoint",
}
_SWITCHES = {
    "--use-distributed-optimizer",
    "--bf16",
    "--fp16",
    "--checkpoint-activations",
    "--overlap-grad-reduce",
}


def read_megatron(text: str) -> EngineConfig:
    words = shlex.split(text.replace("\\\n", " "), comments=True)  # join continuations
    values: dict[str, str] = {}
    switches: set[str] = set()
    ignored: list[str] = []
    i = 0
    while i < len(words):
        w, _, inline = words[i].partition("=")
        if w in _VALUE_FLAGS:
            if not inline and i + 1 >= len(words):
                raise ArgumentError(f"Megatron flag {w} has no value")
            values[_VALUE_FLAGS[w]] = inline or words[i + 1]
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
    dtype = "bf16" if "--bf16" in switches else "fp16" if "--fp16" in switches else None
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
    )


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
