"""Machines: datasheet presets of the hardware a mesh runs on (links, FLOP rates, HBM).

A `Machine` gives per-device link bandwidths inside a node and between nodes, the devices per
node, the HBM per device and the dense FLOP rate per compute dtype (`flops_by_dtype`; the cost
model prices compute at the rate of `compute_dtype`, the dtype the preset's number was read for —
room is left for more dtypes, none is invented). `link_bandwidths(shape)` assigns one link per
mesh axis, devices laid out row-major (the innermost axis varies fastest, as JAX's hybrid device
meshes and torchtitan lay them out): an axis is intra-node while the product of its size and the
sizes of the axes inside it fits in — and divides — `devices_per_node`; every axis outside that
crosses nodes. A size-1 axis never communicates, so it costs nothing wherever it sits (it gets
the intra-node link and does not enlarge the product). O(axes).

The default machine is named once, `DEFAULT_MACHINE` ("a100"): mesh text given to `parse_mesh`,
`shardplan.plan` or the CLI without a machine gets it, and the plan records it
(`plan.mesh.machine`, and `mesh.machine` in the plan JSON). Users describe their own machine as a
`Machine` value (`Machine.make(name, intra_node=..., inter_node=..., memory=..., flops=...)`, or
`Machine.from_dict` of a JSON file given to `--machine FILE.json`); a Mesh binds the Machine
value itself (`mesh.hardware`), so nothing downstream looks a machine up by name. Lookups O(1).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType
from typing import Any

from shardplan import checks
from shardplan.errors import ArgumentError, MeshError

_INF = float("inf")
# meta-pytorch/autoparallel's roofline constants (module docstring): achieved fraction of peak
# FLOP/s and of HBM bandwidth, and the per-kernel launch floor.
_AP_EFFICIENCY = 0.70
_AP_LAUNCH_S = 7e-6


def _positive(x: object) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float)) and 0 < x < _INF


_RATE_UNITS = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def _rate(x: object, what: str) -> float:
    """A positive rate: a number, or text like "900GB/s", "50 GB/s", "989T" (decimal units)."""
    if isinstance(x, str):
        text = x.strip().upper().replace(" ", "").removesuffix("/S").removesuffix("B")
        text = text.removesuffix("FLOPS").removesuffix("FLOP")
        unit = text[-1:] if text[-1:] in _RATE_UNITS and text[-1:] else ""
        try:
            x = float(text[: len(text) - len(unit)]) * _RATE_UNITS[unit]
        except ValueError:
            raise MeshError(f"machine: {what} {x!r} is not a rate like '900GB/s'") from None
    if not _positive(x):
        raise MeshError(f"machine: {what} must be a positive finite number, got {x!r}")
    return float(x)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class Machine:
    """A datasheet-style preset: link bandwidths (bytes/s per device), HBM bytes, FLOP/s."""

    name: str
    intra_node_bytes_per_s: float
    inter_node_bytes_per_s: float
    memory_bytes: float
    flops_by_dtype: Mapping[str, float]
    compute_dtype: str
    devices_per_node: int
    description: str
    hbm_bytes_per_s: float = _INF
    """Device memory bandwidth (datasheet); infinite: no memory-bound term."""
    flops_efficiency: float = 1.0
    """Fraction of the peak FLOP rate a kernel achieves."""
    hbm_efficiency: float = 1.0
    """Fraction of the memory bandwidth a kernel achieves."""
    launch_s: float = 0.0
    """Least time any kernel takes (launch overhead), seconds."""

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled as its constructor's arguments (its FLOP rates a plain dict: a read-only
        mapping does not pickle), so plans and graphs cross to worker processes."""
        values = [getattr(self, f.name) for f in fields(self)]
        return (Machine, tuple(dict(v) if isinstance(v, Mapping) else v for v in values))

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise MeshError(f"a machine needs a non-empty name, got {self.name!r}")
        if not isinstance(self.flops_by_dtype, Mapping) or not all(
            isinstance(k, str) and _positive(v) for k, v in self.flops_by_dtype.items()
        ):
            raise MeshError(
                f"machine {self.name!r}: flops_by_dtype must map dtype names to positive FLOP/s"
            )
        object.__setattr__(self, "flops_by_dtype", MappingProxyType(dict(self.flops_by_dtype)))
        for what in ("intra_node_bytes_per_s", "inter_node_bytes_per_s", "memory_bytes"):
            if not _positive(getattr(self, what)):
                raise MeshError(f"machine {self.name!r}: {what} must be a positive number")
        if isinstance(self.devices_per_node, bool) or not isinstance(self.devices_per_node, int):
            raise MeshError(f"machine {self.name!r}: devices_per_node must be a whole number")
        if self.devices_per_node < 1:
            raise MeshError(f"machine {self.name!r}: devices_per_node must be >= 1")
        if self.compute_dtype not in self.flops_by_dtype:
            raise MeshError(f"machine {self.name!r}: no FLOP rate for {self.compute_dtype!r}")
        if not (self.hbm_bytes_per_s > 0 and 0 < self.flops_efficiency <= 1):
            raise MeshError(f"machine {self.name!r}: memory bandwidth and efficiency must be > 0")
        if not (0 < self.hbm_efficiency <= 1 and self.launch_s >= 0):
            raise MeshError(f"machine {self.name!r}: efficiency in (0, 1], launch floor >= 0")

    @classmethod
    def make(
        cls,
        name: str,
        *,
        intra_node: float | str,
        inter_node: float | str,
        memory: float | str,
        flops: Mapping[str, float | str] | float | str,
        devices_per_node: int = 8,
        compute_dtype: str | None = None,
        hbm: float | str | None = None,
        description: str = "",
    ) -> Machine:
        """A user's machine from readable figures: links and HBM bandwidth in bytes/s or text
        ("900GB/s"), memory in bytes or text ("141GB"), dense FLOP/s per dtype (a number or
        text like "989T" means bf16). Kernel efficiencies and launch floor are the presets'
        (autoparallel's roofline constants) when an HBM bandwidth is given, else none."""
        rates = flops if isinstance(flops, Mapping) else {"bf16": flops}
        table = {str(k): _rate(v, f"flops[{k!r}]") for k, v in rates.items()}
        dtype = compute_dtype or ("bf16" if "bf16" in table else next(iter(table), "bf16"))
        extra: dict[str, float] = {}
        if hbm is not None:
            extra = {
                "hbm_bytes_per_s": _rate(hbm, "hbm"),
                "flops_efficiency": _AP_EFFICIENCY,
                "hbm_efficiency": _AP_EFFICIENCY,
                "launch_s": _AP_LAUNCH_S,
            }
        return cls(
            name,
            _rate(intra_node, "intra_node"),
            _rate(inter_node, "inter_node"),
            checks.memory_bytes(memory),
            table,
            dtype,
            devices_per_node,
            description
            or f"user machine: {devices_per_node} devices per node, links "
            f"{_rate(intra_node, 'intra_node') / 1e9:g} / {_rate(inter_node, 'inter_node') / 1e9:g}"
            " GB/s",
            **extra,
        )

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["flops_by_dtype"] = dict(self.flops_by_dtype)
        out["hbm_bytes_per_s"] = None if self.hbm_bytes_per_s == _INF else self.hbm_bytes_per_s
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Machine:
        """A Machine of `to_dict`'s fields (text rates and sizes allowed, as in `make`)."""
        if not isinstance(data, Mapping):
            raise MeshError(f"a machine must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise MeshError(f"machine: unknown field(s) {unknown}; known: {sorted(known)}")
        kw = dict(data)
        try:
            for key in ("intra_node_bytes_per_s", "inter_node_bytes_per_s"):
                kw[key] = _rate(kw[key], key)
            kw["memory_bytes"] = checks.memory_bytes(kw["memory_bytes"])
            if kw.get("hbm_bytes_per_s") is None:
                kw.pop("hbm_bytes_per_s", None)
            else:
                kw["hbm_bytes_per_s"] = _rate(kw["hbm_bytes_per_s"], "hbm_bytes_per_s")
            rates = kw["flops_by_dtype"]
            if not isinstance(rates, Mapping):
                raise MeshError("machine: flops_by_dtype must be an object of dtype -> FLOP/s")
            kw["flops_by_dtype"] = {str(k): _rate(v, f"flops[{k!r}]") for k, v in rates.items()}
            kw.setdefault("description", f"user machine {kw.get('name')!r}")
            return cls(**kw)
        except KeyError as e:
            raise MeshError(f"machine: missing field {e.args[0]!r}") from e
        except (TypeError, ArgumentError) as e:
            raise MeshError(f"machine: {e}") from e

    @property
    def flops_per_s(self) -> float:
        """Dense FLOP/s of one device in `compute_dtype` (what the cost model prices)."""
        return self.flops_by_dtype[self.compute_dtype]

    def link_bandwidths(self, shape: tuple[int, ...]) -> tuple[float, ...]:
        """One bandwidth per mesh axis (row-major layout, see the module docstring): axes from
        the innermost out are intra-node while their running product divides a node; a mesh
        that fits in one node (6 devices on an 8-device node) is intra-node on every axis."""
        if math.prod(shape) <= self.devices_per_node:
            return tuple(self.intra_node_bytes_per_s for _ in shape)
        out: list[float] = []
        inside, in_node = 1, True
        for size in reversed(shape):
            if size == 1:  # never communicates: any link will do, the fast one reads right
                out.append(self.intra_node_bytes_per_s)
                continue
            inside *= size
            in_node = in_node and self.devices_per_node % inside == 0
            out.append(self.intra_node_bytes_per_s if in_node else self.inter_node_bytes_per_s)
        return tuple(reversed(out))


MACHINES: Mapping[str, Machine] = MappingProxyType(
    {
        m.name: m
        for m in (
            Machine(
                "a100",
                300e9,
                25e9,
                80e9,
                # NVIDIA A100 datasheet (2021, SXM4 80GB), dense: BF16/FP16 tensor core 312
                # TFLOPS, FP32 19.5 (TF32's 156 is not used for "fp32")
                {"bf16": 312e12, "fp16": 312e12, "fp32": 19.5e12},
                "bf16",
                8,
                "8x A100-80GB per node, NVLink3 300 GB/s per direction, 200 Gb/s IB per GPU",
                # NVIDIA A100 datasheet (2021): A100 80GB SXM, GPU memory bandwidth 2,039 GB/s
                hbm_bytes_per_s=2039e9,
                flops_efficiency=_AP_EFFICIENCY,
                hbm_efficiency=_AP_EFFICIENCY,
                launch_s=_AP_LAUNCH_S,
            ),
            Machine(
                "h100",
                450e9,
                50e9,
                80e9,
                # NVIDIA H100 SXM5 datasheet (2023), dense: BF16/FP16 tensor core 989 TFLOPS
                # (1,979 with sparsity), FP32 67
                {"bf16": 989e12, "fp16": 989e12, "fp32": 67e12},
                "bf16",
                8,
                "8x H100-80GB per node, NVLink4 450 GB/s per direction, 400 Gb/s IB per GPU",
                # NVIDIA H100 datasheet (2023): H100 SXM, GPU memory bandwidth 3.35 TB/s
                hbm_bytes_per_s=3.35e12,
                flops_efficiency=_AP_EFFICIENCY,
                hbm_efficiency=_AP_EFFICIENCY,
                launch_s=_AP_LAUNCH_S,
            ),
            Machine(
                "ascend910",
                56e9,
                12.5e9,
                32e9,
                # Huawei Ascend 910 (Hot Chips 31, 2019): FP16 256 TFLOPS, INT8 512 TOPS; no BF16
                # unit and no published FP32 cube rate, so none is listed
                {"fp16": 256e12},
                "fp16",
                8,
                "8x Ascend 910 per node, HCCS 56 GB/s, 100 Gb/s RoCE per NPU",
                # Ascend 910 (Hot Chips 31, 2019; Liao et al., HPCA 2021): 4 HBM2 stacks, 1.2 TB/s.
                # autoparallel's fractions were set for NVIDIA GPUs; used here for lack of others
                hbm_bytes_per_s=1.2e12,
                flops_efficiency=_AP_EFFICIENCY,
                hbm_efficiency=_AP_EFFICIENCY,
                launch_s=_AP_LAUNCH_S,
            ),
            Machine(
                "uniform",
                1e9,
                1e9,
                80e9,
                {"any": 1e12},
                "any",
                1 << 30,
                "every link alike (1 GB/s) — pure communication-volume comparisons",
                # no memory term, no efficiency, no launch floor: compute stays FLOPs / rate
            ),
        )
    }
)

DEFAULT_MACHINE = "a100"
"""The machine mesh text gets when none is named (API, CLI `--machine`)."""


def peak_flops(machine: str | Machine, dtype: str) -> float:
    """Dense FLOP/s of one device of `machine` computing in `dtype` ("bf16", "fp16", "fp32"); a
    machine with one rate for every dtype ("any") gives it; MeshError when the datasheet has
    none (the message lists the dtypes it has)."""
    spec = machine if isinstance(machine, Machine) else get_machine(machine)
    rates = spec.flops_by_dtype
    if dtype in rates:
        return rates[dtype]
    if "any" in rates:
        return rates["any"]
    raise MeshError(
        f"machine {spec.name!r} has no published {dtype} rate (it has {sorted(rates)}); "
        f"pass --dtype {sorted(rates)[0]}"
    )


def get_machine(name: str) -> Machine:
    """The preset called `name`, or MeshError listing the presets."""
    if name not in MACHINES:
        raise MeshError(f"unknown machine {name!r}; choose one of {sorted(MACHINES)}")
    return MACHINES[name]


__all__ = ["DEFAULT_MACHINE", "MACHINES", "Machine", "get_machine", "peak_flops"]
