"""What a torch.distributed run measured: per-tensor errors, the per-plan `DistReport`, tolerances.

A tensor matches when max|dist - single| <= rtol * max|single| + atol (`TOLERANCES`, a normwise
criterion; see `shardplan.engines.torch_dist` for the numerics). Rank 0 builds the report as a
dict (`DistReport.to_dict`, JSON across the process boundary); the parent turns it back into a
`DistReport` with `_report_from_dict`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardplan import units
from shardplan.engines.torch_exec import _require_torch

RTOL = 1e-4
ATOL = 1e-5
TOLERANCES: dict[str, tuple[float, float]] = {"float32": (RTOL, ATOL), "float64": (1e-9, 1e-12)}
"""dtype -> default (rtol, atol): a tensor matches when max|dist - single| <= rtol * max|single|
+ atol."""


@dataclass(frozen=True, slots=True)
class TensorError:
    """Distributed vs single-process values of one tensor.

    `max_abs` = max |dist - single|; `max_rel` = max_abs / max(max |single|, atol / rtol) (relative
    to the tensor's scale, floored so that a tensor of rounding noise, e.g. a gradient that is
    mathematically zero, does not report a huge relative error); `ok` = equal shapes, NaNs in the
    same places and max_abs <= rtol * max|single| + atol (so max_rel <= rtol implies ok).
    """

    name: str
    max_abs: float
    max_rel: float
    ok: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class DistReport:
    """What `run_distributed` measured for one plan.

    Attributes:
        model, method, mesh: the plan's graph name, method and mesh text.
        mesh_shape: the DeviceMesh shape (q per round); world_size: processes (= devices).
        ok: every compared tensor within tolerance.
        outputs: graph outputs; activations: worst activation, first op whose output differs
            (`first_mismatch`, None if none) and how many were compared; grads (train only):
            every parameter's gradient.
        max_abs_error / max_rel_error: worst over everything compared.
        redistributions: per-round placement transitions the runner asked DTensor for, by the
            collective they imply ("all-gather" S->R, "all-reduce" P->R, "reduce-scatter" P->S,
            "all-to-all" S(a)->S(b), "slice" R->S (local)), counted once per round and operand.
        seconds: rank 0's distributed execution time (forward, and backward when train);
            wall_seconds: the whole call (process start-up included), shared by its plans.
    """

    model: str
    method: str
    mesh: str
    mesh_shape: tuple[int, ...]
    world_size: int
    train: bool
    ok: bool
    dtype: str
    rtol: float
    atol: float
    outputs: tuple[TensorError, ...]
    max_abs_error: float
    max_rel_error: float
    activations_checked: int = 0
    worst_activation: TensorError | None = None
    first_mismatch: str | None = None
    grads: tuple[TensorError, ...] = ()
    redistributions: Mapping[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    wall_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": "torch.distributed (gloo, DTensor)",
            "model": self.model,
            "method": self.method,
            "mesh": self.mesh,
            "mesh_shape": list(self.mesh_shape),
            "world_size": self.world_size,
            "train": self.train,
            "ok": self.ok,
            "dtype": self.dtype,
            "rtol": self.rtol,
            "atol": self.atol,
            "max_abs_error": self.max_abs_error,
            "max_rel_error": self.max_rel_error,
            "outputs": [e.to_dict() for e in self.outputs],
            "activations_checked": self.activations_checked,
            "worst_activation": self.worst_activation.to_dict() if self.worst_activation else None,
            "first_mismatch": self.first_mismatch,
            "grads": [e.to_dict() for e in self.grads],
            "redistributions": dict(self.redistributions),
            "seconds": self.seconds,
            "wall_seconds": self.wall_seconds,
        }

    def text(self) -> str:
        """A few human-readable lines (what `shardplan verify --engine torch` prints)."""
        status = "OK" if self.ok else "MISMATCH"
        lines = [
            f"{status}: {self.model} ({self.method}) on mesh {self.mesh} = DeviceMesh"
            f"{self.mesh_shape}, {self.world_size} gloo processes, "
            f"{'forward+backward' if self.train else 'forward'} in {units.seconds(self.seconds)}",
            f"  {self.dtype}, tolerance max|err| <= {self.rtol:g} * max|ref| + {self.atol:g}; "
            "max abs error "
            f"{units.number(self.max_abs_error)}, max rel error {units.number(self.max_rel_error)}",
        ]
        for e in self.outputs:
            lines.append(
                f"  output {e.name}: abs {units.number(e.max_abs)} rel {units.number(e.max_rel)} "
                f"{'ok' if e.ok else 'MISMATCH'}"
            )
        if self.activations_checked:
            worst = self.worst_activation
            lines.append(
                f"  {self.activations_checked} activations compared; worst "
                f"{worst.name if worst else '-'} abs "
                f"{units.number(worst.max_abs if worst else 0.0)}"
                + (f"; first mismatch at op {self.first_mismatch}" if self.first_mismatch else "")
            )
        if self.grads:
            g = max(self.grads, key=lambda e: (not e.ok, e.max_rel))
            bad = sum(not e.ok for e in self.grads)
            lines.append(
                f"  {len(self.grads)} parameter gradients compared, {bad} mismatched; worst "
                f"{g.name} abs {units.number(g.max_abs)} rel {units.number(g.max_rel)}"
            )
        if self.redistributions:
            parts = ", ".join(f"{k} {v}" for k, v in sorted(self.redistributions.items()))
            lines.append(f"  redistributions (per round): {parts}")
        return "\n".join(lines)


def _error(name: str, got: Any, ref: Any, rtol: float, atol: float) -> TensorError:
    torch = _require_torch()
    got = got.detach().to(torch.float64)
    ref = ref.detach().to(torch.float64)
    if got.shape != ref.shape:
        return TensorError(name, math.inf, math.inf, False)
    if got.numel() == 0:
        return TensorError(name, 0.0, 0.0, True)
    same_nan = torch.equal(torch.isnan(got), torch.isnan(ref))
    diff = torch.nan_to_num((got - ref).abs(), nan=0.0)
    max_abs = float(diff.max())
    scale = float(torch.nan_to_num(ref.abs(), nan=0.0).max())
    floor = max(scale, atol / rtol if rtol > 0 else 0.0)
    max_rel = max_abs / floor if floor > 0 else (0.0 if max_abs == 0 else math.inf)
    ok = same_nan and math.isfinite(max_abs) and max_abs <= rtol * scale + atol
    return TensorError(name, max_abs, max_rel, ok)


def _worst(errors: Sequence[TensorError]) -> tuple[float, float]:
    return (
        max((e.max_abs for e in errors), default=0.0),
        max((e.max_rel for e in errors), default=0.0),
    )


def _report_from_dict(d: dict[str, Any], wall: float) -> DistReport:
    def err(e: dict[str, Any] | None) -> TensorError | None:
        return None if e is None else TensorError(e["name"], e["max_abs"], e["max_rel"], e["ok"])

    return DistReport(
        model=d["model"],
        method=d["method"],
        mesh=d["mesh"],
        mesh_shape=tuple(d["mesh_shape"]),
        world_size=int(d["world_size"]),
        train=bool(d["train"]),
        ok=bool(d["ok"]),
        dtype=str(d["dtype"]),
        rtol=float(d["rtol"]),
        atol=float(d["atol"]),
        outputs=tuple(err(e) for e in d["outputs"]),  # type: ignore[misc]
        max_abs_error=float(d["max_abs_error"]),
        max_rel_error=float(d["max_rel_error"]),
        activations_checked=int(d["activations_checked"]),
        worst_activation=err(d["worst_activation"]),
        first_mismatch=d["first_mismatch"],
        grads=tuple(err(e) for e in d["grads"]),  # type: ignore[misc]
        redistributions=dict(d["redistributions"]),
        seconds=float(d["seconds"]),
        wall_seconds=wall,
    )


__all__ = ["ATOL", "RTOL", "TOLERANCES", "DistReport", "TensorError"]
