"""The model at another batch size, derived from two builds instead of built again.

A model builder's graphs at batch sizes a and b usually differ only in numbers that grow with
the batch: tensor dims, loop-dim extents, FLOPs and size attributes (a reshape's target) that are
proportional to it (value_a * b == value_b * a), everything else equal. `batch_scaling` compares
the two graphs value by value (every field of every tensor and op, structure, names) and records
which numbers are proportional; `BatchScaling.at(n)` then gives the graph at batch n by scaling
those numbers and rebuilding only the values that hold them, with the indexes (producers,
consumers, gradients) of the source graph, which do not depend on sizes. Anything else that
differs — a dim neither equal nor proportional (FLOPs quadratic in the batch, a size clamped at
a bound), another op list, another name — gives None: the caller builds. A number that must stay
whole and would not at n, or would become 1 (the catalogue writes size-1 dims as broadcasts, a
different signature), also gives None. Two builds cannot rule out a builder whose sizes change
course at a third batch, so the training search checks one derived graph against a real build
before trusting the rest (`search.step.sizes.ModelSizes`); imports, where a third trace costs
seconds, derive every op again through the catalogue instead (`BatchScaling.through_catalogue`).
O(ops + tensors) to learn and per derived graph, without the builder's catalogue calls,
topological sort and verification.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from shardplan.checks import MAX_SIZE
from shardplan.errors import ShardplanError
from shardplan.ir.catalogue import op_form
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Tensor
from shardplan.ir.traits import OPAQUE_KIND
from shardplan.ir.verify import verify


class _Mismatch(Exception):
    """The two builds differ other than proportionally to the batch."""


@dataclass(frozen=True, slots=True)
class _Scaled:
    """A number proportional to the batch: its value at the source batch."""

    value: int | float


@dataclass(frozen=True, slots=True)
class _Items:
    """A tuple some of whose items scale: (position, rule) per such item."""

    changed: tuple[tuple[int, Any], ...]


@dataclass(frozen=True, slots=True)
class _Fields:
    """A dataclass value some of whose fields scale: (field name, rule) per such field."""

    changed: tuple[tuple[str, Any], ...]


_SAME = None  # the rule of a value equal in both builds: kept as it is


def _differ(x: Any, y: Any, a: int, b: int) -> Any:
    """The rule taking `x` (at batch a) to `y` (at batch b), x != y (each pair of values is
    compared once); _Mismatch when there is none."""
    kind = type(x)
    if kind is not type(y) or kind is bool:
        raise _Mismatch
    if kind is int:
        if x * b == y * a:
            return _Scaled(x)
        raise _Mismatch
    if kind is float:
        if math.isclose(x * b, y * a, rel_tol=1e-12):
            return _Scaled(x)
        raise _Mismatch
    if kind is tuple:
        if len(x) != len(y):
            raise _Mismatch
        pairs = enumerate(zip(x, y, strict=True))
        return _Items(tuple((i, _differ(p, q, a, b)) for i, (p, q) in pairs if p != q))
    names = getattr(kind, "__dataclass_fields__", None)
    if names is None:
        raise _Mismatch  # str, enum, None or another type: only equal values are allowed
    changed = []
    for name in names:
        p, q = getattr(x, name), getattr(y, name)
        if p != q:
            changed.append((name, _differ(p, q, a, b)))
    return _Fields(tuple(changed))


class _NotDerived(Exception):
    """A whole number that would not stay whole at the derived batch, or would become 1 (the
    catalogue writes size-1 dims as broadcasts: another signature, so the builder must say)."""


def _apply(
    rule: Any, base: Any, n: int, a: int, one: bool = False, memo: dict | None = None
) -> Any:
    """`base` (at batch a) at batch n by `rule`; `one`: a number may become 1 (the catalogue
    derives the op again, `BatchScaling.through_catalogue`); `memo`: the values derived so far
    by (rule, value), so a field equal in many ops (the signature of a repeated layer's op) is
    derived once."""
    if rule is _SAME:
        return base
    if isinstance(rule, _Scaled):
        if isinstance(rule.value, int):
            v = rule.value * n
            if v % a or (v == a and not one) or v > MAX_SIZE * a:
                raise _NotDerived
            return v // a
        return rule.value * n / a
    if isinstance(rule, _Items):
        items = list(base)
        for i, r in rule.changed:
            items[i] = _apply(r, base[i], n, a, one)
        return tuple(items)
    if memo is None:
        changes = {name: _apply(r, getattr(base, name), n, a, one) for name, r in rule.changed}
        return _rebuilt(base, changes)
    changes = {}
    for name, r in rule.changed:
        value = getattr(base, name)
        if type(r) is _Scaled:  # a number: no cheaper to look up than to scale
            changes[name] = _apply(r, value, n, a, one)
            continue
        try:
            found = memo.get((r, value))
        except TypeError:  # a value that does not hash (an attribute holding a list): derived
            changes[name] = _apply(r, value, n, a, one, memo)
            continue
        if found is None:
            found = memo[r, value] = _apply(r, value, n, a, one, memo)
        changes[name] = found
    return _rebuilt(base, changes)


def scaled_number(x: int, a: int, y: int, b: int, n: int) -> int | None:
    """A whole number seen as x at batch a and y at batch b, at batch n: x when x == y, x n / a
    when proportional and whole, else None."""
    try:
        return _apply(_SAME if x == y else _differ(x, y, a, b), x, n, a, one=True)
    except (_Mismatch, _NotDerived):
        return None


def _rebuilt(base: Any, changes: dict[str, Any]) -> Any:
    """`base` with `changes`, without re-running its checks: the source passed them, and a
    scaled number stays whole, >= 2 and <= MAX_SIZE (`_apply`), so the copy passes them too."""
    out = object.__new__(type(base))
    for name in base.__dataclass_fields__:
        object.__setattr__(out, name, changes[name] if name in changes else getattr(base, name))
    return out


@dataclass(frozen=True, slots=True)
class BatchScaling:
    """How `source` (the model at batch `batch`) changes with the batch: per tensor and per op
    that changes, its rule (module docstring)."""

    source: Graph
    batch: int
    tensors: tuple[tuple[str, Any], ...]
    ops: tuple[tuple[int, Any], ...]

    def at(self, n: int) -> Graph | None:
        """The model at batch `n`; None when a whole number would not stay whole or would
        become 1 (`_NotDerived`)."""
        if n == self.batch:
            return self.source
        g, a = self.source, self.batch
        memo: dict[tuple[Any, Any], Any] = {}  # equal fields of many ops derive once
        try:
            tensors = dict(g.tensors)
            for name, rule in self.tensors:
                tensors[name] = _apply(rule, tensors[name], n, a, memo=memo)
            ops = list(g.ops)
            for i, rule in self.ops:
                ops[i] = _apply(rule, ops[i], n, a, memo=memo)
        except _NotDerived:
            return None
        return self._graph(tensors, ops)

    def through_catalogue(self, n: int) -> Graph | None:
        """The model at batch `n` with every op derived again by the catalogue (`op_form`) from
        its scaled input shapes and attributes, its outputs checked against the scaled shapes:
        a wrong proportional guess is refused here rather than by a third build, and size-1
        dims get the catalogue's signatures. FLOPs are the catalogue's where the source's were,
        else scaled. None when refused (an opaque op, a number not whole at n, the catalogue
        disagreeing). For graphs no third build can check (imports: a trace costs seconds)."""
        g, a = self.source, self.batch
        if any(op.kind == OPAQUE_KIND for op in g.ops):
            return None
        rules = dict(self.ops)
        try:
            tensors = dict(g.tensors)
            for name, rule in self.tensors:
                tensors[name] = _apply(rule, tensors[name], n, a, one=True)
            ops = [self._derived_op(op, rules.get(i), tensors, n) for i, op in enumerate(g.ops)]
        except (_NotDerived, ShardplanError):
            return None
        graph = self._graph(tensors, ops)
        verify(graph)
        return graph

    def _derived_op(self, op: Op, rule: Any, tensors: dict[str, Tensor], n: int) -> Op:
        if rule is None:
            return op
        scaled = _apply(rule, op, n, self.batch, one=True)
        form = op_form(op.kind, [tensors[t].shape for t in op.inputs], dict(scaled.attrs))
        if tuple(map(tuple, form.output_shapes)) != tuple(tensors[t].shape for t in op.outputs):
            raise _NotDerived  # the catalogue disagrees with the proportional guess
        source = self.source
        own = op_form(op.kind, [source.tensors[t].shape for t in op.inputs], dict(op.attrs))
        flops = form.flops if own.flops == op.flops else scaled.flops  # a rule's own FLOPs
        return _rebuilt(scaled, {"signature": form.signature, "flops": flops})

    def _graph(self, tensors: dict[str, Tensor], ops: list[Op]) -> Graph:
        g = self.source  # the same names, order and roles: the same indexes
        return Graph(
            name=g.name,
            tensors=MappingProxyType(tensors),
            ops=tuple(ops),
            producer=g.producer,
            consumers=g.consumers,
            op_index=g.op_index,
            requires_grad=g.requires_grad,
        )


def batch_scaling(first: Graph, a: int, second: Graph, b: int) -> BatchScaling | None:
    """The rules taking `first` (the model at batch a) to `second` (at batch b), or None when
    they differ other than proportionally to the batch (module docstring)."""
    if a == b or first.name != second.name or len(first.ops) != len(second.ops):
        return None
    if list(first.tensors) != list(second.tensors) or first.op_index != second.op_index:
        return None
    if first.producer != second.producer or first.consumers != second.consumers:
        return None
    if first.requires_grad != second.requires_grad:
        return None
    try:
        tensors = tuple(
            (name, _differ(t, second.tensors[name], a, b))
            for name, t in first.tensors.items()
            if t != second.tensors[name]
        )
        pairs = enumerate(zip(first.ops, second.ops, strict=True))
        ops = tuple((i, _differ(x, y, a, b)) for i, (x, y) in pairs if x != y)
    except _Mismatch:
        return None
    return BatchScaling(first, a, tensors, ops)


__all__ = ["BatchScaling", "batch_scaling", "scaled_number"]
