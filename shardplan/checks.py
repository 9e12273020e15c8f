"""Argument checks shared by every public entry point (`plan()`, the zoo, `Mesh`, plan files, CLI).

Each check is a pure function: it returns the value in canonical form or raises a typed error from
`shardplan.errors` that names the argument and says what to do. Nothing is coerced silently: a
bool is not a size, `2.5` is not a device count, `'16'` is not a tuple of axes, NaN and infinity
are never accepted. Every check is O(size of the value).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from numbers import Integral
from typing import Any

from shardplan.errors import ArgumentError, MeshError

MAX_DEVICES = 1 << 20
"""Largest mesh (devices in all) shardplan plans for; also bounds the prime factorisation."""
MAX_SIZE = 1 << 48
"""Largest size of one tensor dim or model size: beyond it float costs lose integer precision."""


def positive_int(value: Any, argument: str, what_to_do: str = "") -> int:
    """`value` as an int >= 1; bools, floats, strings, NaN are refused (no coercion)."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ArgumentError(
            f"{argument} must be a whole number >= 1, got {value!r} "
            f"({type(value).__name__}){'; ' + what_to_do if what_to_do else ''}"
        )
    if value < 1 or value > MAX_SIZE:
        raise ArgumentError(
            f"{argument} must be between 1 and 2**48, got {value}"
            f"{'; ' + what_to_do if what_to_do else ''}"
        )
    return int(value)


def finite_number(value: Any, argument: str, minimum: float = 0.0, strict: bool = True) -> float:
    """`value` as a finite float > `minimum` (>= when not `strict`); bools and strings refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ArgumentError(f"{argument} must be a number, got {value!r} ({type(value).__name__})")
    try:
        x = float(value)
    except OverflowError:  # an int beyond the float range (10**400)
        x = math.inf
    if not math.isfinite(x):
        raise ArgumentError(f"{argument} must be a finite number, got {value!r}")
    if x < minimum or (strict and x == minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise ArgumentError(f"{argument} must be {bound}, got {value!r}")
    return x


def boolean(value: Any, argument: str) -> bool:
    if not isinstance(value, bool):
        raise ArgumentError(f"{argument} must be True or False, got {value!r}")
    return value


def choice(value: Any, argument: str, options: Sequence[str]) -> str:
    if not isinstance(value, str) or value not in options:
        raise ArgumentError(f"{argument} must be one of {list(options)}, got {value!r}")
    return value


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMGT]i?B?|B)\s*$", re.I)
_SCALE = {"B": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}


def memory_bytes(value: Any, argument: str = "memory size") -> float:
    """A per-device budget: bytes as a positive finite number, or text with a unit ("80GB",
    "16GiB", "512MB", "4096B"). Text without a unit is refused: '40' is more likely 40 GB
    than 40 bytes, so the user must say which."""
    if isinstance(value, str):
        m = _SIZE.match(value)
        if not m:
            if re.match(r"^\s*[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?\s*$", value):
                raise MeshError(
                    f"{argument} {value!r} has no unit; write e.g. '{value.strip()}GB' "
                    f"(or '{value.strip()}B' for bytes)"
                )
            raise MeshError(f"cannot parse {argument} {value!r}; write e.g. '80GB' or '16GiB'")
        unit = m.group(2).upper().rstrip("B") or "B"
        scale = 2.0 ** (10 * " KMGT".index(unit[0])) if unit.endswith("I") else _SCALE[unit]
        number = float(m.group(1)) * scale
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise MeshError(
            f"{argument} must be bytes (a number) or text like '80GB', got {value!r} "
            f"({type(value).__name__})"
        )
    else:
        try:
            number = float(value)
        except OverflowError:  # an int beyond the float range (10**400): no finite size
            number = math.inf
    if not math.isfinite(number) or number <= 0:
        raise MeshError(f"{argument} must be a positive, finite size, got {value!r}")
    return number


def mesh_shape(shape: Any, argument: str = "mesh shape") -> tuple[int, ...]:
    """A tuple of axis sizes, each an int >= 1, at most MAX_DEVICES devices in all."""
    if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
        raise MeshError(
            f"{argument} must be a tuple of axis sizes like (2, 8), got {shape!r}; "
            "use parse_mesh('2x8') for text"
        )
    if not shape:
        raise MeshError("a mesh needs at least one axis, e.g. '8' or '2x8'")
    out = []
    for s in shape:
        if isinstance(s, bool) or not isinstance(s, Integral):
            raise MeshError(f"{argument} {tuple(shape)!r}: axis size {s!r} is not a whole number")
        if s < 1:
            raise MeshError(f"mesh axis sizes must be >= 1, got {tuple(shape)}")
        out.append(int(s))
    if math.prod(out) > MAX_DEVICES:
        raise MeshError(
            f"mesh {tuple(out)} has {math.prod(out):,} devices, more than the {MAX_DEVICES:,} "
            "shardplan plans for; plan on fewer devices"
        )
    return tuple(out)


def model_sizes(
    model: str, sizes: Mapping[str, Any], defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """Zoo size overrides: each a whole number >= 1 or a tuple of them (e.g. `deep=(32, 16)`);
    a size whose default is a float (e.g. `capacity_factor`) a positive finite number; one whose
    default is 0 may also be 0; a bool or str option (`qk_norm`, `router`) of the same type."""
    out: dict[str, Any] = {}
    for key, value in sizes.items():
        where = f"model {model!r} size {key}"
        if key == "name":
            if not isinstance(value, str) or not value:
                raise ArgumentError(f"model {model!r}: name must be a non-empty string")
            out[key] = value
        elif isinstance(defaults.get(key), (bool, str)):  # a switch (qk_norm) or a choice (router)
            if type(value) is not type(defaults[key]):
                raise ArgumentError(
                    f"{where} must be a {type(defaults[key]).__name__}, got {value!r}"
                )
            out[key] = value
        elif defaults.get(key) == 0 and value == 0 and not isinstance(value, bool):
            out[key] = 0  # a size whose default 0 means "none" (dense_layers, shared experts)
        elif isinstance(defaults.get(key), float):
            out[key] = finite_number(value, where)
        elif isinstance(defaults.get(key), tuple):  # a list of sizes, e.g. deep=(32, 16)
            if not isinstance(value, (tuple, list)) or not value:
                raise ArgumentError(f"{where} must be a non-empty tuple of sizes, got {value!r}")
            out[key] = tuple(positive_int(v, where) for v in value)
        else:
            out[key] = positive_int(value, where)
    return out
