"""A training plan as torchtitan's job TOML (torchtitan 0.2: `--job.config_file FILE`).

Sections `[job]`, `[training]` (local/global batch, sequence length, mixed precision),
`[parallelism]` (data replicate/shard degrees, tensor, pipeline with its schedule, micro-batch
size and module list per stage, context) and `[activation_checkpoint]`, read off
`engine_layout.read_layout` with the torchtitan menu. ZeRO-0 is DDP (`data_parallel_replicate_
degree`), ZeRO-3 is FSDP (`data_parallel_shard_degree`, parameters resharded after forward as the
step model prices). Tensor parallelism t is `tensor_parallel_degree` (torchtitan always runs it
with sequence-parallel norms: the plan's SP lever must be on); context parallelism c is
`context_parallel_degree` and expert parallelism e `expert_parallel_degree` (with
`expert_tensor_parallel_degree` = t, the plan's experts being tensor-split too) — both only under
ZeRO-3, because torchtitan shards parameters over dp_shard x cp whenever cp > 1 and carves its
expert ways out of those FSDP ways (torchtitan/distributed/parallel_dims.py); v > 1 model chunks
per stage are the `Interleaved1F1B` schedule over S x v module lists (a looped schedule: chunk c
on rank c mod S, as the plan's chunks). The tensor-parallel communication overlap lever is
`enable_async_tensor_parallel = true` with a `[compile]` section (`enable = true`, components
model and loss): torchtitan applies async TP only to a compiled model (its Inductor micro-
pipelined all-gather-matmul / matmul-reduce-scatter, `maybe_enable_async_tp`).
With pipeline stages the local batch holds every micro-batch of a step
(`pipeline_parallel_microbatch_size` each); without, micro-batches are gradient-accumulation
steps (global batch / (local batch x data ways)). The module list names torchtitan's Llama
modules (tok_embeddings, layers.i, norm, output). O(layers).
"""

from __future__ import annotations

from collections.abc import Mapping

from shardplan import units
from shardplan.errors import PlanError
from shardplan.exporters.engine_layout import EngineLayout, architecture, read_layout
from shardplan.search.step.menus import MENUS
from shardplan.training import TrainingPlan

_DTYPE = {"bf16": "bfloat16", "fp32": "float32"}
_MODELS = {
    "llama3-8b": ("llama3", "8B"),
    "llama3-70b": ("llama3", "70B"),
    "llama3-405b": ("llama3", "405B"),
}
"""Zoo models torchtitan ships (torchtitan/models/llama3: its flavors 8B, 70B, 405B)."""
_ASYNC_TP_COMPONENTS = ("model", "loss")
"""torchtitan's async TP runs only under torch.compile of the model: `maybe_enable_async_tp`
(torchtitan/distributed/tensor_parallel.py) raises unless `compile.enable` and "model" in
`compile.components` (written as its default, model and loss)."""


def torchtitan_sections(layout: EngineLayout, arch: Mapping[str, int] | None = None) -> dict:
    """The TOML sections as nested dicts (see the module docstring)."""
    zero3 = layout.zero == 3
    pp = layout.pipeline > 1
    _check_sharded(layout)
    local = layout.micro_batch_size * (layout.micro_batches if pp else 1)
    parallelism: dict[str, object] = {
        "data_parallel_replicate_degree": 1 if zero3 else layout.data,
        "data_parallel_shard_degree": layout.data if zero3 else 1,
        "fsdp_reshard_after_forward": "always" if zero3 else "default",
        "tensor_parallel_degree": layout.tensor,
        "pipeline_parallel_degree": layout.pipeline,
        "context_parallel_degree": layout.context,
    }
    if layout.tp_comm_overlap:  # async TP: torch.compile's micro-pipelined TP collectives
        parallelism["enable_async_tensor_parallel"] = True
    if layout.expert > 1:
        parallelism["expert_parallel_degree"] = layout.expert
        parallelism["expert_tensor_parallel_degree"] = layout.tensor
    if pp:
        looped = layout.virtual > 1
        parallelism["pipeline_parallel_schedule"] = "Interleaved1F1B" if looped else "1F1B"
        parallelism["pipeline_parallel_microbatch_size"] = layout.micro_batch_size
        parallelism["module_fqns_per_model_part"] = _modules(layout.layers)
    seq = (arch or {}).get("seq", layout.seq_len)
    # torchtitan's flavor holds the published sizes: named only for the zoo model at those sizes
    full = arch is not None and dict(arch) == architecture(layout.model)
    model = _MODELS.get(layout.model) if full else None
    return {
        **({"model": {"name": model[0], "flavor": model[1]}} if model else {}),
        "job": {
            "description": f"shardplan: {layout.model} on {layout.world} devices, predicted step "
            f"{units.seconds(layout.step_s)}",
        },
        "training": {
            "local_batch_size": local,
            "global_batch_size": layout.batch,
            "seq_len": seq,
            "mixed_precision_param": _DTYPE[layout.precision],
        },
        "parallelism": parallelism,
        "activation_checkpoint": {"mode": layout.recompute.value},
        **({"compile": _compile()} if layout.tp_comm_overlap else {}),
    }


def _compile() -> dict[str, object]:
    """The `[compile]` section async TP needs (`_ASYNC_TP_COMPONENTS`)."""
    return {"enable": True, "components": list(_ASYNC_TP_COMPONENTS)}


def _check_sharded(layout: EngineLayout) -> None:
    """torchtitan's context and expert parallelism live on FSDP ways (module docstring)."""
    for ways, what in ((layout.context, "context"), (layout.expert, "expert")):
        if ways > 1 and layout.zero != 3:
            raise PlanError(
                f"torchtitan cannot express {what} parallelism x{ways} with ZeRO-{layout.zero}: "
                f"its {what}-parallel ways are FSDP ways (dp_shard x cp), so parameters would be "
                "sharded where the plan replicates them; plan with `shardplan plan MODEL ... "
                "--target torchtitan` or export with `--to megatron`"
            )


def _modules(layers: tuple[int, ...]) -> list[list[str]]:
    out, i = [], 0
    for s, n in enumerate(layers):
        part = ["tok_embeddings"] if s == 0 else []
        part += [f"layers.{j}" for j in range(i, i + n)]
        if s == len(layers) - 1:
            part += ["norm", "output"]
        out.append(part)
        i += n
    return out


def _value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    return str(v)


def to_toml(sections: Mapping[str, Mapping[str, object]]) -> str:
    lines: list[str] = []
    for name, values in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {_value(v)}" for k, v in values.items()]
        lines.append("")
    return "\n".join(lines)


def to_torchtitan(tp: TrainingPlan, arch: Mapping[str, int] | None = None) -> str:
    """`tp` as a torchtitan job TOML; PlanError naming what torchtitan cannot express."""
    layout = read_layout(tp, MENUS["torchtitan"])
    known = tp.model in _MODELS and arch is not None and dict(arch) == architecture(tp.model)
    head = (
        "# torchtitan job config written by `shardplan export --to torchtitan`; "
        + ("add" if not known else "check")
        + " [model] name/flavor\n# (a registered TrainSpec) and your [job] dump_folder, then run\n"
        "# torchrun --nproc_per_node=<gpus per node> --nnodes=<nodes> -m torchtitan.train "
        "--job.config_file FILE\n"
    )
    return head + to_toml(torchtitan_sections(layout, arch))


__all__ = ["to_toml", "to_torchtitan", "torchtitan_sections"]
