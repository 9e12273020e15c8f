"""A long run of layers' profile from its two- and three-period reductions (`profiles`).

Additive terms (seconds, bytes summed over the ops) grow by the same increment per period when
the layers repeat under equal strategies; the peaks and the stage inputs do not grow. O(fields).
"""

from __future__ import annotations

from dataclasses import fields

from shardplan.cost.step import StageProfile
from shardplan.cost.zero import ZeroStep

_RESIDUE = 1e-15
"""Below this an additive term's increments are equal (`same_increment`)."""
_PEAKS = {"selective_peak_bytes", "segment_peak_bytes", "input_bytes"}
_KEEP = {"breakdown", "sequence_parallel", "context_parallel", "zero"}


def extrapolate(base: StageProfile, q1: StageProfile, q2: StageProfile, k: int) -> StageProfile:
    """The profile of a chunk of k periods from its own two-period reduction `base` and the
    per-period increment q2 - q1: additive terms base + (k - 2)(q2 - q1); the peaks and the
    stage inputs are base's (module docstring)."""
    out = {}
    for f in fields(StageProfile):
        a = getattr(base, f.name)
        if f.name in _PEAKS or f.name in _KEEP:
            out[f.name] = a
        else:
            out[f.name] = a + (k - 2) * (getattr(q2, f.name) - getattr(q1, f.name))
    out["zero"] = tuple(
        ZeroStep(*(a + (k - 2) * (y - x) for a, x, y in zip(_zs(z), _zs(z1), _zs(z2), strict=True)))
        for z, z1, z2 in zip(base.zero, q1.zero, q2.zero, strict=True)
    )
    return StageProfile(**out)


def _additive(p: StageProfile) -> list[float]:
    out = [float(getattr(p, f.name)) for f in fields(StageProfile) if f.name not in _PEAKS | _KEEP]
    return out + [x for z in p.zero for x in _zs(z)]


def peaks(p: StageProfile) -> list[float]:
    return [float(getattr(p, name)) for name in sorted(_PEAKS)]


def same_increment(p1: StageProfile, p2: StageProfile, q1: StageProfile, q2: StageProfile) -> bool:
    """p2 - p1 == q2 - q1 in every additive term, to 1e-9 of the larger profile's term or
    1e-15 (a femtosecond, a femtobyte): a term that cancels to ~0 (a ring exchange's exposed
    part less the all-gather it replaces) keeps residues of its parts' rounding, not of its own."""
    for a, b, c, d in zip(_additive(p1), _additive(p2), _additive(q1), _additive(q2), strict=True):
        if abs((b - a) - (d - c)) > max(1e-9 * max(abs(b), abs(d)), _RESIDUE):
            return False
    return True


def _zs(z: ZeroStep) -> tuple[float, float, float, float]:
    return (z.fwd_s, z.bwd_s, z.step_s, z.param_bytes)


__all__ = ["extrapolate", "peaks", "same_increment"]
