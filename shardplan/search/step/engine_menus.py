"""What each engine's configuration can say: torchtitan, Megatron-LM and DeepSpeed as data.

A `Menu` lists the recomputation modes and ZeRO stages an engine's configuration can say (with
and without pipeline stages), its precisions, whether its tensor parallelism always runs the
sequence-parallel lever, which of sequence / context / expert parallelism and interleaving it can
say, and what it overlaps by default (`Menu.engine_levers`, `cost.overlap`), each with the
engine source it was read from. `menus.plan_for_menu` searches a menu; `exporters.engine_layout`
reads a plan back through one. O(1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from shardplan.cost.overlap import (
    DDP_BUCKET_BYTES,
    DEEPSPEED_REDUCE_BUCKET,
    MEGATRON_BUCKET_FLOOR,
    MEGATRON_BUCKET_PER_RANK,
)
from shardplan.cost.step import Levers, Recompute
from shardplan.errors import ArgumentError
from shardplan.mesh import Mesh
from shardplan.search.step.profiles import LEVERS, stage_tensor_degrees


@dataclass(frozen=True, slots=True)
class Menu:
    """What one engine's configuration can express (see the module docstring)."""

    engine: str
    recompute: tuple[Recompute, ...]
    zero: tuple[int, ...]
    zero_with_pipeline: tuple[int, ...]
    precisions: tuple[str, ...]
    stage_layers: str = "even"
    """How layers may split over pipeline stages: "even", "first-last" (first and last stage
    apart from an even middle), "any" (a module list per stage)."""
    tensor_needs_sequence_parallel: bool = False
    """The engine's tensor parallelism always shards the norms over the sequence (torchtitan):
    tensor degree t > 1 only with the sequence-parallel lever on."""
    sequence_parallel: bool = False
    """The configuration can say Megatron-style sequence parallelism."""
    context: bool = False
    """... context parallelism (the sequence split next to tensor parallelism)."""
    expert: bool = False
    """... expert parallelism inside the data-parallel group."""
    virtual: bool = False
    """... several model chunks per pipeline stage (interleaved 1F1B)."""
    instead: str = ""
    """Where a construct this menu lacks can be said instead (in refusals)."""
    overlap_grad_reduce: tuple[int, ...] = ()
    """ZeRO stages at which the engine overlaps the gradient sync with the backward by default
    (`cost.overlap`)."""
    bucket_bytes: int = 0
    """... its gradient bucket at ZeRO 0-2, in bytes (PyTorch DDP), or in elements:"""
    bucket_elements: int = 0
    bucket_per_rank: int = 0
    """... max(bucket_elements, bucket_per_rank x data ways) (megatron-core); all 0: one bucket
    (ZeRO-3 reduces unit by unit whatever these are)."""
    prefetch: tuple[int, ...] = ()
    """ZeRO stages at which it prefetches the next unit's parameters (ZeRO-3)."""
    overlap_p2p: bool = False
    """Its interleaved schedule sends under compute by default (plain 1F1B: never)."""
    sharded_ways_zero: int = 0
    """A ZeRO stage its context and expert ways need (torchtitan: they are FSDP ways, 3); 0:
    any of its stages."""
    tp_comm_overlap: bool = False
    """The configuration can say `Levers.tp_comm_overlap` (sequence parallelism's collectives
    under their GEMMs: Megatron-LM `--tp-comm-overlap`, torchtitan `enable_async_tensor_parallel`
    with torch.compile); off by default in every engine, and never on in this engine's levers
    when it cannot say it."""
    tp_comm_on: bool = False
    """The run overlaps them (a user's choice, `with_overlaps`; no engine does by default)."""
    grad_reduce_switch: tuple[int, ...] = ()
    """ZeRO stages at which the configuration can turn the gradient-sync overlap on or off
    (`with_overlaps`)."""
    prefetch_switch: tuple[int, ...] = ()
    """... the ZeRO-3 prefetch."""
    p2p_switch: bool = False
    """... the interleaved schedule's send overlap."""
    prefetch_needs_grad_reduce: bool = False
    """Its prefetch runs only with the gradient-sync overlap on (Megatron-LM)."""

    def engine_levers(
        self,
        levers: Levers,
        width: int,
        virtual: int = 1,
        data: int = 1,
    ) -> Levers:
        """`levers` with what this engine overlaps at their ZeRO stage (its defaults, or a run's
        own choices: `with_overlaps`); `width`: the gradient's bytes per element, `virtual`:
        chunks per device, `data`: data-parallel ways (the bucket's size).
        `levers.tp_comm_overlap` is kept only where the engine can say it (`tp_comm_overlap`)
        and the levers run sequence parallelism."""
        grad = levers.zero in self.overlap_grad_reduce
        bucket = max(self.bucket_bytes // width, self.bucket_elements, self.bucket_per_rank * data)
        bucket = bucket if grad and levers.zero < 3 else 0
        return replace(
            levers,
            overlap_grad_reduce=grad,
            prefetch=levers.zero in self.prefetch,
            overlap_p2p=self.overlap_p2p and virtual > 1,
            bucket_elements=bucket,
            tp_comm_overlap=(
                (levers.tp_comm_overlap or self.tp_comm_on)
                and self.tp_comm_overlap
                and levers.sequence_parallel
            ),
        )

    def with_overlaps(self, chosen: Overlaps) -> Menu:
        """This menu with the user's own overlap choices as its defaults (None: the engine's);
        ArgumentError naming the flag when the configuration cannot say a choice."""
        for flag, value, switch, default in (
            ("grad-reduce", chosen.grad_reduce, self.grad_reduce_switch, self.overlap_grad_reduce),
            ("prefetch", chosen.prefetch, self.prefetch_switch, self.prefetch),
        ):
            if value is not None and not switch and bool(default) != value:
                raise _cannot(self, flag, value, default)
        if chosen.p2p is not None and not self.p2p_switch and chosen.p2p != self.overlap_p2p:
            raise _cannot(self, "p2p", chosen.p2p, self.overlap_p2p)
        if chosen.tp_comm and not self.tp_comm_overlap:
            raise _cannot(self, "tp-comm-overlap", True, False)
        if chosen.prefetch and self.prefetch_needs_grad_reduce and not chosen.grad_reduce:
            raise ArgumentError(
                f"--prefetch: {self.engine} overlaps ZeRO-3's gathers only with the gradient sync "
                "overlapped too (Megatron-LM asserts --overlap-param-gather with "
                "--overlap-grad-reduce): add --overlap-grad-reduce"
            )
        return replace(
            self,
            overlap_grad_reduce=_switched(
                self.overlap_grad_reduce, self.grad_reduce_switch, chosen.grad_reduce
            ),
            prefetch=_switched(self.prefetch, self.prefetch_switch, chosen.prefetch),
            overlap_p2p=self.overlap_p2p if chosen.p2p is None else chosen.p2p,
            tp_comm_on=bool(chosen.tp_comm),
        )

    def levers(self, stages: int, sharded_ways: bool = False) -> tuple[Levers, ...]:
        """The allowed levers for a plan of `stages` pipeline stages, least intrusive first;
        `sharded_ways`: the layout has context or expert ways (`sharded_ways_zero`)."""
        zs = self.zero if stages == 1 else self.zero_with_pipeline
        if sharded_ways and self.sharded_ways_zero:
            zs = tuple(z for z in zs if z == self.sharded_ways_zero)
        return tuple(lv for lv in LEVERS if lv.recompute in self.recompute and lv.zero in zs)

    def tensor_degrees(self, mesh: Mesh) -> tuple[int, ...]:
        """The tensor degrees this engine can run on `mesh` (`tensor_degrees`)."""
        return tensor_degrees(mesh)

    def sequence_parallel_at(self, tensor: int) -> bool:
        """Whether the layout of tensor degree `tensor` runs the sequence-parallel lever."""
        return self.tensor_needs_sequence_parallel and tensor > 1


@dataclass(frozen=True, slots=True)
class Overlaps:
    """What a user's engine run overlaps, flag by flag (`--[no-]overlap-grad-reduce`,
    `--[no-]overlap-p2p`, `--[no-]prefetch`, `--[no-]tp-comm-overlap`); None: the engine's
    default (`Menu.with_overlaps`)."""

    grad_reduce: bool | None = None
    p2p: bool | None = None
    prefetch: bool | None = None
    tp_comm: bool | None = None


def _switched(
    default: tuple[int, ...], switch: tuple[int, ...], on: bool | None
) -> tuple[int, ...]:
    """The ZeRO stages overlapping once a user's choice `on` applies where it can be said."""
    if on is None:
        return default
    kept = tuple(z for z in default if z not in switch)
    return tuple(sorted(kept + (switch if on else ())))


def _cannot(menu: Menu, flag: str, value: bool, default: object) -> ArgumentError:
    said = {"grad-reduce": "overlap-grad-reduce", "p2p": "overlap-p2p"}.get(flag, flag)
    said = f"--{'' if value else 'no-'}{said}"
    return ArgumentError(
        f"{said}: {menu.engine} {'always' if default else 'never'} {_WHAT[flag]} and its "
        f"configuration has no switch for it (docs/engines.md); drop {said}"
    )


_WHAT = {
    "grad-reduce": "overlaps the gradient sync with the backward",
    "prefetch": "prefetches ZeRO-3's parameter gathers",
    "p2p": "overlaps pipeline sends with compute",
    "tp-comm-overlap": "overlaps sequence parallelism's collectives with their GEMMs",
}


def tensor_degrees(mesh: Mesh) -> tuple[int, ...]:
    """Tensor-parallel degrees on `mesh`: products of its innermost rounds (1 first); a
    one-axis mesh has only 1 (its axis is also the pipeline's)."""
    return (1, *stage_tensor_degrees(mesh)) if len(mesh.shape) > 1 else (1,)


_N, _S, _F = Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL

MENUS: Mapping[str, Menu] = {
    # torchtitan 0.2 (docs/engines.md): activation_checkpoint.mode none/full (its "selective"
    # keeps matmul outputs, not the step model's selective set); DDP (ZeRO-0) or FSDP (ZeRO-3);
    # its tensor parallelism always shards norms over the sequence (SequenceParallel)
    # (`parallelism.tensor_parallel_degree`); context_parallel_degree, expert_parallel_degree
    # and the Interleaved1F1B schedule over a module list per chunk
    # (torchtitan/config/job_config.py)
    "torchtitan": Menu(
        "torchtitan",
        (_N, _F),
        (0, 3),
        (0, 3),
        ("bf16", "fp32"),
        "any",
        True,
        True,
        True,
        True,
        True,
        # DDP (`replicate`) all-reduces 25 MiB buckets from autograd hooks, FSDP2 reduce-
        # scatters and prefetches unit by unit (each TransformerBlock is `fully_shard`ed);
        # torch.distributed.pipelining's 1F1B waits each send with the next receive
        # (schedules.py, Schedule1F1B._step_microbatches): no p2p overlap
        overlap_grad_reduce=(0, 3),
        bucket_bytes=DDP_BUCKET_BYTES,
        prefetch=(3,),
        # its context- and expert-parallel ways are FSDP ways (dp_shard x cp, ParallelDims)
        sharded_ways_zero=3,
        # `parallelism.enable_async_tensor_parallel` with `[compile] enable` and "model" in
        # `compile.components` (torchtitan/distributed/tensor_parallel.py, maybe_enable_async_tp)
        tp_comm_overlap=True,
    ),
    # Megatron-LM: --recompute-granularity selective/full, --use-distributed-optimizer (ZeRO-1),
    # Megatron-FSDP (--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads /
    # optim_grads_params: ZeRO-2 / 3; megatron-core DistributedDataParallelConfig, its examples
    # without pipeline parallelism, so not with pipeline stages here), --sequence-parallel,
    # --context-parallel-size, --expert-model-parallel-size,
    # --num-virtual-stages-per-pipeline-rank
    "megatron": Menu(
        "megatron",
        (_N, _S, _F),
        (0, 1, 2, 3),
        (0, 1),
        ("bf16", "fp16", "fp32"),
        "first-last",
        False,
        True,
        True,
        True,
        True,
        # --overlap-grad-reduce is off by default (buckets max(4e7, 1e6 x dp) when on); p2p
        # overlap is on for the interleaved schedule (--no-overlap-p2p-communication turns it off)
        bucket_elements=MEGATRON_BUCKET_FLOOR,
        bucket_per_rank=MEGATRON_BUCKET_PER_RANK,
        overlap_p2p=True,
        # --tp-comm-overlap (megatron-core TransformerConfig.tp_comm_overlap; Megatron-LM asserts
        # --sequence-parallel with it and needs Transformer Engine's userbuffers)
        tp_comm_overlap=True,
        # --overlap-grad-reduce at any ZeRO stage (DDP and Megatron-FSDP alike); the ZeRO-3
        # gathers overlapped by --overlap-param-gather (megatron-core DistributedDataParallel-
        # Config.overlap_param_gather), which Megatron-LM asserts only with --overlap-grad-reduce
        # (megatron/training/arguments.py); the interleaved sends: --[no-]overlap-p2p-communication
        grad_reduce_switch=(0, 1, 2, 3),
        prefetch_switch=(3,),
        prefetch_needs_grad_reduce=True,
        p2p_switch=True,
    ),
    # DeepSpeed: zero_optimization.stage 0-3, but its PipelineEngine refuses ZeRO-2/3 with
    # pipeline parallelism (deepspeed/runtime/pipe/engine.py); Megatron-DeepSpeed's
    # --checkpoint-activations is full recomputation
    # its config JSON has no sequence, context or expert parallelism and its PipelineEngine no
    # interleaving: such plans go to Megatron-LM / Megatron-DeepSpeed's own flags
    "deepspeed": Menu(
        "deepspeed",
        (_N, _F),
        (0, 1, 2, 3),
        (0, 1),
        ("bf16", "fp16", "fp32"),
        instead="the DeepSpeed config JSON has no such key; export with `--to megatron`, or run "
        "Megatron-DeepSpeed with Megatron-LM's flags for it",
        # zero_optimization.overlap_comm defaults to true at stage 3 only, with the stage-3
        # prefetch (deepspeed/runtime/zero/config.py); the pipeline engine's sends block
        overlap_grad_reduce=(3,),
        bucket_elements=DEEPSPEED_REDUCE_BUCKET,
        prefetch=(3,),
        # no tensor-parallel communication overlap in its config (tp_comm_overlap stays off);
        # zero_optimization.overlap_comm switches the gradient-sync overlap at stages 1-3 (the
        # stage-0 engine all-reduces after the backward)
        tp_comm_overlap=False,
        grad_reduce_switch=(1, 2, 3),
        # stage3_prefetch_bucket_size (>= 0) caps the elements gathered ahead of use; the
        # coordinator prefetches only while it is > 0 (deepspeed/runtime/zero/
        # partitioned_param_coordinator.py): 0 switches the stage-3 prefetch off
        prefetch_switch=(3,),
    ),
}


MEGATRON_SIZE_FLAGS = (
    ("layers", "--num-layers"),
    ("hidden", "--hidden-size"),
    ("heads", "--num-attention-heads"),
    ("seq", "--seq-length"),
    ("max_positions", "--max-position-embeddings"),
    ("ffn", "--ffn-hidden-size"),
)
"""(zoo hyper-parameter, Megatron-LM flag): the model sizes `exporters.megatron` writes and
`importers.engine_config` checks against the model planned."""


def get_menu(engine: str) -> Menu:
    if engine not in MENUS:
        raise ArgumentError(f"unknown engine {engine!r}; pick one of {', '.join(sorted(MENUS))}")
    return MENUS[engine]


__all__ = ["MEGATRON_SIZE_FLAGS", "MENUS", "Menu", "Overlaps", "get_menu", "tensor_degrees"]
