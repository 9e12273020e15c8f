"""Run a TrainingPlan's pipeline on torch.distributed.pipelining, each stage on its sub-plan.

`run_pipeline(tp)` spawns S x (devices per stage) local gloo processes ("spawn"). Each builds a
DeviceMesh (S, q_1, ..., q_R) — dim "pp" for the stages, one dim per round of the stage mesh —
and wraps its stage in a module: the stage's parameters are DTensors on the stage's sub-mesh,
placed as the stage plan says; `forward` takes the boundary activation (a whole tensor, received
from the previous stage over the "pp" group), runs the stage's ops with the DTensor runner of
`torch_runner` (every operand redistributed to the placements its strategy reads) and returns
the boundary activation made whole (or, on the last stage, the loss). `PipelineStage` +
`Schedule1F1B` run the tp.micro_batches micro-batches; the loss of each is divided by m, so
the accumulated gradients are those of the mean over the whole batch. Graph inputs of
micro-batch k (token ids, labels) are generated from the seed (`init_values(graph, seed + 1 +
k)`) on every rank, the same on each.

The reference is the single-process run (`torch_exec.execute`) of the whole model at the
micro-batch size over the same m micro-batches with the same accumulation. Compared: the loss
(sum over micro-batches of loss / m) and every parameter gradient (a parameter held by several
stages, e.g. a tied embedding, has its stages' gradients summed, as Megatron all-reduces
them), in float64 by default (rtol 1e-9, atol 1e-12).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardplan.engines.spawn import (
    exit_fast,
    free_port,
    init_gloo,
    require_gloo,
    spawn_and_wait,
)
from shardplan.engines.torch_exec import (
    _require_torch,
    check_kinds,
    execute,
    init_values,
    kernels,
    loss_from_outputs,
)
from shardplan.engines.torch_report import TOLERANCES
from shardplan.errors import BackendError
from shardplan.exporters import training_json
from shardplan.ir.graph import Graph, make_graph
from shardplan.ir.op import Role
from shardplan.training import TrainingPlan


@dataclass(frozen=True, slots=True)
class PipelineReport:
    """Loss and gradients of the pipelined run against the single-process run.

    `worst_grad_ratio`: the largest max|pipelined - single| / (rtol max|single| + atol) over
    the parameter gradients (<= 1 passes); `failed`: what is out of tolerance ("loss", names).
    """

    stages: int
    micro_batches: int
    world_size: int
    loss: float
    reference_loss: float
    worst_grad_ratio: float
    worst_grad: str
    grads_checked: int
    failed: tuple[str, ...]
    seconds: float

    @property
    def ok(self) -> bool:
        """Loss and every gradient within tolerance (worst_grad_ratio <= 1)."""
        return not self.failed


def whole_graph(tp: TrainingPlan) -> Graph:
    """The model at the micro-batch size: the stages' ops in order, boundaries as activations."""
    tensors: dict[str, Any] = {}
    produced = {t for s in tp.stages for op in s.plan.graph.ops for t in op.outputs}
    from dataclasses import replace

    for s in tp.stages:
        for name, t in s.plan.graph.tensors.items():
            tensors[name] = replace(t, role=Role.ACTIVATION) if name in produced else t
    ops = tuple(op for s in tp.stages for op in s.plan.graph.ops)
    return make_graph(tp.model, tensors, ops)


def _graph_inputs(graph: Graph, seed: int, k: int) -> dict[str, np.ndarray]:
    """Inputs and constants of micro-batch k (constants do not depend on k)."""
    _, inputs = init_values(graph, seed + 1 + k)
    _, constants = init_values(graph, seed)
    return {
        n: (v if graph.tensors[n].role is Role.INPUT else constants[n]) for n, v in inputs.items()
    }


def _reference(tp: TrainingPlan, seed: int, dtype: str) -> tuple[float, dict[str, np.ndarray]]:
    torch = _require_torch()
    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:  # runs in the caller's process: its default dtype must not leak out
        return _reference_in(torch, tp, seed, dtype)
    finally:
        torch.set_default_dtype(previous)


def _reference_in(
    torch: Any, tp: TrainingPlan, seed: int, dtype: str
) -> tuple[float, dict[str, np.ndarray]]:
    graph = whole_graph(tp)
    params, _ = init_values(graph, seed)
    leaves = {
        n: torch.from_numpy(np.asarray(v, dtype=dtype)).requires_grad_(True)
        for n, v in params.items()
    }
    table, m = kernels(), tp.micro_batches
    total = 0.0
    for k in range(m):
        inputs = {
            n: (np.asarray(v, dtype=dtype) if np.issubdtype(v.dtype, np.floating) else v)
            for n, v in _graph_inputs(graph, seed, k).items()
        }
        env = execute(graph, leaves, inputs, table)
        loss = loss_from_outputs(graph, {n: env[n] for n in graph.outputs}) / m
        loss.backward()
        total += float(loss.detach())
    grads = {n: v.grad.detach().numpy() for n, v in leaves.items() if v.grad is not None}
    return total, grads


def run_pipeline(
    tp: TrainingPlan, seed: int = 0, dtype: str = "float64", timeout: float = 600.0
) -> PipelineReport:
    """Run `tp` on S x (stage devices) gloo processes and compare with one process."""
    torch = _require_torch()
    if dtype not in TOLERANCES:
        raise BackendError(f"dtype {dtype!r} is not supported; use one of {sorted(TOLERANCES)}")
    table = kernels()
    for s in tp.stages:
        check_kinds(s.plan.graph, table)
    shapes = {tuple(r.q for r in s.plan.mesh.rounds) for s in tp.stages}
    if len(shapes) != 1:
        raise BackendError(f"the stages of a pipeline need one stage mesh, got {sorted(shapes)}")
    require_gloo(torch)

    (stage_shape,) = shapes
    world = len(tp.stages) * int(np.prod(stage_shape or (1,)))
    workdir = tempfile.mkdtemp(prefix="shardplan-pipeline-")
    job = {
        "plan": training_json.to_dict(tp),
        "seed": seed,
        "dtype": dtype,
        "timeout": timeout,
        "mesh_shape": [len(tp.stages), *(stage_shape or (1,))],
        "workdir": workdir,
    }
    job_path = os.path.join(workdir, "job.json")
    start = time.perf_counter()
    try:
        with open(job_path, "w") as f:
            json.dump(job, f)
        args = (world, free_port(), job_path)
        spawn_and_wait(_worker, args, world, timeout, f"pipeline run of {tp.model}")
        grads: dict[str, np.ndarray] = {}
        for s in range(len(tp.stages)):
            with np.load(os.path.join(workdir, f"stage{s}.npz")) as data:
                for name in data.files:
                    if name == "__loss__":
                        continue
                    grads[name] = grads.get(name, 0) + data[name]
        with np.load(os.path.join(workdir, f"stage{len(tp.stages) - 1}.npz")) as data:
            loss = float(data["__loss__"])
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    seconds = time.perf_counter() - start
    ref_loss, ref_grads = _reference(tp, seed, dtype)
    rtol, atol = TOLERANCES[dtype]
    failed: list[str] = []
    if abs(loss - ref_loss) > rtol * abs(ref_loss) + atol:
        failed.append("loss")
    worst, worst_name = 0.0, ""
    for name, want in ref_grads.items():
        got = grads.get(name)
        if got is None or got.shape != want.shape:
            failed.append(name)
            continue
        # normwise: max |got - want| against rtol * max |want| + atol (the torch runner's rule)
        ratio = float(np.max(np.abs(got - want))) / (rtol * float(np.max(np.abs(want))) + atol)
        if ratio > 1.0:
            failed.append(name)
        if ratio >= worst:
            worst, worst_name = ratio, name
    return PipelineReport(
        len(tp.stages),
        tp.micro_batches,
        world,
        loss,
        ref_loss,
        worst,
        worst_name,
        len(ref_grads),
        tuple(failed),
        seconds,
    )


def _stage_module(torch: Any, runner: Any, tp: TrainingPlan, s: int, seed: int, dtype: str) -> Any:
    """The nn.Module of stage s (see the module docstring)."""
    dt = runner.dt
    plan = tp.stages[s].plan
    graph = plan.graph
    full = whole_graph(tp)
    params = {n: v for n, v in init_values(full, seed)[0].items() if n in graph.tensors}
    runner.distribute({n: np.asarray(v, dtype=dtype) for n, v in params.items()})
    leaves = {n: runner.env[n] for n in params}
    first = s == 0
    incoming = [
        n
        for n, t in graph.tensors.items()
        if t.role is Role.INPUT and n in full.producer  # produced by an earlier stage
    ]
    later = {t for st in tp.stages[s + 1 :] for t in st.plan.graph.tensors}
    outgoing = [t for op in graph.ops for t in op.outputs if t in later]
    whole = (dt.Replicate(),) * max(1, len(plan.mesh.rounds))

    class Stage(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weights = torch.nn.ParameterList([torch.nn.Parameter(v) for v in leaves.values()])
            self.calls = 0

        def forward(self, x: Any) -> Any:
            k = self.calls
            self.calls += 1
            values = {
                n: (np.asarray(v, dtype=dtype) if np.issubdtype(v.dtype, np.floating) else v)
                for n, v in _graph_inputs(full, seed, k).items()
                if n in graph.tensors and n not in full.producer
            }
            runner.env = dict(zip(leaves, self.weights, strict=True))
            runner.distribute(values)
            if not first:
                (name,) = incoming
                runner.env[name] = dt.DTensor.from_local(x, runner.mesh, whole)
            runner.run()
            if s == len(tp.stages) - 1:
                return runner.loss().reshape(1)  # the schedule concatenates outputs
            (name,) = outgoing
            return runner.env[name].redistribute(runner.mesh, whole).to_local()

    return Stage(), list(leaves)


def _worker(rank: int, world: int, port: int, job_path: str) -> None:
    """One process: its stage of the pipeline, driven by Schedule1F1B."""
    import torch
    import torch.distributed as dist

    with open(job_path) as f:
        job = json.load(f)
    init_gloo(rank, world, port, float(job["timeout"]))
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.pipelining import PipelineStage, Schedule1F1B

        from shardplan.engines.torch_runner import _Runner

        dtype = str(job["dtype"])
        torch.set_default_dtype(getattr(torch, dtype))
        tp = training_json.from_json(job["plan"])
        shape = tuple(job["mesh_shape"])
        names = ("pp", *(f"r{i}" for i in range(len(shape) - 1)))
        mesh = init_device_mesh("cpu", mesh_shape=shape, mesh_dim_names=names)
        coordinate = mesh.get_coordinate()
        assert coordinate is not None
        s = int(coordinate[0])
        sub = mesh[names[1:]] if len(names) > 2 else mesh[names[1]]
        runner = _Runner(tp.stages[s].plan, sub, kernels(), True)
        module, param_names = _stage_module(torch, runner, tp, s, int(job["seed"]), dtype)
        n, m = len(tp.stages), tp.micro_batches
        full = whole_graph(tp)
        micro = next(t for t in full.tensors.values() if t.role is Role.INPUT).shape[0]
        # static shapes: no metadata-inference forward (it would shift the micro-batch count)
        graph = tp.stages[s].plan.graph
        later = {t for st in tp.stages[s + 1 :] for t in st.plan.graph.tensors}
        incoming = [
            t for t, x in graph.tensors.items() if x.role is Role.INPUT and t in full.producer
        ]
        outgoing = [t for op in graph.ops for t in op.outputs if t in later]
        example_in = torch.zeros(full.tensors[incoming[0]].shape if s else (micro, 1))
        example_in.requires_grad_(s > 0)
        example_out = torch.zeros(full.tensors[outgoing[0]].shape if s < n - 1 else (1,))
        example_out.requires_grad_(True)
        stage = PipelineStage(
            module,
            s,
            n,
            torch.device("cpu"),
            input_args=example_in,
            output_args=example_out,
            group=mesh.get_group("pp"),
        )
        schedule = Schedule1F1B(
            stage, m, loss_fn=lambda out, _target: out.sum() / m, scale_grads=False
        )
        batch = torch.zeros(micro * m, 1)
        losses: list[Any] = []
        # the first stage feeds the batch, the last one (the same when S = 1) takes the loss
        args = (batch,) if s == 0 else ()
        last = {"target": torch.zeros(m, 1), "losses": losses} if s == n - 1 else {}
        schedule.step(*args, **last)
        grads = {}
        for name, p in zip(param_names, module.weights, strict=True):
            g = p.grad
            grads[name] = (
                g.full_tensor().detach().numpy()
                if g is not None
                else np.zeros(full.tensors[name].shape)
            )
        local = sub.get_coordinate()
        if local is None or all(int(c) == 0 for c in local):
            out: dict[str, Any] = dict(grads)
            if s == n - 1:
                out["__loss__"] = np.asarray(sum(float(x.detach()) for x in losses))
            np.savez(os.path.join(job["workdir"], f"stage{s}.npz"), **out)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    exit_fast()


__all__ = ["PipelineReport", "run_pipeline", "whole_graph"]
