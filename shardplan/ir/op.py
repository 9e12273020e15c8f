"""Tensors and operators: frozen values; an operator's meaning is its signature (data, not code)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any

from shardplan.checks import MAX_SIZE
from shardplan.errors import IRError
from shardplan.ir.signature import Signature


class Role(enum.Enum):
    INPUT = "input"
    PARAMETER = "parameter"
    ACTIVATION = "activation"
    CONSTANT = "constant"

    __hash__ = object.__hash__  # members are singletons: a C-level hash keeps cost keys cheap


@dataclass(frozen=True, slots=True)
class Tensor:
    """A value of the graph: global shape, bytes per element, role."""

    name: str
    shape: tuple[int, ...]
    dtype_bytes: int = 4
    role: Role = Role.ACTIVATION
    received: bool = False
    """An input of a pipeline stage that an earlier stage computed (`ir.segments.subgraph`): an
    activation on the wire, priced at the compute precision like the activation it is."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise IRError(f"tensor name {self.name!r} must be a non-empty string")
        shape = self.shape
        ok = isinstance(shape, (tuple, list)) and all(
            isinstance(s, Integral) and not isinstance(s, bool) for s in shape
        )
        if not ok:  # no coercion: (2, 2.5), (2, nan), '23' are errors, not shapes
            raise IRError(
                f"tensor {self.name!r} has shape {shape!r}; a shape is a tuple of whole numbers"
            )
        object.__setattr__(self, "shape", tuple(int(s) for s in shape))  # numpy ints -> int
        if any(s < 1 or s > MAX_SIZE for s in self.shape):
            raise IRError(
                f"tensor {self.name!r} has shape {self.shape}; every dim must be in [1, 2**48]"
            )
        if isinstance(self.dtype_bytes, bool) or not isinstance(self.dtype_bytes, Integral):
            raise IRError(f"tensor {self.name!r}: dtype_bytes {self.dtype_bytes!r} must be an int")
        if self.dtype_bytes < 1:
            raise IRError(f"tensor {self.name!r}: dtype_bytes {self.dtype_bytes} must be >= 1")
        if not isinstance(self.received, bool):
            raise IRError(f"tensor {self.name!r}: received {self.received!r} must be a bool")

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype_bytes


@dataclass(frozen=True, slots=True)
class Op:
    """One operator: kind (a catalogue key), signature, operand and result tensor names, FLOPs.

    `attrs` is a sorted tuple of (key, value) pairs so the op stays hashable and comparable;
    read it through `attr()`. `layer` groups operators for display (e.g. `h.3.attn`).
    """

    name: str
    kind: str
    signature: Signature
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    flops: float = 0.0
    attrs: tuple[tuple[str, Any], ...] = field(default=())
    layer: str = ""

    def __post_init__(self) -> None:
        if len(self.inputs) != len(self.signature.inputs):
            raise IRError(
                f"op {self.name!r} ({self.kind}): {len(self.inputs)} inputs but the signature "
                f"{self.signature.text()!r} declares {len(self.signature.inputs)}"
            )
        if len(self.outputs) != len(self.signature.outputs):
            raise IRError(
                f"op {self.name!r} ({self.kind}): {len(self.outputs)} outputs but the signature "
                f"declares {len(self.signature.outputs)}"
            )
        object.__setattr__(self, "attrs", tuple(sorted(self.attrs)))

    def attr(self, key: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == key:
                return v
        return default
