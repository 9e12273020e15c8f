"""Loop dims and their kinds: the vocabulary an operator uses to declare its meaning as data.

A loop dim is a named index of an operator's iteration space. Its kind says what cutting it means:
PARALLEL indexes every result (a free split), REDUCE indexes inputs only (cutting it leaves
partial results to be combined with the reducer), WINDOW is a conv/pool spatial index (cutting it
needs a halo exchange of `halo` rows per boundary), FROZEN is never cut (softmax axis, kernel taps).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from shardplan.errors import SignatureError


class DimKind(enum.Enum):
    PARALLEL = "parallel"
    REDUCE = "reduce"
    WINDOW = "window"
    FROZEN = "frozen"

    __hash__ = object.__hash__  # members are singletons: a C-level hash keeps cost keys cheap


class Reducer(enum.Enum):
    SUM = "sum"
    MAX = "max"
    MIN = "min"

    __hash__ = object.__hash__  # members are singletons: a C-level hash keeps cost keys cheap


@dataclass(frozen=True, slots=True)
class LoopDim:
    """One index of an operator's iteration space.

    Attributes:
        name: unique within its operator (`b`, `m`, `k`, ...).
        extent: number of iterations, >= 1.
        kind: what cutting it means (see DimKind).
        reducer: for REDUCE dims, how partial results combine.
        halo: for WINDOW dims, rows each part needs from its neighbour when cut.
        span: for WINDOW dims, the size of the input tensor dim the window grid reads (a conv
            input is larger than its output grid); a cut must divide it as well (0: the extent).
    """

    name: str
    extent: int
    kind: DimKind = DimKind.PARALLEL
    reducer: Reducer | None = None
    halo: int = 0
    span: int = 0

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise SignatureError(f"loop dim name {self.name!r} must be an identifier")
        if self.extent < 1:
            raise SignatureError(f"loop dim {self.name!r} has extent {self.extent}; must be >= 1")
        if self.kind is DimKind.REDUCE and self.reducer is None:
            object.__setattr__(self, "reducer", Reducer.SUM)
        if self.kind is not DimKind.REDUCE and self.reducer is not None:
            raise SignatureError(f"loop dim {self.name!r}: a reducer needs kind REDUCE")
        if self.halo < 0:
            raise SignatureError(f"loop dim {self.name!r}: halo {self.halo} must be >= 0")
        if self.span < 0 or (self.span and self.kind is not DimKind.WINDOW):
            raise SignatureError(
                f"loop dim {self.name!r}: span {self.span} is only for WINDOW dims (>= 1)"
            )

    @property
    def splittable(self) -> bool:
        return self.kind is not DimKind.FROZEN
