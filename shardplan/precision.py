"""Numeric precision of training: bytes per element and each machine's peak FLOP rate per dtype.

`Precision` is the `--dtype` option. "bf16" and "fp16" mean mixed precision as Megatron-LM and
DeepSpeed run it: weights, activations, gradients and communication in 16 bits, an fp32 master
copy of the weights (4 B per parameter) beside the fp32 optimizer state. "fp32" keeps everything
in 4 bytes and has no master copy. The FLOP rate per dtype is the machine's
(`shardplan.hardware.peak_flops`). Look-ups are O(1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from shardplan.errors import MeshError


@dataclass(frozen=True, slots=True)
class Precision:
    """Bytes per element of the compute copy (weights, activations, gradients, messages) and of
    the fp32 master weights kept beside the optimizer state (0 when training in fp32)."""

    name: str
    element_bytes: int
    master_bytes: int


PRECISIONS: Mapping[str, Precision] = MappingProxyType(
    {
        "bf16": Precision("bf16", 2, 4),
        "fp16": Precision("fp16", 2, 4),
        "fp32": Precision("fp32", 4, 0),
    }
)


def get_precision(dtype: str | Precision) -> Precision:
    """The Precision named `dtype` ("bf16", "fp16" or "fp32")."""
    if isinstance(dtype, Precision):
        return dtype
    if dtype not in PRECISIONS:
        raise MeshError(f"unknown dtype {dtype!r}; choose one of {sorted(PRECISIONS)}")
    return PRECISIONS[dtype]
