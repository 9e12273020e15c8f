"""Measured collectives of compiled HLO for `shardplan.fidelity.verify`: the "bytes one device
sends" convention (`sent_bytes`), parsing collectives out of HLO text (`measure`), the largest
array each operator computes (`computed_sizes`) and small HLO shape helpers.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from shardplan.cost.collectives import CollectiveKind as Kind
from shardplan.errors import BackendError
from shardplan.fidelity.hlo import hlo_arrays, parse_collectives
from shardplan.ir.graph import Graph
from shardplan.ir.op import Role


def sent_bytes(kind: str, buffer_bytes: float, group_size: int) -> float:
    """Bytes one device sends for one collective (ring algorithms), from its HLO buffer size."""
    g = max(int(group_size), 1)
    if kind == Kind.ALL_REDUCE:
        return 2.0 * (g - 1) / g * buffer_bytes
    if kind in (Kind.ALL_GATHER, Kind.ALL_TO_ALL):
        return (g - 1) / g * buffer_bytes
    if kind == Kind.REDUCE_SCATTER:
        return (g - 1) * float(buffer_bytes)
    if kind == Kind.COLLECTIVE_PERMUTE:
        return float(buffer_bytes)
    raise BackendError(f"unknown collective kind {kind!r}; expected one of {tuple(map(str, Kind))}")


# -- measured collectives ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MeasuredCollective:
    """One collective of the compiled program (one element of a combined tuple collective).

    Attributes:
        kind: all-reduce | all-gather | reduce-scatter | all-to-all | collective-permute.
        sent_bytes: bytes one device sends (see the module docstring).
        buffer_bytes: the HLO buffer size B the formula starts from.
        group_size: devices per replica group (collective-permute: sending devices).
        ops: shardplan operators named in the `op_name` metadata (first = innermost scope).
        backward: the metadata says it belongs to the backward pass (`transpose(...)`).
        op_name: the metadata op_name.
        instruction: the HLO instruction (`all-reduce.3`, or `all-reduce.3[2]` for element 2).
        shape: the element's HLO shape, e.g. `f32[8,16]`.
    """

    kind: Kind
    sent_bytes: float
    buffer_bytes: int
    group_size: int
    ops: tuple[str, ...]
    backward: bool
    op_name: str
    instruction: str
    shape: str

    @property
    def op(self) -> str:
        return self.ops[0] if self.ops else ""


_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\]")
_DEFINITION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][\w\-]*)\((.*)$")
_GTE = re.compile(r"get-tuple-element\(%?([\w.\-]+)\),\s*index=(\d+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TUPLE_COLLECTIVES = frozenset({Kind.ALL_REDUCE, Kind.REDUCE_SCATTER, Kind.ALL_TO_ALL})


class _OpNames:
    """Finds the shardplan operators an HLO `op_name` names (scopes are operator names)."""

    def __init__(self, graph: Graph) -> None:
        self.names = set(graph.op_index)
        self._cache: dict[str, tuple[str, ...]] = {}

    def __call__(self, op_name: str) -> tuple[str, ...]:
        hit = self._cache.get(op_name)
        if hit is None:
            found = [t for t in re.split(r"[/():]", op_name) if t in self.names]
            if not found and "/" in "".join(self.names):  # operator names that contain '/'
                found = [n for n in self.names if n in op_name]
            hit = tuple(dict.fromkeys(found))
            self._cache[op_name] = hit
        return hit


def measure(
    hlo_text: str, graph: Graph, element_bytes: Mapping[str, int] | None = None
) -> list[MeasuredCollective]:
    """Every collective of compiled HLO, one entry per element of combined (tuple) collectives,
    in the "bytes one device sends" convention and attributed to shardplan operators.

    `element_bytes` overrides the width of HLO element types (`{"f64": 4}`: a program computed in
    float64 to verify a float32 plan is measured at the plan's 4 bytes per element).
    """
    collectives = parse_collectives(hlo_text, element_bytes)
    wanted = {c.instruction for c in collectives}
    shapes: dict[str, str] = {}
    operands: dict[str, list[str]] = {}
    names_of: dict[str, str] = {}
    elements: dict[str, dict[int, str]] = defaultdict(dict)
    for line in hlo_text.splitlines():
        m = _DEFINITION.match(line)
        if not m:
            continue
        name, shape, opcode, rest = m.groups()
        op_name = _OP_NAME.search(line)
        if op_name:
            names_of[name] = op_name.group(1)
        if name in wanted:
            shapes[name] = shape
            operands[name] = re.findall(r"%([\w.\-]+)", rest.split("),")[0])
        if opcode == "get-tuple-element" and op_name:
            g = _GTE.search(line)
            if g and g.group(1) in wanted:
                elements[g.group(1)][int(g.group(2))] = op_name.group(1)
    find = _OpNames(graph)
    out: list[MeasuredCollective] = []
    for c in collectives:
        arrays = hlo_arrays(shapes.get(c.instruction, ""), element_bytes)
        if c.kind in _TUPLE_COLLECTIVES and len(arrays) > 1:
            parts = []
            for i, (shape, nbytes) in enumerate(arrays):
                args = operands.get(c.instruction, [])
                name = (
                    elements[c.instruction].get(i)
                    or (names_of.get(args[i], "") if i < len(args) else "")
                    or c.op_name
                )
                parts.append((f"{c.instruction}[{i}]", shape, nbytes, name))
        else:
            shape = arrays[-1][0] if arrays else ""
            parts = [(c.instruction, shape, c.bytes_per_device, c.op_name)]
        for instruction, shape, nbytes, name in parts:
            ops = find(name)
            out.append(
                MeasuredCollective(
                    c.kind,
                    sent_bytes(c.kind, nbytes, c.group_size),
                    int(nbytes),
                    c.group_size,
                    ops,
                    _is_backward(name, ops),
                    name,
                    instruction,
                    shape,
                )
            )
    return out


HLO_FLOAT_TYPES = {"float64": "f64", "float32": "f32"}
"""Compute dtype of a JAX program -> the HLO element type of its float buffers."""


def plan_float_bytes(graph: Graph) -> int:
    """The float width the cost model prices `graph` at: the most common `dtype_bytes` of its
    parameters (of its activations when it has none; 4 when it has neither)."""
    widths = [t.dtype_bytes for t in graph.parameters] or [
        t.dtype_bytes for t in graph.tensors.values() if t.role is Role.ACTIVATION
    ]
    return max(sorted(set(widths)), key=widths.count) if widths else 4


def comm_dtype(graph: Graph) -> str:
    """The dtype whose compiled program is measured against the prediction: float64 for a plan
    priced at 8 bytes an element, float32 otherwise (the JAX backend has no narrower kernels)."""
    return "float64" if plan_float_bytes(graph) == 8 else "float32"


def plan_element_bytes(graph: Graph, dtype: str) -> dict[str, int]:
    """HLO element widths that count a program computed in `dtype` at the plan's widths: its
    float buffers at `plan_float_bytes` (a float32 program measuring a bfloat16 plan: 2 bytes an
    element, not 4); integer buffers keep their HLO width."""
    return {HLO_FLOAT_TYPES[dtype]: plan_float_bytes(graph)}


def computed_sizes(hlo_text: str, graph: Graph) -> dict[str, int]:
    """Per operator, the largest array (elements per device) its forward instructions produce.

    Compiled SPMD HLO has per-device shapes, so an operator whose forward instructions produce
    its output's global size was computed whole (replicated) by XLA, whatever the plan says.
    """
    find = _OpNames(graph)
    sizes: dict[str, int] = defaultdict(int)
    for line in hlo_text.splitlines():
        m = _DEFINITION.match(line)
        name = _OP_NAME.search(line) if m else None
        if not m or not name or "transpose(" in name.group(1):
            continue
        ops = find(name.group(1))
        if not ops:
            continue
        arrays = hlo_arrays(m.group(2))
        if arrays:
            biggest = max(_numel(_dims(a)[1]) for a, _ in arrays)
            sizes[ops[0]] = max(sizes[ops[0]], biggest)
    return dict(sizes)


def _is_backward(op_name: str, ops: Sequence[str]) -> bool:
    if not ops:
        return "transpose(" in op_name
    at = op_name.find(ops[0])
    return "transpose(" in op_name[:at] if at >= 0 else "transpose(" in op_name


def _dims(shape: str) -> tuple[str, tuple[int, ...]]:
    m = _ARRAY.search(shape)
    if not m:
        return "", ()
    return m.group(1), tuple(int(d) for d in m.group(2).split(",") if d.strip())


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n
