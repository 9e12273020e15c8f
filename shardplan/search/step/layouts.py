"""The training-step search's candidate layouts and their proven bound.

A layout is (S stages on the outermost axis, v chunks per device, b samples per micro-batch, the
chunk cut); its bound (`layouts`): per micro-batch a device runs a piece of each op of its chunks,
which takes at least the op's launch floor and its FLOPs and bytes at the global batch / (m n) at
the roofline, forward and its own backward each (`ideal_seconds`), and the step is at least
(m + (S - 1) / v) such slots of the heaviest device. Unless the engine overlaps them, each slot
also sends 2 v times across the widest boundary (`cost.step.step_cost`): at least the bytes of
the activations made before it and read after it, once each, over the stage's devices (sent
sharded, `cost.pipeline.boundary_bytes`), 1/m of the probe's (its tensors grow with the batch
at most linearly), at the link rate (`boundary_items`). S divides the outer axis, v > 1 when
the layer count is a multiple of S x v, b from `sample_options`. O(layouts x (ops + tensors))
in numpy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from shardplan import checks
from shardplan.cost import CostOptions
from shardplan.cost.work import whole_op_bytes
from shardplan.errors import PlanError
from shardplan.ir.graph import Graph
from shardplan.ir.op import Role
from shardplan.ir.segments import segments
from shardplan.ir.traits import backward_recompute
from shardplan.mesh import Mesh
from shardplan.search.step.profiles import stage_tensor_degrees
from shardplan.search.step.stages import stage_mesh, stage_starts
from shardplan.search.step.structure import LayerSplit


@dataclass(frozen=True, slots=True)
class Layout:
    """One candidate: S stages, v chunks per device, b samples per micro-batch (m of them),
    the chunks cut FLOP-balanced or, `aligned`, as Megatron-LM cuts them (`stages`)."""

    bound: float
    stages: int
    virtual: int
    micro_batches: int
    sample: int
    aligned: bool = False
    sends: float = 0.0
    """Seconds per slot the pipeline sends take at least (module docstring; 0: overlapped)."""

    def key(self) -> tuple[int, int, bool]:
        """Its group: the layouts of one stage count, micro-batch count and cut (v aside)."""
        return (self.stages, self.micro_batches, self.aligned)

    def text(self) -> str:
        v = f" v={self.virtual}" if self.virtual > 1 else ""
        cut = ", equal layers per chunk" if self.aligned else ""
        return f"S={self.stages}{v} m={self.micro_batches} (micro-batch {self.sample}{cut})"


def micro_batch_options(batch: int, stage: Mesh) -> list[int]:
    """Values of m, largest first: micro-batches of one sample per device of the stage, per way
    of its outermost axis and per way of all axes but the innermost, when they divide the batch,
    and m = 1 when the stage has more devices than the batch has samples; else the largest m
    that keeps one sample per way of the outermost axis."""
    sizes = {
        stage.size,
        stage.shape[0] if len(stage.shape) > 1 else stage.size,
        stage.size // stage.shape[-1],
    }
    ms = {batch // b for b in sizes if b <= batch and batch % b == 0}
    if any(b > batch for b in sizes):  # more devices than samples: the whole batch at once
        ms.add(1)
    if ms:
        return sorted(ms, reverse=True)
    need = stage.shape[0] if len(stage.shape) > 1 else 1
    fits = [m for m in range(1, batch + 1) if batch % m == 0 and batch // m >= need]
    return [max(fits, default=1)]


def sample_options(batch: int, stage: Mesh) -> list[int]:
    """Samples per micro-batch tried on a stage mesh: every multiple of the data ways of each
    tensor degree (1 and `stage_tensor_degrees`) dividing the batch — every per-rank micro-batch
    size of every recipe — and those of `micro_batch_options`; ascending."""
    out = {batch // m for m in micro_batch_options(batch, stage)}
    for t in (1, *stage_tensor_degrees(stage)):
        data = stage.size // t
        out.update(b for b in range(data, batch + 1, data) if batch % b == 0)
    return sorted(out)


def ideal_seconds(probe: Graph, mesh: Mesh, opts: CostOptions) -> tuple[np.ndarray, ...]:
    """Per op, for its forward and for its own backward (`cost.backward`; none when no input
    needs a gradient): the roofline seconds of the whole op on one device (divided by m x n it
    bounds a piece's time from below) and the launch floor (every device launches every kernel
    of an op that computes)."""
    hw = mesh.hardware
    n = len(probe.ops)
    if opts.preset.symbolic or hw is None:
        return np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n)
    bwd_flops = opts.preset.training_flops_factor - 1 if opts.train else 0.0
    flops_rate = mesh.flops_per_s * hw.flops_efficiency
    bytes_rate = hw.hbm_bytes_per_s * hw.hbm_efficiency
    out = np.zeros((4, n))
    for i, op in enumerate(probe.ops):
        if op.flops <= 0:
            continue
        fwd_bytes, bwd_bytes = whole_op_bytes(probe, op, opts)
        out[:2, i] = max(op.flops / flops_rate, fwd_bytes / bytes_rate), hw.launch_s
        if opts.train and bwd_bytes > 0:
            flops = (bwd_flops + backward_recompute(op.kind)) * op.flops
            out[2:, i] = max(flops / flops_rate, bwd_bytes / bytes_rate), hw.launch_s
    return tuple(out)


@dataclass(frozen=True, slots=True)
class BoundaryItems:
    """A graph's activations as pipeline-send items: producer op, last reader op, bytes."""

    producer: np.ndarray
    last_reader: np.ndarray
    nbytes: np.ndarray

    def widest(self, cuts: np.ndarray) -> float:
        """Bytes crossing the widest boundary of the chunks ops[cuts[c]:cuts[c + 1]], each
        activation once per boundary it spans (a floor of `cost.pipeline.cut_terms`)."""
        chunks = len(cuts) - 1
        if chunks < 2 or not len(self.nbytes):
            return 0.0
        src = np.searchsorted(cuts, self.producer, side="right") - 1
        dst = np.searchsorted(cuts, self.last_reader, side="right") - 1
        spans = np.zeros(chunks + 1)
        np.add.at(spans, src, self.nbytes)
        np.add.at(spans, dst, -self.nbytes)
        return float(np.cumsum(spans)[: chunks - 1].max())


def boundary_items(graph: Graph, opts: CostOptions) -> BoundaryItems:
    """Every activation read after the op that makes it (`BoundaryItems`), O(operands)."""
    last: dict[str, int] = {}
    for i, op in enumerate(graph.ops):
        for name in op.inputs:
            if name in graph.producer and graph.tensors[name].role is not Role.PARAMETER:
                last[name] = i
    names = list(last)
    return BoundaryItems(
        np.array([graph.producer[n] for n in names], dtype=np.int64),
        np.array([last[n] for n in names], dtype=np.int64),
        np.array(
            [graph.tensors[n].numel * opts.element_bytes(graph.tensors[n]) for n in names],
            dtype=float,
        ),
    )


def layouts(
    probe: Graph,
    split: LayerSplit,
    mesh: Mesh,
    batch: int,
    stages: Sequence[int] | None,
    cuts_of: Callable[[int], list[tuple[bool, list[int]]]],
    ideal: tuple[np.ndarray, ...],
    boundary: BoundaryItems | None = None,
) -> list[Layout]:
    """Every candidate layout with its bound (`search` module docstring), in bound order;
    `cuts_of(chunks)`: the chunk cuts tried, (aligned, first segment of each chunk);
    `boundary`: the probe's send items when the sends are exposed (None: overlapped)."""
    segs = segments(probe)
    outer = mesh.shape[0]
    if stages is not None:
        s_options = [checks.positive_int(s, "pipeline stages") for s in stages]
        for s in s_options:
            if outer % s:
                raise PlanError(f"{s} pipeline stages must divide the outermost mesh axis {outer}")
            stage_starts(probe, s)  # PlanError: more stages than segments
    else:
        s_options = [s for s in range(1, outer + 1) if outer % s == 0 and s <= len(segs)]
    ideal_s, floor, bwd_ideal, bwd_floor = ideal
    op_start = np.array([sg.start for sg in segs] + [len(probe.ops)])
    out = []
    for n_stages in s_options:
        smesh = stage_mesh(mesh, n_stages)
        vs = [1]
        if n_stages > 1 and split.layers > 1:
            vs += [
                v
                for v in range(2, split.layers // n_stages + 1)
                if split.layers % (n_stages * v) == 0 and n_stages * v <= len(segs)
            ]
        samples = sample_options(batch, smesh)
        for v in vs:
            for aligned, starts in cuts_of(n_stages * v):
                cuts = op_start[[*starts, len(segs)]]
                wide = 0.0 if boundary is None else boundary.widest(cuts)
                link = wide / smesh.size / mesh.bandwidth_bytes_per_s[0]  # a whole batch's
                for b in samples:
                    m = batch // b
                    if v > 1 and m % n_stages:
                        continue
                    k = m * smesh.size
                    piece = np.maximum(floor, ideal_s / k) + np.maximum(bwd_floor, bwd_ideal / k)
                    per_op = np.concatenate([[0.0], np.cumsum(piece)])
                    chunk = per_op[cuts[1:]] - per_op[cuts[:-1]]
                    heaviest = max(float(chunk[d::n_stages].sum()) for d in range(n_stages))
                    sends = 2 * v * link / m
                    bound = (m + (n_stages - 1) / v) * (heaviest + sends)
                    out.append(Layout(bound, n_stages, v, m, b, aligned, sends))
    # a group's layouts together, v ascending (the search orders the groups by their bounds)
    least: dict[tuple[int, int, bool], float] = {}
    for c in out:
        least[c.key()] = min(c.bound, least.get(c.key(), c.bound))
    return sorted(out, key=lambda c: (least[c.key()], c.key(), c.virtual))


__all__ = [
    "BoundaryItems",
    "Layout",
    "boundary_items",
    "ideal_seconds",
    "layouts",
    "micro_batch_options",
    "sample_options",
]
