"""Which ops price alike, and who read a tensor before: per-op facts the evaluator's caches key on.

`op_key` holds everything an op's own prices read (kind, signature, FLOPs, attributes, each
operand's shape, element width, role and gradient status): ops of equal keys (repeated layers)
form one class, priced once (`evaluate.ScoreCache`, `evaluate.PriceTable`); D-Rec's fold of
repeated blocks reads the same classes (`search.drec.fold.op_labels`). `previous_consumer(s)`:
the reader of a tensor just before a given one (the evaluator's share credits).
O(ops + operands) per graph.
"""

from __future__ import annotations

from shardplan.ir.graph import Graph
from shardplan.ir.op import Op


def previous_consumer(graph: Graph, tensor: str, op_index: int, pos: int) -> tuple[int, int] | None:
    """The consumer (op index, operand position) of `tensor` just before (op_index, pos)."""
    users = graph.consumers.get(tensor, ())
    k = users.index((op_index, pos))
    return users[k - 1] if k > 0 else None


def op_key(graph: Graph, op: Op) -> tuple[object, ...]:
    """Everything `unary_terms` and `share_credit` read about an op: equal keys give equal
    terms."""

    def tensor(name: str) -> tuple[object, ...]:
        t = graph.tensors[name]
        return (t.shape, t.dtype_bytes, t.role.value, name in graph.requires_grad)

    return (
        op.kind,
        op.signature,
        op.flops,
        op.attrs,
        tuple(tensor(t) for t in op.inputs),
        tuple(tensor(t) for t in op.outputs),
    )


def op_classes(graph: Graph, ids: dict[tuple[object, ...], int]) -> list[int]:
    """Per op, its class id in `ids` (`op_key` -> id, new keys numbered in order of first
    appearance): `op_key` of every op, each tensor's part built once. O(ops + operands)."""
    tensors, grad = graph.tensors, graph.requires_grad
    forms: dict[str, tuple[object, ...]] = {}

    def form(name: str) -> tuple[object, ...]:
        found = forms.get(name)
        if found is None:
            t = tensors[name]
            # the role's value: a str hashes in C, an Enum member in Python
            found = forms[name] = (t.shape, t.dtype_bytes, t.role.value, name in grad)
        return found

    return [
        ids.setdefault(
            (
                op.kind,
                op.signature,
                op.flops,
                op.attrs,
                tuple(map(form, op.inputs)),
                tuple(map(form, op.outputs)),
            ),
            len(ids),
        )
        for op in graph.ops
    ]


def previous_consumers(graph: Graph) -> list[list[tuple[int, int] | None]]:
    """Per op and operand, `previous_consumer` (the tensor's reader just before it), from one
    pass over the consumer lists. O(operands)."""
    before: dict[tuple[int, int], tuple[int, int]] = {}
    for users in graph.consumers.values():
        before.update(zip(users[1:], users, strict=False))
    return [
        [before.get((index, i)) for i in range(len(op.inputs))]
        for index, op in enumerate(graph.ops)
    ]
