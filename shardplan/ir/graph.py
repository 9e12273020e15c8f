"""The graph: tensors and operators, immutable once built, topologically ordered.

`GraphBuilder` collects tensors and ops (either fully formed `Op`s or `apply(kind, ...)` that asks
the catalogue for the signature and result shapes), then `build()` orders the ops topologically
(Kahn's algorithm with a heap on insertion order, so the order is deterministic; O(|V| log |V| +
|E|)), builds producer/consumer indexes and runs `verify`. Nothing in it is quadratic.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from shardplan.errors import CycleError, IRError, ShardplanError
from shardplan.ir.catalogue import op_form
from shardplan.ir.op import Op, Role, Tensor


@dataclass(frozen=True, slots=True)
class Graph:
    """Immutable computational graph. Build it with `GraphBuilder`.

    Attributes:
        name: model name.
        tensors: every tensor by name.
        ops: operators in topological order.
        producer: tensor name -> index of the op that produces it.
        consumers: tensor name -> ((op index, operand position), ...) in op order.
        requires_grad: activations and parameters whose gradient training computes.
    """

    name: str
    tensors: Mapping[str, Tensor]
    ops: tuple[Op, ...]
    producer: Mapping[str, int]
    consumers: Mapping[str, tuple[tuple[int, int], ...]]
    op_index: Mapping[str, int]
    requires_grad: frozenset[str]

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickled with its indexes as plain dicts (a read-only mapping does not pickle) and
        read-only again when loaded, so a graph crosses to a worker process unchanged."""
        maps = (self.tensors, self.producer, self.consumers, self.op_index)
        return (_loaded, (self.name, self.ops, self.requires_grad, *map(dict, maps)))

    def op(self, name: str) -> Op:
        if name not in self.op_index:
            raise IRError(f"graph {self.name!r} has no op {name!r}")
        return self.ops[self.op_index[name]]

    def tensor(self, name: str) -> Tensor:
        if name not in self.tensors:
            raise IRError(f"graph {self.name!r} has no tensor {name!r}")
        return self.tensors[name]

    @property
    def parameters(self) -> tuple[Tensor, ...]:
        return tuple(t for t in self.tensors.values() if t.role is Role.PARAMETER)

    @property
    def num_params(self) -> int:
        return sum(t.numel for t in self.parameters)

    @property
    def param_bytes(self) -> int:
        return sum(t.nbytes for t in self.parameters)

    @property
    def flops(self) -> float:
        return sum(op.flops for op in self.ops)

    @property
    def outputs(self) -> tuple[str, ...]:
        """Tensors produced but never consumed (the model's results)."""
        return tuple(t for op in self.ops for t in op.outputs if not self.consumers.get(t))


def _loaded(
    name: str,
    ops: tuple[Op, ...],
    requires_grad: frozenset[str],
    tensors: dict[str, Tensor],
    producer: dict[str, int],
    consumers: dict[str, tuple[tuple[int, int], ...]],
    op_index: dict[str, int],
) -> Graph:
    """A pickled `Graph` loaded (`Graph.__reduce__`)."""
    return Graph(
        name,
        MappingProxyType(tensors),
        ops,
        MappingProxyType(producer),
        MappingProxyType(consumers),
        MappingProxyType(op_index),
        requires_grad,
    )


class GraphBuilder:
    """Mutable collector of tensors and ops; `build()` freezes it into a verified `Graph`."""

    def __init__(self, name: str, dtype_bytes: int = 4) -> None:
        self.name = name
        self.dtype_bytes = dtype_bytes
        self._tensors: dict[str, Tensor] = {}
        self._ops: list[Op] = []
        self._op_names: set[str] = set()
        self._counter = 0
        self._scope: list[str] = []

    # -- naming -------------------------------------------------------------------------------
    def scope(self, name: str) -> _Scope:
        """`with b.scope("h.0"):` prefixes op and parameter names and sets the op's layer."""
        return _Scope(self, name)

    def _qualify(self, name: str) -> str:
        return ".".join([*self._scope, name]) if self._scope else name

    def _fresh(self, base: str) -> str:
        self._counter += 1
        return self._qualify(f"{base}{self._counter}")

    # -- tensors ------------------------------------------------------------------------------
    def add_tensor(self, tensor: Tensor) -> str:
        if tensor.name in self._tensors:
            raise IRError(f"tensor {tensor.name!r} is defined twice in graph {self.name!r}")
        self._tensors[tensor.name] = tensor
        return tensor.name

    def input(self, name: str, shape: tuple[int, ...], dtype_bytes: int | None = None) -> str:
        return self.add_tensor(Tensor(name, shape, dtype_bytes or self.dtype_bytes, Role.INPUT))

    def param(self, name: str, shape: tuple[int, ...], dtype_bytes: int | None = None) -> str:
        return self.add_tensor(
            Tensor(self._qualify(name), shape, dtype_bytes or self.dtype_bytes, Role.PARAMETER)
        )

    def constant(self, name: str, shape: tuple[int, ...], dtype_bytes: int | None = None) -> str:
        return self.add_tensor(
            Tensor(self._qualify(name), shape, dtype_bytes or self.dtype_bytes, Role.CONSTANT)
        )

    def shared_constant(
        self, name: str, shape: tuple[int, ...], dtype_bytes: int | None = None
    ) -> str:
        """A graph-level constant (no scope prefix) read by many layers (RoPE tables, masks):
        created on first use, returned by name after."""
        if name in self._tensors:
            if self._tensors[name].shape != shape:
                raise IRError(f"constant {name!r} exists with shape {self._tensors[name].shape}")
            return name
        return self.add_tensor(Tensor(name, shape, dtype_bytes or self.dtype_bytes, Role.CONSTANT))

    def shape(self, tensor: str) -> tuple[int, ...]:
        if tensor not in self._tensors:
            raise IRError(f"tensor {tensor!r} is not defined yet in graph {self.name!r}")
        return self._tensors[tensor].shape

    # -- ops ----------------------------------------------------------------------------------
    def add_op(self, op: Op) -> Op:
        """Add a fully formed op; declare its output tensors first with `add_tensor`."""
        if op.name in self._op_names:
            raise IRError(f"op name {op.name!r} is used twice in graph {self.name!r}")
        self._op_names.add(op.name)
        self._ops.append(op)
        return op

    def apply(
        self,
        kind: str,
        *inputs: str,
        name: str | None = None,
        out_dtype_bytes: int | None = None,
        **attrs: Any,
    ) -> str:
        """Add an op of catalogue `kind` on `inputs`; return its (first) result tensor name."""
        shapes = [self.shape(t) for t in inputs]
        op_name = self._qualify(name) if name else self._fresh(kind)
        try:
            form = op_form(kind, shapes, attrs)
        except ShardplanError as e:
            raise type(e)(f"op {op_name!r} ({kind}): {e}") from e
        outs = []
        for i, shape in enumerate(form.output_shapes):
            out = op_name if len(form.output_shapes) == 1 else f"{op_name}:{i}"
            dtype = out_dtype_bytes or self.dtype_bytes
            self.add_tensor(Tensor(out, shape, dtype, Role.ACTIVATION))
            outs.append(out)
        layer = ".".join(self._scope)
        self.add_op(
            Op(
                op_name,
                kind,
                form.signature,
                tuple(inputs),
                tuple(outs),
                form.flops,
                tuple(attrs.items()),
                layer,
            )
        )
        return outs[0]

    def build(self) -> Graph:
        """Order ops topologically, index producers/consumers, verify, and freeze."""
        from shardplan.ir.verify import verify

        producer_of: dict[str, int] = {}
        for i, op in enumerate(self._ops):
            for t in op.outputs:
                if t in producer_of:
                    raise IRError(
                        f"tensor {t!r} is produced by both {self._ops[producer_of[t]].name!r} "
                        f"and {op.name!r}"
                    )
                producer_of[t] = i
        pending = [0] * len(self._ops)
        users: dict[int, list[int]] = {}
        for i, op in enumerate(self._ops):
            for t in set(op.inputs):
                p = producer_of.get(t)
                if p is not None:
                    pending[i] += 1
                    users.setdefault(p, []).append(i)
        ready = [i for i, n in enumerate(pending) if n == 0]
        heapq.heapify(ready)
        order: list[int] = []
        while ready:
            i = heapq.heappop(ready)
            order.append(i)
            for u in users.get(i, ()):
                pending[u] -= 1
                if pending[u] == 0:
                    heapq.heappush(ready, u)
        if len(order) != len(self._ops):
            stuck = [self._ops[i].name for i, n in enumerate(pending) if n > 0]
            raise CycleError(f"graph {self.name!r} has a cycle through ops {stuck[:5]}")
        ops = tuple(self._ops[i] for i in order)
        graph = make_graph(self.name, dict(self._tensors), ops)
        verify(graph)
        return graph


def make_graph(
    name: str,
    tensors: dict[str, Tensor],
    ops: tuple[Op, ...],
    grad_inputs: frozenset[str] = frozenset(),
) -> Graph:
    """Index an already ordered op list (used by the builder and the JSON loader).
    `grad_inputs`: inputs whose gradient is needed too (a later pipeline stage's incoming
    activations); requires_grad spreads forward from them and the parameters."""
    producer: dict[str, int] = {}
    consumers: dict[str, list[tuple[int, int]]] = {}
    for i, op in enumerate(ops):
        for t in op.outputs:
            producer[t] = i
        for pos, t in enumerate(op.inputs):
            consumers.setdefault(t, []).append((i, pos))
    grad: set[str] = {t.name for t in tensors.values() if t.role is Role.PARAMETER}
    grad.update(t for t in grad_inputs if t in tensors)
    for op in ops:
        if any(t in grad for t in op.inputs):
            grad.update(op.outputs)
    return Graph(
        name=name,
        tensors=MappingProxyType(tensors),
        ops=ops,
        producer=MappingProxyType(producer),
        consumers=MappingProxyType({k: tuple(v) for k, v in consumers.items()}),
        op_index=MappingProxyType({op.name: i for i, op in enumerate(ops)}),
        requires_grad=frozenset(grad),
    )


class _Scope:
    def __init__(self, builder: GraphBuilder, name: str) -> None:
        self.builder, self.name = builder, name

    def __enter__(self) -> GraphBuilder:
        self.builder._scope.append(self.name)
        return self.builder

    def __exit__(self, *exc: object) -> None:
        self.builder._scope.pop()
