"""An imported graph at another batch size from two traces, without tracing again.

The training-step planner asks for the model at each micro-batch size it tries, and one
torch.export + translation of a full-size config costs seconds per size. Two imports of the same
module at batches b1 and b2 that agree in everything but their numbers determine the others: each
integer (tensor dims, integer attributes such as a reshape's target shape) must be the same at
both (it does not depend on the batch) or proportional to the batch (x1 * b2 == x2 * b1, and
x1 * b / b1 a whole number), and so must the whole numbers in the import's notes ("4 group(s) of
8 tokens"); anything else — another structure, a float attribute that moved, an
opaque operator, an offset like b + 1 or a count like ceil(b / 3) that is not proportional —
refuses (None) and the caller traces. The graph at b is then rebuilt through the catalogue
(`op_form`): every op's signature, output shapes and FLOPs are derived again from the scaled
input shapes and attributes, and each derived output shape must equal the scaled one, so a wrong
guess fails here instead of reaching the planner. FLOPs a translation rule set itself (not the
catalogue's) must be constant or proportional too. O(ops + tensors).
"""

from __future__ import annotations

import re
from dataclasses import replace
from fractions import Fraction
from typing import Any

from shardplan.errors import IRError
from shardplan.importers._build import ImportResult
from shardplan.ir.catalogue import op_form
from shardplan.ir.graph import Graph, GraphBuilder
from shardplan.ir.op import Op, Tensor
from shardplan.ir.traits import OPAQUE_KIND


class _Refused(Exception):
    """The two imports do not determine the graph at the new batch."""


def rebatch(
    first: tuple[int, ImportResult], second: tuple[int, ImportResult], batch: int
) -> ImportResult | None:
    """`first` = (b1, its import), `second` = (b2, ...), b1 != b2: the import at `batch`, or None
    when the two do not determine it (module docstring)."""
    (b1, one), (b2, two) = first, second
    if b1 == b2 or one.replicated or two.replicated:
        return None
    if dict(one.approximated) != dict(two.approximated) or len(one.notes) != len(two.notes):
        return None
    scale = _Scale(b1, b2, batch)
    try:
        graph = _graph(one.graph, two.graph, scale)
        notes = tuple(scale.text(a, b) for a, b in zip(one.notes, two.notes, strict=True))
    except (_Refused, IRError):
        return None
    return replace(one, graph=graph, notes=notes)


class _Scale:
    def __init__(self, b1: int, b2: int, batch: int) -> None:
        self.b1, self.b2, self.ratio = b1, b2, Fraction(batch, b1)

    def value(self, x1: Any, x2: Any) -> Any:
        """The value at the new batch of a value seen as x1 at b1 and x2 at b2."""
        if type(x1) is not type(x2):
            raise _Refused
        if isinstance(x1, tuple):
            if len(x1) != len(x2):
                raise _Refused
            return tuple(self.value(a, b) for a, b in zip(x1, x2, strict=True))
        if x1 == x2:
            return x1
        if type(x1) is int and x1 * self.b2 == x2 * self.b1:
            scaled = x1 * self.ratio
            if scaled.denominator == 1:
                return int(scaled)
        raise _Refused

    def text(self, s1: str, s2: str) -> str:
        """A note with its whole numbers scaled like values ("4 group(s) of 8 tokens")."""
        parts1, parts2 = re.split(r"(\d+)", s1), re.split(r"(\d+)", s2)
        if len(parts1) != len(parts2):
            raise _Refused
        out = [
            str(self.value(int(a), int(b))) if i % 2 else self.value(a, b)
            for i, (a, b) in enumerate(zip(parts1, parts2, strict=True))
        ]
        return "".join(out)

    def flops(self, f1: float, f2: float) -> float:
        if f1 == f2:
            return f1
        if abs(f1 * self.b2 - f2 * self.b1) <= 1e-9 * abs(f2 * self.b1):
            return float(f1 * self.ratio)
        raise _Refused


def _graph(one: Graph, two: Graph, scale: _Scale) -> Graph:
    if one.name != two.name or list(one.tensors) != list(two.tensors):
        raise _Refused
    if len(one.ops) != len(two.ops):
        raise _Refused
    b = GraphBuilder(one.name)
    shapes: dict[str, tuple[int, ...]] = {}
    for name, t1 in one.tensors.items():
        t2 = two.tensors[name]
        if (t1.role, t1.dtype_bytes) != (t2.role, t2.dtype_bytes):
            raise _Refused
        shapes[name] = scale.value(t1.shape, t2.shape)
        b.add_tensor(Tensor(name, shapes[name], t1.dtype_bytes, t1.role))  # in the same order
    for op1, op2 in zip(one.ops, two.ops, strict=True):
        b.add_op(_op(one, op1, op2, scale, shapes))
    return b.build()


def _op(
    one: Graph,
    op1: Op,
    op2: Op,
    scale: _Scale,
    shapes: dict[str, tuple[int, ...]],
) -> Op:
    """op1 (of `one`, at b1) and op2 (at b2) as one op at the new batch, whose output shapes
    must be the scaled ones."""
    fixed = ("name", "kind", "inputs", "outputs", "layer")
    if op1.kind == OPAQUE_KIND or any(getattr(op1, f) != getattr(op2, f) for f in fixed):
        raise _Refused
    attrs = scale.value(op1.attrs, op2.attrs)
    form = op_form(op1.kind, [shapes[t] for t in op1.inputs], dict(attrs))
    if tuple(map(tuple, form.output_shapes)) != tuple(shapes[t] for t in op1.outputs):
        raise _Refused  # the catalogue disagrees with the proportional guess
    # FLOPs a translation rule set itself (a gather costs one copy) must scale; the catalogue's
    # are derived again
    derived = op_form(op1.kind, [one.tensors[t].shape for t in op1.inputs], dict(op1.attrs))
    flops = scale.flops(op1.flops, op2.flops) if op1.flops != derived.flops else form.flops
    return Op(op1.name, op1.kind, form.signature, op1.inputs, op1.outputs, flops, attrs, op1.layer)
