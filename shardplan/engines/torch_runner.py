"""Inside each torch.distributed process: execute one Plan op by op on DTensors (gloo, CPU).

`_worker` is the entry point of every spawned process (`shardplan.engines.torch_dist` starts
them): it joins the gloo process group, builds a DeviceMesh shaped like the plan's rounds and runs
each plan of the job with `_run_one`, which distributes every parameter and input to its planned
placements (`distribute_tensor`) and executes the graph with `_Runner`: each operand is
`.redistribute`d to the placements the op's strategy reads (`operand_layout`: split ->
`Shard(d)`, replicated -> `Replicate()`), the kernel (`shardplan.engines.torch_exec.kernels`)
runs on the local shards (`to_local()`), and the result is wrapped with `DTensor.from_local` in
the op's raw output placements (`Shard(d)`, `Replicate()`, or `Partial()` where a REDUCE cut
leaves partial sums; consumers' redistributions then insert the all-reduce / reduce-scatter).
Rank 0 compares with the single-process run and returns the report as a dict.

Four cases need the device's position and are handled here, not by the kernel; they are found
from the op's signature and its traits (`shardplan.ir.traits`), never from its kind's name:
- `reshape` (GLOBAL_SHAPE_ATTR): the target shape attribute is global; the local target is
  derived from the output layout.
- `embedding` (INDEX_INPUT) with the vocabulary `v` cut: masked lookup of the ids the local
  table block owns (offset = block index * local rows), zeros elsewhere, result `Partial()`.
- `conv2d` / `pool2d`: a WINDOW loop dim (`y`, `x`) cut: the input is read replicated along that
  spatial dim in the cutting rounds (an all-gather where the cost model predicts a halo
  exchange), padded explicitly, and each device convolves the rows its output block needs.
- `batch_norm` (STATISTICS_OVER_PARALLEL) with a statistics dim (batch, spatial) cut: the
  per-channel sums are made `Partial()` and redistributed to `Replicate()` (all-reduce), twice
  (mean, then variance), so the statistics are the global batch statistics of the single-process
  run.

Redistributions are DTensor's: on gloo a Shard(a) -> Shard(b) change runs as all-gather + chunk
(no CPU all-to-all) and nested shards of one dim as sequential all-gathers; the runner counts the
per-round placement changes it asked for, by the collective they mean (what the cost model
prices), not the gloo calls.

Gradients (`train=True`): operands read replicated by an op that cuts something in that round get
`Partial()` gradient placements (`to_local(grad_placements=...)`), so DTensor all-reduces the
gradient of replicated parameters (the data-parallel gradient sync) in backward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shardplan.cost.collectives import CollectiveKind
from shardplan.engines.spawn import exit_fast, init_gloo
from shardplan.engines.torch_exec import (
    Kernel,
    _pair,
    _require_torch,
    execute,
    init_values,
    kernels,
    loss_from_outputs,
)
from shardplan.engines.torch_report import DistReport, _error, _worst
from shardplan.errors import BackendError, ShardplanError
from shardplan.exporters.plan_json import from_json
from shardplan.ir.dims import DimKind
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role
from shardplan.ir.traits import Trait, traits_of
from shardplan.plans import Plan
from shardplan.sharding import (
    PARTIAL,
    REPLICATED,
    Layout,
    Strategy,
    operand_layout,
    partial_reducers,
)


def _transition(src: Any, dst: Any) -> str | None:
    """The collective one round's placement change implies (None: no change)."""
    if src == dst:
        return None
    if src.is_partial():
        return CollectiveKind.REDUCE_SCATTER if dst.is_shard() else CollectiveKind.ALL_REDUCE
    if src.is_shard():
        return CollectiveKind.ALL_TO_ALL if dst.is_shard() else CollectiveKind.ALL_GATHER
    return "slice" if dst.is_shard() else "replicate-to-partial"


class _Runner:
    """Executes one plan on DTensors in one process of the world."""

    def __init__(self, plan: Plan, mesh: Any, table: Mapping[str, Kernel], train: bool) -> None:
        import torch
        from torch.distributed import tensor as dt

        self.torch, self.dt = torch, dt
        self.plan, self.graph, self.mesh, self.table = plan, plan.graph, mesh, table
        self.rounds = plan.mesh.rounds
        self.train = train
        coordinate = mesh.get_coordinate()
        self.coords = tuple(int(c) for c in coordinate) if coordinate is not None else ()
        self.redistributions: Counter[str] = Counter()
        self.env: dict[str, Any] = {}

    # -- placements ------------------------------------------------------------------------------
    def placements(self, layout: Layout, reducers: Sequence[str | None] = ()) -> tuple[Any, ...]:
        dt = self.dt
        if not self.rounds:  # one device: a trivial mesh dim
            return (dt.Replicate(),)
        out = []
        for r, s in enumerate(layout):
            if s == REPLICATED:
                out.append(dt.Replicate())
            elif s == PARTIAL:
                reducer = reducers[r] if r < len(reducers) else None
                out.append(dt.Partial(reducer or "sum"))
            else:
                out.append(dt.Shard(s))
        return tuple(out)

    def block(self, rounds: Sequence[int]) -> int:
        """Block index of this device along a dim split by `rounds` (round order, row-major)."""
        index = 0
        for r in sorted(rounds):
            index = index * self.rounds[r].q + self.coords[r]
        return index

    def local_shape(self, shape: Sequence[int], layout: Layout) -> tuple[int, ...]:
        out = list(shape)
        for r, s in enumerate(layout):
            if s >= 0:
                out[s] //= self.rounds[r].q
        return tuple(out)

    # -- values ----------------------------------------------------------------------------------
    def distribute(self, values: Mapping[str, np.ndarray]) -> None:
        """`distribute_tensor` every value to its planned placements (the DTensor exporter's)."""
        from shardplan.exporters.dtensor import placement_texts, to_placements

        torch, dt = self.torch, self.dt
        texts = placement_texts(self.plan)
        for name, array in values.items():
            placements = to_placements(texts[name]) or (dt.Replicate(),)
            value = torch.from_numpy(np.array(array))
            d = dt.distribute_tensor(value, self.mesh, placements, src_data_rank=None)
            if self.train and self.graph.tensors[name].role is Role.PARAMETER:
                d = d.detach().requires_grad_(True)
            self.env[name] = d

    # -- ops -------------------------------------------------------------------------------------
    def run(self) -> None:
        for op in self.graph.ops:
            try:
                self.run_op(op)
            except ShardplanError:
                raise
            except Exception as e:
                raise BackendError(
                    f"op {op.name!r} ({op.kind}) with strategy "
                    f"{tuple(self.plan.strategies[op.name])} failed on rank "
                    f"{self.torch.distributed.get_rank()}: {type(e).__name__}: {e}"
                ) from e

    def run_op(self, op: Op) -> None:
        dt = self.dt
        strategy: Strategy = tuple(self.plan.strategies[op.name])
        kinds = {d.name: d.kind for d in op.signature.loop_dims}
        window = {r for r, d in enumerate(strategy) if d is not None and kinds[d] is DimKind.WINDOW}
        locals_: list[Any] = []
        for i, name in enumerate(op.inputs):
            layout = list(operand_layout(op, strategy, i))
            if i == 0 and window:  # read the spatial dims whole; the op slices its rows
                for r in window:
                    layout[r] = REPLICATED
            target = self.placements(tuple(layout))
            x = self.env[name]
            if tuple(x.placements) != target:
                for src, dst in zip(x.placements, target, strict=True):
                    kind = _transition(src, dst)
                    if kind:
                        self.redistributions[kind] += 1
                x = x.redistribute(self.mesh, target)
            grad = tuple(
                dt.Partial() if self.rounds and layout[r] == REPLICATED and strategy[r] else p
                for r, p in enumerate(target)
            )
            locals_.append(x.to_local(grad_placements=grad))
        result = self.local_call(op, strategy, locals_, window)
        results = result if isinstance(result, tuple) else (result,)
        if len(results) != len(op.outputs):
            raise BackendError(
                f"op {op.name!r} ({op.kind}) gave {len(results)} results; the graph expects "
                f"{len(op.outputs)}"
            )

        for i, (name, value) in enumerate(zip(op.outputs, results, strict=True)):
            layout = operand_layout(op, strategy, i, True)
            shape = self.graph.tensors[name].shape
            expect = self.local_shape(shape, layout)
            if tuple(value.shape) != expect:
                raise BackendError(
                    f"op {op.name!r} ({op.kind}) strategy {strategy}: local result {name!r} has "
                    f"shape {tuple(value.shape)}, expected {expect} (global {shape}, layout "
                    f"{layout})"
                )
            self.env[name] = dt.DTensor.from_local(
                value,
                self.mesh,
                self.placements(layout, partial_reducers(op, strategy, i)),
                shape=self.torch.Size(shape),
                stride=_contiguous_stride(shape),
            )

    def local_call(self, op: Op, strategy: Strategy, locals_: list[Any], window: set[int]) -> Any:
        """The kernel on local shards; the kinds whose traits need the device's position first."""
        traits = traits_of(op.kind)
        if Trait.GLOBAL_SHAPE_ATTR in traits:  # the shape attribute is global: make it local
            layout = operand_layout(op, strategy, 0, True)
            target = self.local_shape(self.graph.tensors[op.outputs[0]].shape, layout)
            return self.table[op.kind](_with_attrs(op, shape=target), *locals_)
        if traits.index is not None:  # ids into a cut extent: look up only the rows owned here
            index = traits.index
            looked_up = op.signature.inputs[index.bound_operand][index.bound_dim][0]
            if looked_up in strategy:
                return self.masked_lookup(op, strategy, looked_up, *locals_)
        if window:  # a WINDOW dim (y, x) is cut: convolve/pool the rows this block needs
            return self.windowed(op, strategy, locals_, window)
        if Trait.STATISTICS_OVER_PARALLEL in traits and traits.statistics_kept is not None:
            kept = op.signature.inputs[0][traits.statistics_kept][0]
            if any(d not in (None, kept) for d in strategy):
                return self.batch_norm(op, strategy, kept, *locals_)
        return self.table[op.kind](op, *locals_)

    def masked_lookup(
        self, op: Op, strategy: Strategy, looked_up: str, table: Any, ids: Any
    ) -> Any:
        """Embedding with the vocabulary cut: each device looks up the ids its rows own."""
        torch = self.torch
        rows = table.shape[0]
        offset = self.block([r for r, d in enumerate(strategy) if d == looked_up]) * rows
        local = ids.long() - offset
        owned = (local >= 0) & (local < rows)
        out = torch.nn.functional.embedding(local.clamp(0, rows - 1), table)
        return out * owned.unsqueeze(-1).to(out.dtype)

    def windowed(self, op: Op, strategy: Strategy, locals_: list[Any], window: set[int]) -> Any:
        """conv2d / pool2d with y or x cut: pad explicitly, keep the rows this block needs."""
        torch = self.torch
        x = locals_[0]
        if len(locals_) > 1:  # a weight operand (conv2d) gives the window; pooling has none
            kernel = tuple(int(k) for k in locals_[1].shape[2:])
            stride = _pair(op.attr("stride", 1))
            fill = 0.0
        else:
            kernel = _pair(op.attr("kernel", 2))
            stride = _pair(op.attr("stride", op.attr("kernel", 2)))
            fill = -math.inf if str(op.attr("mode", "max")) == "max" else 0.0
        py, px = _pair(op.attr("padding", 0))
        x = torch.nn.functional.pad(x, (px, px, py, py), value=fill)
        extents = op.signature.extents
        out_dims = op.signature.outputs[0]  # the WINDOW loop dims index output dims 2 and 3
        for axis, name in ((a, out_dims[a][0]) for a in (2, 3)):
            cut = [r for r in window if strategy[r] == name]
            if not cut:
                continue
            parts = math.prod(self.rounds[r].q for r in cut)
            rows = extents[name] // parts
            k, s = kernel[axis - 2], stride[axis - 2]
            start = self.block(cut) * rows * s
            x = x.narrow(axis, start, (rows - 1) * s + k)
        return self.table[op.kind](_with_attrs(op, padding=(0, 0)), x, *locals_[1:])

    def batch_norm(
        self, op: Op, strategy: Strategy, kept: str, x: Any, scale: Any, shift: Any
    ) -> Any:
        """Batch statistics over every device of the batch/spatial cuts (two all-reduces);
        `kept` is the loop dim the statistics are kept per (the channel, tensor dim 1)."""
        torch, dt = self.torch, self.dt
        stats = [r for r, d in enumerate(strategy) if d not in (None, kept)]
        partial = tuple(
            dt.Partial() if r in stats else dt.Shard(0) if d == kept else dt.Replicate()
            for r, d in enumerate(strategy)
        )
        whole = tuple(dt.Replicate() if p.is_partial() else p for p in partial)

        def all_sum(local: Any) -> Any:
            d = dt.DTensor.from_local(local, self.mesh, partial)
            return d.redistribute(self.mesh, whole).to_local(grad_placements=partial)

        axes = tuple(i for i in range(x.ndim) if i != 1)
        count = math.prod(d.extent for d in op.signature.loop_dims if d.name != kept)
        shape = [1] * x.ndim
        shape[1] = x.shape[1]
        mean = (all_sum(x.sum(dim=axes)) / count).reshape(shape)
        centred = x - mean
        var = (all_sum(centred.square().sum(dim=axes)) / count).reshape(shape)
        eps = op.attr("eps")
        inv = torch.rsqrt(var + (1e-5 if eps is None else float(eps)))
        return centred * inv * scale.reshape(shape) + shift.reshape(shape)

    # -- results ---------------------------------------------------------------------------------
    def full(self, name: str) -> Any:
        return self.env[name].full_tensor().detach()

    def loss(self) -> Any:
        """The loss of `loss_from_outputs`, from the outputs made whole (same on every rank)."""
        dt = self.dt
        whole = (dt.Replicate(),) * max(1, len(self.rounds))
        outs = {
            n: self.env[n].redistribute(self.mesh, whole).to_local() for n in self.graph.outputs
        }
        return loss_from_outputs(self.graph, outs)


def _contiguous_stride(shape: Sequence[int]) -> tuple[int, ...]:
    stride, acc = [], 1
    for size in reversed(shape):
        stride.append(acc)
        acc *= size
    return tuple(reversed(stride))


def _with_attrs(op: Op, **attrs: Any) -> Op:
    merged = dict(op.attrs)
    merged.update(attrs)
    return dataclasses.replace(op, attrs=tuple(merged.items()))


def _cast(values: Mapping[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    """Float arrays in `dtype` (integer ids and labels unchanged)."""
    return {
        k: v.astype(dtype) if np.issubdtype(v.dtype, np.floating) else v for k, v in values.items()
    }


def _single_process(
    graph: Graph,
    params: Mapping[str, np.ndarray],
    inputs: Mapping[str, np.ndarray],
    table: Mapping[str, Kernel],
    train: bool,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(every tensor, parameter gradients) of the single-process run."""
    torch = _require_torch()
    leaves = {n: torch.from_numpy(np.array(v)) for n, v in params.items()}
    if not train:
        with torch.no_grad():
            return execute(graph, leaves, inputs, table), {}
    leaves = {n: v.requires_grad_(True) for n, v in leaves.items()}
    env = execute(graph, leaves, inputs, table)
    loss = loss_from_outputs(graph, {n: env[n] for n in graph.outputs})
    loss.backward()
    grads = {n: (v.grad if v.grad is not None else torch.zeros_like(v)) for n, v in leaves.items()}
    return env, grads


def _run_one(plan: Plan, mesh: Any, seed: int, options: Mapping[str, Any]) -> dict[str, Any] | None:
    """Run one plan on this rank; rank 0 returns the report as a dict."""
    import torch
    import torch.distributed as dist

    train, dtype = bool(options["train"]), str(options["dtype"])
    rtol, atol = float(options["rtol"]), float(options["atol"])
    torch.set_default_dtype(getattr(torch, dtype))
    graph = plan.graph
    table = kernels()
    params, inputs = init_values(graph, seed)
    params, inputs = _cast(params, dtype), _cast(inputs, dtype)
    runner = _Runner(plan, mesh, table, train)
    dist.barrier()
    start = time.perf_counter()
    grad_mode = contextlib.nullcontext() if train else torch.no_grad()
    with grad_mode:
        runner.distribute({**params, **inputs})
        runner.run()
        if train:
            runner.loss().backward()
    seconds = time.perf_counter() - start
    with torch.no_grad():
        outs = {n: runner.full(n) for n in graph.outputs}
        acts: dict[str, Any] = {}
        if options["check_activations"]:
            for op in graph.ops:
                for t in op.outputs:
                    if t not in outs:
                        acts[t] = runner.full(t)
        grads: dict[str, Any] = {}
        if train:
            for name in params:
                g = runner.env[name].grad
                grads[name] = (
                    g.full_tensor().detach() if g is not None else torch.zeros(params[name].shape)
                )
    if dist.get_rank() != 0:
        return None
    env, ref_grads = _single_process(graph, params, inputs, table, train)
    outputs = tuple(_error(n, outs[n], env[n], rtol, atol) for n in graph.outputs)
    act_errors = [_error(n, acts[n], env[n], rtol, atol) for n in acts]
    bad = {e.name for e in (*outputs, *act_errors) if not e.ok}
    first = next((op.name for op in graph.ops if bad.intersection(op.outputs)), None)
    grad_errors = tuple(_error(n, grads[n], ref_grads[n], rtol, atol) for n in grads)
    everything = [*outputs, *act_errors, *grad_errors]
    max_abs, max_rel = _worst(everything)
    worst_act = max(act_errors, key=lambda e: (not e.ok, e.max_rel), default=None)
    report = DistReport(
        model=graph.name,
        method=plan.method,
        mesh=plan.mesh.text(),
        mesh_shape=tuple(r.q for r in plan.mesh.rounds),
        world_size=dist.get_world_size(),
        train=train,
        ok=all(e.ok for e in everything),
        dtype=dtype,
        rtol=rtol,
        atol=atol,
        outputs=outputs,
        max_abs_error=max_abs,
        max_rel_error=max_rel,
        activations_checked=len(act_errors),
        worst_activation=worst_act,
        first_mismatch=first,
        grads=grad_errors,
        redistributions=dict(runner.redistributions),
        seconds=seconds,
    )
    return report.to_dict()


def _worker(rank: int, world: int, port: int, job_path: str, out_path: str) -> None:
    """Entry point of each spawned process (module level, so "spawn" can import it)."""
    import torch.distributed as dist

    with open(job_path) as f:
        job = json.load(f)
    init_gloo(rank, world, port, float(job["timeout"]))
    try:
        from torch.distributed.device_mesh import init_device_mesh

        shape = tuple(job["mesh_shape"]) or (1,)
        names = tuple(f"r{i}" for i in range(len(shape)))
        mesh = init_device_mesh("cpu", mesh_shape=shape, mesh_dim_names=names)
        reports = [
            _run_one(from_json(entry["plan"]), mesh, int(job["seed"]), entry)
            for entry in job["plans"]
        ]
        if rank == 0:
            tmp = out_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(reports, f)
            os.replace(tmp, out_path)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    exit_fast()  # the report is written, the process group destroyed
