"""Run a Plan on torch.distributed DTensors (gloo, CPU): the parent side of the distributed run.

- `run_distributed(plan)`: spawns one local process per device (`torch.multiprocessing`, start
  method "spawn", gloo), builds a DeviceMesh shaped like the plan's rounds
  (`shardplan.exporters.dtensor.mesh_shape`), distributes every parameter and input to its
  planned placements with `distribute_tensor`, and executes the graph op by op: each operand is
  `.redistribute`d to the placements the op's strategy reads (`operand_layout`: split ->
  `Shard(d)`, replicated -> `Replicate()`), the kernel runs on the local shards (`to_local()`),
  and the result is wrapped with `DTensor.from_local` in the op's raw output placements
  (`Shard(d)`, `Replicate()`, or `Partial()` where a REDUCE cut leaves partial sums; consumers'
  redistributions then insert the all-reduce / reduce-scatter). Rank 0 compares the outputs
  (and, by default, every activation; with `train=True` also every parameter gradient) with the
  single-process run of the same executor and returns a `DistReport`.
- `run_distributed_many(plans)`: the same for several plans in one set of processes.

Numerics: float32 by default; a tensor matches when max|dist - single| <= rtol * max|single| +
atol with rtol 1e-4, atol 1e-5 (`TOLERANCES`, a normwise criterion). Sharded partial sums add
in another order than the single-process run, so bitwise equality is not expected; relative
errors measured on the zoo and on imported HF models are <= 1e-5 (mostly ~1e-7). Deep chains
of batch norms over a few elements (ResNet-50 at 32x32 pixels) amplify fp32 rounding beyond any
useful tolerance — the single-process fp32 run itself is then ~1e-2 away from float64 — so
`dtype="float64"` runs both sides in float64 (rtol 1e-9, atol 1e-12) to check the sharding
exactly, without fp32 noise.

The torch engine is split over modules (each name is imported from where it is defined):
- `shardplan.engines.torch_exec`: values (`init_values`), ONE kernel per kind (`kernels()`) and
  the single-process executor (`execute` / `forward`, `loss_from_outputs`);
- `shardplan.engines.torch_runner`: the per-process runner (the kinds that need the device's
  position; how redistributions are counted; gradient placements);
- `shardplan.engines.torch_report`: `TensorError`, `DistReport`, `TOLERANCES`;
- this module: the parent side (`run_distributed`, `run_distributed_many`);
- `shardplan.fidelity.torch.verify_torch`: the verdict behind `shardplan verify --engine torch`.

torch is imported inside the functions that need it; without it they raise
MissingDependencyError. Values: parameters are normal * 0.02 (norm scales 1), the same numbers as
`shardplan.engines.jax.init_params`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from shardplan.engines.spawn import free_port, require_gloo, spawn_and_wait
from shardplan.engines.torch_exec import _require_torch, check_kinds, kernels
from shardplan.engines.torch_report import TOLERANCES, DistReport, _report_from_dict
from shardplan.engines.torch_runner import _worker
from shardplan.errors import BackendError
from shardplan.exporters.plan_json import to_dict
from shardplan.plans import Plan

DEFAULT_TIMEOUT = 300.0
"""Seconds `run_distributed` waits for its processes (all plans of one call) before killing them."""


# -- the parent side -----------------------------------------------------------------------------


def _per_plan(value: Any, count: int, what: str) -> list[Any]:
    if isinstance(value, (str, bool)) or value is None:
        return [value] * count
    values = list(value)
    if len(values) != count:
        raise BackendError(f"{what} has {len(values)} entries for {count} plans")
    return values


def run_distributed_many(
    plans: Sequence[Plan],
    world_size: int | None = None,
    seed: int = 0,
    train: bool | Sequence[bool] = False,
    timeout: float = DEFAULT_TIMEOUT,
    check_activations: bool = True,
    dtype: str | Sequence[str] = "float32",
    rtol: float | None = None,
    atol: float | None = None,
) -> list[DistReport]:
    """`run_distributed` for several plans in ONE set of processes (start-up is paid once).

    Every plan must have the same DeviceMesh shape (`mesh_shape`: q per round; meshes "4" and
    "2x2" both give (2, 2)). `train` and `dtype` are one value or one per plan; `timeout` covers
    the whole call. See `run_distributed`.
    """
    torch = _require_torch()
    if not plans:
        return []
    from shardplan.exporters.dtensor import mesh_shape

    shapes = {mesh_shape(p) for p in plans}
    if len(shapes) != 1:
        raise BackendError(
            f"run_distributed_many: plans need one DeviceMesh shape (q per round), got "
            f"{sorted(shapes)}; call it once per mesh shape"
        )
    (shape,) = shapes
    devices = plans[0].mesh.size
    if world_size is not None and world_size != devices:
        raise BackendError(
            f"world_size={world_size} but the plan's mesh {plans[0].mesh.text()} has {devices} "
            "devices; the runner starts one process per device (leave world_size unset)"
        )
    flags = [bool(t) for t in _per_plan(train, len(plans), "train")]
    dtypes = [str(d) for d in _per_plan(dtype, len(plans), "dtype")]
    for d in dtypes:
        if d not in TOLERANCES:
            raise BackendError(f"dtype {d!r} is not supported; use one of {sorted(TOLERANCES)}")
    table = kernels()
    for p in plans:
        check_kinds(p.graph, table)
    require_gloo(torch)

    entries = []
    for p, t, d in zip(plans, flags, dtypes, strict=True):
        default_rtol, default_atol = TOLERANCES[d]
        entries.append(
            {
                "plan": to_dict(p),
                "train": t,
                "dtype": d,
                "rtol": default_rtol if rtol is None else float(rtol),
                "atol": default_atol if atol is None else float(atol),
                "check_activations": bool(check_activations),
            }
        )
    job = {"plans": entries, "mesh_shape": list(shape), "seed": int(seed), "timeout": timeout}
    workdir = tempfile.mkdtemp(prefix="shardplan-torch-")
    job_path = os.path.join(workdir, "job.json")
    out_path = os.path.join(workdir, "reports.json")
    names = ", ".join(sorted({f"{p.graph.name}/{p.method}" for p in plans}))
    start = time.perf_counter()
    try:
        with open(job_path, "w") as f:
            json.dump(job, f)
        what = f"torch.distributed run of {names}"
        spawn_and_wait(_worker, (devices, free_port(), job_path, out_path), devices, timeout, what)
        with open(out_path) as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise BackendError(f"torch.distributed run of {names}: no report from rank 0 ({e})") from e
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    wall = time.perf_counter() - start
    return [_report_from_dict(d, wall) for d in raw]


def run_distributed(
    plan: Plan,
    world_size: int | None = None,
    seed: int = 0,
    train: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    check_activations: bool = True,
    dtype: str = "float32",
    rtol: float | None = None,
    atol: float | None = None,
) -> DistReport:
    """Run `plan` on `plan.mesh.size` local gloo processes with DTensor; compare on rank 0.

    Args:
        world_size: must equal the plan's device count if given (one process per device).
        seed: values come from `init_values(graph, seed)`, built identically on every rank.
        train: also run backward of `loss_from_outputs` and compare every parameter gradient.
        timeout: seconds for the whole run (process start-up included, ~10-20 s on 2 cores) and
            for each collective; processes still alive then are terminated (BackendError).
        check_activations: compare every activation, not only the graph outputs (one gather
            per activation; `first_mismatch` names the first op whose output differs).
        dtype: "float32" (default) or "float64" (both sides; see the module docstring).
        rtol, atol: the tolerance; default `TOLERANCES[dtype]` (fp32: 1e-4, 1e-5).

    Returns:
        DistReport (`.ok`, errors, redistributions, `.text()`).

    Raises:
        UnsupportedOpError: an op kind has no torch kernel (before any process starts).
        BackendError: a rank failed (the tail of its traceback is in the message), timeout, bad
            world_size or dtype, or no gloo.
    """
    (report,) = run_distributed_many(
        [plan], world_size, seed, train, timeout, check_activations, dtype, rtol, atol
    )
    return report


__all__ = ["DEFAULT_TIMEOUT", "run_distributed", "run_distributed_many"]
