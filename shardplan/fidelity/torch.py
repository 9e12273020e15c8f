"""Verify a plan on torch.distributed: `verify_torch(plan)` is the hook behind
`shardplan verify PLAN --engine torch` — run the plan on DTensors with one gloo process per device
(`shardplan.engines.torch_dist.run_distributed`), compare every output (and activation; in
training every gradient) with the single-process run, and give the verdict.
"""

from __future__ import annotations

from shardplan.engines.torch_dist import DEFAULT_TIMEOUT, run_distributed
from shardplan.engines.torch_report import DistReport
from shardplan.errors import BackendError
from shardplan.plans import Plan, spmd_plan


def verify_torch(
    plan: Plan,
    world_size: int | None = None,
    seed: int = 0,
    train: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    check_activations: bool = True,
    dtype: str = "float32",
    strict: bool = False,
) -> DistReport:
    """The hook of `shardplan verify PLAN --engine torch`: `run_distributed` + the verdict.

    Print `report.text()` (or `json.dumps(report.to_dict())`) and exit non-zero unless
    `report.ok`. With `strict=True` a mismatch raises BackendError carrying the report's text.
    """
    report = run_distributed(  # a ZeRO stage is checked as the SPMD program the engine runs
        spmd_plan(plan), world_size, seed, train, timeout, check_activations, dtype, None, None
    )
    if strict and not report.ok:
        raise BackendError(report.text())
    return report


__all__ = ["verify_torch"]
