"""Reading compiled HLO text: the collectives XLA inserted (`parse_collectives`) and the arrays
of an HLO shape with their bytes (`hlo_arrays`).

Understands what XLA's SPMD partitioner writes: replica groups as explicit lists, iota tiles and
mesh axes (with or without a `device_ids` permutation), tuple (combined) collectives, and async
`-start` / `-done` pairs. Pure text processing: no jax import.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from shardplan.cost.collectives import CollectiveKind as Kind

_DTYPE_BYTES = {
    "pred": 1,
    "s2": 1,
    "u2": 1,
    "s4": 1,
    "u4": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "s32": 4,
    "u32": 4,
    "s64": 8,
    "u64": 8,
    "f16": 2,
    "bf16": 2,
    "f32": 4,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "f8e4m3": 1,
    "f8e4m3b11fnuz": 1,
    "f8e4m3fnuz": 1,
    "f8e5m2fnuz": 1,
    "f8e3m4": 1,
    "f4e2m1fn": 1,
    "f8e8m0fnu": 1,
    "token": 0,
}

_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.+?)\s+"
    rf"(?P<kind>{'|'.join(map(re.escape, Kind))})"
    r"(?P<suffix>-start|-done)?\("
)
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\]")
_EXPLICIT_GROUPS = re.compile(r"replica_groups=\{(\{[\d,\s]*\}(?:\s*,\s*\{[\d,\s]*\})*)?\}")
_IOTA_GROUPS = re.compile(r"replica_groups=\[([\d,\s]+)\]<=\[")
# `device_ids=(...)` (a device permutation) may sit between the mesh and the axes
_MESH_GROUPS = re.compile(
    r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=[^{]*?)?\s*\{([^}]*)\}"
)
_PAIRS = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_NUM_PARTITIONS = re.compile(r"num_partitions=(\d+)")
_NUM_REPLICAS = re.compile(r"replica_count=(\d+)")


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective of compiled HLO.

    Attributes:
        kind: all-reduce | all-gather | reduce-scatter | all-to-all | collective-permute.
        bytes_per_device: size of the result buffer on one device (tuple results: summed).
        group_size: devices per replica group; for collective-permute, the number of devices
            that send to another device.
        op_name: the `op_name` metadata (contains the shardplan op name scope), or "".
        instruction: the HLO instruction name, e.g. `all-reduce.3`.
    """

    kind: Kind
    bytes_per_device: int
    group_size: int
    op_name: str = ""
    instruction: str = ""


def hlo_arrays(
    shape_text: str, element_bytes: Mapping[str, int] | None = None
) -> list[tuple[str, int]]:
    """[(`f32[8,16]`, bytes), ...] of the arrays in an HLO shape (a tuple gives several).

    `element_bytes` overrides the width of HLO element types, e.g. `{"f64": 4}` counts a float64
    program's buffers at the float32 width of the plan it verifies.
    """
    widths = {**_DTYPE_BYTES, **(element_bytes or {})}
    out = []
    for dtype, dims in _ARRAY.findall(shape_text):
        if dtype not in widths:
            continue
        n = 1
        for d in dims.split(","):
            d = d.strip().lstrip("<=")
            if d:
                n *= int(d)
        out.append((f"{dtype}[{dims}]", n * widths[dtype]))
    return out


def _group_size(line: str, kind: str, devices: int) -> int:
    if kind == Kind.COLLECTIVE_PERMUTE:
        m = _PAIRS.search(line)
        if not m:
            return 0
        pairs = re.findall(r"\{(\d+),(\d+)\}", m.group(1))
        return len({int(s) for s, t in pairs if s != t})
    m = _IOTA_GROUPS.search(line)
    if m:
        return int(m.group(1).split(",")[-1])
    m = _MESH_GROUPS.search(line)
    if m:
        sizes = {k: int(v) for k, v in re.findall(r"'([^']*)'\s*=\s*(\d+)", m.group(1))}
        size = 1
        for token in re.findall(r"'[^']*'(?::\(\d+\)\d+)?", m.group(2)):
            sub = re.fullmatch(r"'([^']*)':\(\d+\)(\d+)", token)
            size *= int(sub.group(2)) if sub else sizes.get(token.strip("'"), 1)
        return size
    m = _EXPLICIT_GROUPS.search(line)
    if m:
        if not m.group(1):
            return devices  # `replica_groups={}`: one group of every device
        first = re.search(r"\{([\d,\s]*)\}", m.group(1))
        return len([d for d in first.group(1).split(",") if d.strip()]) if first else devices
    return devices


def parse_collectives(
    hlo_text: str, element_bytes: Mapping[str, int] | None = None
) -> list[Collective]:
    """Every collective instruction of (compiled) HLO text, in text order.

    Understands replica groups written explicitly (`{{0,1},{2,3}}`), as iota tiles
    (`[2,4]<=[8]`, `[4,2]<=[2,4]T(1,0)`) and as mesh axes (`mesh['a'=2,'b'=4] {'b'}`); an empty
    group list means all devices (num_partitions x replica_count of the module). Async pairs
    count once, at `-start` (for all-gather / collective-permute starts, whose result is an
    (operand, result) tuple, the last tuple element is the result buffer). `element_bytes`: see
    `hlo_arrays`.
    """
    m = _NUM_PARTITIONS.search(hlo_text)
    r = _NUM_REPLICAS.search(hlo_text)
    devices = (int(m.group(1)) if m else 1) * (int(r.group(1)) if r else 1)
    found: list[Collective] = []
    for line in hlo_text.splitlines():
        inst = _INSTRUCTION.match(line)
        if not inst or inst.group("suffix") == "-done":
            continue
        kind = Kind(inst.group("kind"))
        shape = inst.group("shape")
        if inst.group("suffix") == "-start" and kind in (Kind.ALL_GATHER, Kind.COLLECTIVE_PERMUTE):
            parts = _ARRAY.findall(shape)
            if shape.lstrip().startswith("(") and len(parts) >= 2:
                dtype, dims = parts[-1]
                shape = f"{dtype}[{dims}]"
        name = _OP_NAME.search(line)
        nbytes = sum(b for _, b in hlo_arrays(shape, element_bytes))
        found.append(
            Collective(
                kind,
                nbytes,
                _group_size(line, kind, devices),
                name.group(1) if name else "",
                inst.group("name"),
            )
        )
    return found


def collective_summary(collectives: list[Collective]) -> dict[str, tuple[int, int]]:
    """kind -> (count, total bytes per device)."""
    out: dict[str, tuple[int, int]] = {}
    for c in collectives:
        count, total = out.get(c.kind, (0, 0))
        out[c.kind] = (count + 1, total + c.bytes_per_device)
    return out


__all__ = [
    "Collective",
    "collective_summary",
    "hlo_arrays",
    "parse_collectives",
]
