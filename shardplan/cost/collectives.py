"""The only home of collective-communication formulas (ring algorithms, bandwidth term only)
and of the collective kinds (`CollectiveKind`, which every other layer names them by).

`nbytes` is the size of the whole tensor the q devices of a group share (before this round's
split); results are seconds at `bandwidth` bytes/s per device. For q devices:
all-reduce 2(q-1)/q * S/B, all-gather and reduce-scatter (q-1)/q * S/B, all-to-all where each
device holds S/q and keeps 1/q of it: (q-1)/q * (S/q)/B, halo exchange to two neighbours 2*H/B.
"""

from __future__ import annotations

from enum import StrEnum


class CollectiveKind(StrEnum):
    """A collective by the name XLA's HLO gives it. str-valued, so JSON, tables and HLO text
    keep the plain names; the engines, fidelity checks and reports all use these members."""

    ALL_REDUCE = "all-reduce"
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"
    ALL_TO_ALL = "all-to-all"
    COLLECTIVE_PERMUTE = "collective-permute"  # XLA's halo exchange (`halo_exchange_s`)


def all_reduce_s(nbytes: float, q: int, bandwidth: float) -> float:
    return 0.0 if q <= 1 else 2.0 * (q - 1) / q * nbytes / bandwidth


def all_gather_s(nbytes: float, q: int, bandwidth: float) -> float:
    return 0.0 if q <= 1 else (q - 1) / q * nbytes / bandwidth


def reduce_scatter_s(nbytes: float, q: int, bandwidth: float) -> float:
    return all_gather_s(nbytes, q, bandwidth)


def all_to_all_s(nbytes: float, q: int, bandwidth: float) -> float:
    return 0.0 if q <= 1 else (q - 1) / q * (nbytes / q) / bandwidth


def halo_exchange_s(halo_bytes: float, bandwidth: float) -> float:
    return 2.0 * halo_bytes / bandwidth


def all_reduce_bytes(nbytes: float, q: int) -> float:
    """Bytes one device sends in a ring all-reduce (what an engine's traffic counter sees)."""
    return 0.0 if q <= 1 else 2.0 * (q - 1) / q * nbytes


def all_gather_bytes(nbytes: float, q: int) -> float:
    return 0.0 if q <= 1 else (q - 1) / q * nbytes
