"""Einsum-like operator signatures: `"b s (h d), n k -> b s n"`.

Every operand and result is a list of tensor dims; each tensor dim is a group of loop dims in
row-major order (`(h d)` is one tensor dim of extent h*d whose major loop dim is h); `()` is a
size-1 (broadcast) tensor dim. Parsing is linear in the length of the text.

The one layout rule: cutting loop dim d shards tensor dim j of a tensor as a plain block split
exactly when d is the major (first) loop dim of j's group; a cut on a minor loop dim of a group
would need a strided layout, so it is not a valid cut of the operator.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields

from shardplan.errors import SignatureError
from shardplan.ir.dims import DimKind, LoopDim

Group = tuple[str, ...]
_LOOP_DIM_FIELDS = tuple(f.name for f in fields(LoopDim))
TensorDims = tuple[Group, ...]

_TOKEN = re.compile(r"\(|\)|[A-Za-z_][A-Za-z_0-9]*|\S")


def parse_operands(text: str) -> tuple[TensorDims, ...]:
    """Parse a comma-separated list of operands into tensor-dim groups."""
    operands: list[TensorDims] = []
    for part in text.split(","):
        dims: list[Group] = []
        group: list[str] | None = None
        for token in _TOKEN.findall(part):
            if token == "(":
                if group is not None:
                    raise SignatureError(f"nested parentheses in signature operand {part!r}")
                group = []
            elif token == ")":
                if group is None:
                    raise SignatureError(f"unbalanced ')' in signature operand {part!r}")
                dims.append(tuple(group))
                group = None
            elif token.isidentifier():
                if group is None:
                    dims.append((token,))
                else:
                    group.append(token)
            else:
                raise SignatureError(f"unexpected {token!r} in signature operand {part!r}")
        if group is not None:
            raise SignatureError(f"unbalanced '(' in signature operand {part!r}")
        operands.append(tuple(dims))
    return tuple(operands)


@dataclass(frozen=True, slots=True)
class Signature:
    """Loop dims plus, for each operand and result, its tensor dims as groups of loop dims."""

    loop_dims: tuple[LoopDim, ...]
    inputs: tuple[TensorDims, ...]
    outputs: tuple[TensorDims, ...]
    _key: tuple[object, ...] | None = field(default=None, init=False, repr=False, compare=False)
    """The fields as plain values, made on first use: price caches key on signatures (one per
    op, thousands per graph), compared and hashed in C then, not dim by dim in Python."""

    def key(self) -> tuple[object, ...]:
        found = self._key
        if found is None:
            dims = tuple(tuple(getattr(d, f) for f in _LOOP_DIM_FIELDS) for d in self.loop_dims)
            found = (dims, self.inputs, self.outputs)
            object.__setattr__(self, "_key", found)
        return found

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if other.__class__ is not Signature:
            return NotImplemented
        return self.key() == other.key()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self.key())

    def __reduce__(self) -> tuple[object, ...]:
        return (Signature, (self.loop_dims, self.inputs, self.outputs))  # the key made anew

    def __post_init__(self) -> None:
        names = [d.name for d in self.loop_dims]
        if len(set(names)) != len(names):
            raise SignatureError(f"duplicate loop dim names in {names}")
        known = set(names)
        used: set[str] = set()
        for side, operands in (("input", self.inputs), ("output", self.outputs)):
            for i, dims in enumerate(operands):
                seen: set[str] = set()
                for group in dims:
                    for name in group:
                        if name not in known:
                            raise SignatureError(
                                f"{side} {i} uses loop dim {name!r} that is not declared; "
                                f"declared: {names}"
                            )
                        if name in seen:
                            raise SignatureError(f"{side} {i} uses loop dim {name!r} twice")
                        seen.add(name)
                used |= seen
        unused = known - used
        if unused:
            raise SignatureError(f"loop dims {sorted(unused)} index no tensor")
        out_names = [{n for g in dims for n in g} for dims in self.outputs]
        for d in self.loop_dims:
            in_out = [d.name in names_ for names_ in out_names]
            if d.kind is DimKind.REDUCE and any(in_out):
                raise SignatureError(f"REDUCE loop dim {d.name!r} must not index a result")
            if d.kind in (DimKind.PARALLEL, DimKind.WINDOW) and not all(in_out):
                raise SignatureError(
                    f"{d.kind.name} loop dim {d.name!r} must index every result; "
                    "declare it REDUCE or FROZEN"
                )

    @classmethod
    def parse(
        cls,
        spec: str,
        extents: Mapping[str, int],
        kinds: Mapping[str, DimKind] | None = None,
        halos: Mapping[str, int] | None = None,
        reducers: Mapping[str, object] | None = None,
        spans: Mapping[str, int] | None = None,
    ) -> Signature:
        """Build from text like `"m k, n k -> m n"` with extents and non-default kinds.

        Loop dims are ordered by first appearance (results first, then inputs), which is the
        candidate order of the search.
        """
        if spec.count("->") != 1:
            raise SignatureError(f"signature {spec!r} needs exactly one '->'")
        lhs, rhs = spec.split("->")
        inputs = parse_operands(lhs) if lhs.strip() else ()
        outputs = parse_operands(rhs)
        order: list[str] = []
        for operands in (outputs, inputs):
            for dims in operands:
                for group in dims:
                    for name in group:
                        if name not in order:
                            order.append(name)
        kinds = kinds or {}
        halos = halos or {}
        reducers = reducers or {}
        spans = spans or {}
        for name in list(kinds) + list(extents) + list(spans):
            if name not in order:
                raise SignatureError(f"loop dim {name!r} is given but not used in {spec!r}")
        missing = [n for n in order if n not in extents]
        if missing:
            raise SignatureError(f"signature {spec!r}: no extent for loop dims {missing}")
        loop_dims = tuple(
            LoopDim(
                n,
                int(extents[n]),
                kinds.get(n, DimKind.PARALLEL),
                reducers.get(n),  # type: ignore[arg-type]
                int(halos.get(n, 0)),
                int(spans.get(n, 0)),
            )
            for n in order
        )
        return cls(loop_dims, inputs, outputs)

    def loop_dim(self, name: str) -> LoopDim:
        for d in self.loop_dims:
            if d.name == name:
                return d
        raise SignatureError(f"no loop dim {name!r}; have {[d.name for d in self.loop_dims]}")

    @property
    def extents(self) -> dict[str, int]:
        return {d.name: d.extent for d in self.loop_dims}

    def text(self) -> str:
        def fmt(dims: TensorDims) -> str:
            return " ".join(g[0] if len(g) == 1 else "(" + " ".join(g) + ")" for g in dims)

        lhs = ", ".join(fmt(d) for d in self.inputs)
        return f"{lhs} -> {', '.join(fmt(d) for d in self.outputs)}"


def major_positions(dims: TensorDims) -> dict[str, int]:
    """Map each loop dim that is the major loop dim of a group to that tensor dim's position."""
    return {group[0]: position for position, group in enumerate(dims) if group}


def loop_names(dims: TensorDims) -> set[str]:
    return {name for group in dims for name in group}


def group_extent(group: Iterable[str], extents: Mapping[str, int]) -> int:
    size = 1
    for name in group:
        size *= extents[name]
    return size
