"""Numeric precision of training: bytes per element and each machine's peak FLOP rate per dtype.

`Precision` is the `--dtype` option. "bf16" and "fp16" mean mixed precision as Megatron-LM and
DeepSpeed run it: weights, activations, gradients and communication in 16 bits, an fp32 master
copy of the weights (4 B per parameter) beside the fp32 optimizer state. "fp32" keeps everything
in 4 bytes and has no master copy. `peak_flops(machine, dtype)` reads the datasheet table below;
a (machine, dtype) pair without a published figure raises MeshError rather than guessing.
All look-ups are O(1).
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

# Dense (no sparsity) peak FLOP/s per device and dtype.
PEAK_FLOPS: Mapping[str, Mapping[str, float]] = MappingProxyType(
    {
        # NVIDIA A100 Tensor Core GPU datasheet (2021, SXM4 80GB): BF16/FP16 tensor core 312
        # TFLOPS, FP32 19.5 TFLOPS (TF32 tensor core 156 TFLOPS is not used for "fp32" here).
        "a100": MappingProxyType({"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12}),
        # NVIDIA H100 Tensor Core GPU datasheet (2023, SXM5): BF16/FP16 tensor core 989.4
        # TFLOPS dense (1,979 with sparsity), FP32 67 TFLOPS.
        "h100": MappingProxyType({"bf16": 989.4e12, "fp16": 989.4e12, "fp32": 67e12}),
        # Huawei Ascend 910 (Liao et al., "DaVinci", Hot Chips 31, 2019; Huawei product page):
        # FP16 256 TFLOPS, INT8 512 TOPS. No BF16 unit and no published FP32 cube rate: absent.
        "ascend910": MappingProxyType({"fp16": 256e12}),
        # the synthetic "uniform" machine: one rate for every dtype (pure volume comparisons)
        "uniform": MappingProxyType({"bf16": 1e12, "fp16": 1e12, "fp32": 1e12}),
    }
)


def get_precision(dtype: str | Precision) -> Precision:
    """The Precision named `dtype` ("bf16", "fp16" or "fp32")."""
    if isinstance(dtype, Precision):
        return dtype
    if dtype not in PRECISIONS:
        raise MeshError(f"unknown dtype {dtype!r}; choose one of {sorted(PRECISIONS)}")
    return PRECISIONS[dtype]


def peak_flops(machine: str, dtype: str | Precision) -> float:
    """Peak dense FLOP/s of one device of `machine` computing in `dtype`."""
    name = get_precision(dtype).name
    rates = PEAK_FLOPS.get(machine)
    if rates is None:
        raise MeshError(
            f"no FLOP rates for machine {machine!r}; choose one of {sorted(PEAK_FLOPS)}"
        )
    if name not in rates:
        raise MeshError(
            f"machine {machine!r} has no published {name} rate (it has {sorted(rates)}); "
            f"pass --dtype {sorted(rates)[0]}"
        )
    return rates[name]
