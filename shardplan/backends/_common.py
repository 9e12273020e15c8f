"""Helpers both executors (JAX and torch) share: attribute pairs and einsum letter specs."""

from __future__ import annotations

import string
from typing import Any

from shardplan.errors import UnsupportedOpError


def pair(value: Any) -> tuple[int, int]:
    """An int or a 2-sequence attribute (stride, padding, kernel) as (y, x)."""
    if isinstance(value, int):
        return value, value
    a, b = value
    return int(a), int(b)


def einsum_letters(spec: str) -> str:
    """`"b s e c, b s m -> e c m"` -> `"bsec,bsm->ecm"`: multi-letter loop names become letters."""
    from shardplan.ir.signature import parse_operands

    lhs, rhs = spec.split("->")
    sides = [parse_operands(lhs), parse_operands(rhs)]
    letters: dict[str, str] = {}
    for operands in sides:
        for dims in operands:
            for group in dims:
                if len(group) != 1:
                    raise UnsupportedOpError(
                        f"einsum spec {spec!r}: grouped dims {group} are not supported"
                    )
                if group[0] not in letters:
                    if len(letters) >= len(string.ascii_letters):
                        raise UnsupportedOpError(f"einsum spec {spec!r} has too many loop dims")
                    letters[group[0]] = string.ascii_letters[len(letters)]

    def side(operands: Any) -> str:
        return ",".join("".join(letters[g[0]] for g in dims) for dims in operands)

    return f"{side(sides[0])}->{side(sides[1])}"
