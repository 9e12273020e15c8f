"""Graph verification: one linear pass that rejects what the rest of shardplan cannot trust.

Checks, each raising a typed error that names the operator or tensor: every operand exists and is
defined before use (topological order, else CycleError), each tensor has at most one producer,
op outputs are activations, graph inputs are not activations, operand ranks and group extents
match the tensor shapes (a WINDOW group of an input matches the dim's declared `span`: a conv
input is larger than its output window grid), and no tensor is left dangling (an activation
nobody produces).
"""

from __future__ import annotations

from shardplan.errors import CycleError, IRError, ShapeError
from shardplan.ir.dims import DimKind
from shardplan.ir.graph import Graph
from shardplan.ir.op import Role
from shardplan.ir.signature import group_extent


def verify(graph: Graph) -> Graph:
    """Return `graph` unchanged if it is consistent; raise an IRError subclass otherwise."""
    defined: set[str] = {n for n, t in graph.tensors.items() if t.role is not Role.ACTIVATION}
    produced: set[str] = set()
    for op in graph.ops:
        extents = op.signature.extents
        window = {d.name: d for d in op.signature.loop_dims if d.kind is DimKind.WINDOW}
        for side, names, groups in (
            ("input", op.inputs, op.signature.inputs),
            ("output", op.outputs, op.signature.outputs),
        ):
            for pos, (tname, dims) in enumerate(zip(names, groups, strict=True)):
                if tname not in graph.tensors:
                    raise IRError(
                        f"op {op.name!r} ({op.kind}): {side} {pos} names unknown "
                        f"tensor {tname!r}; define it before use"
                    )
                tensor = graph.tensors[tname]
                if side == "input" and tname not in defined:
                    if tname in graph.producer:
                        raise CycleError(
                            f"op {op.name!r} uses {tname!r} before it is produced by "
                            f"{graph.ops[graph.producer[tname]].name!r}: the graph has a cycle"
                        )
                    raise IRError(
                        f"op {op.name!r}: input {tname!r} is a dangling activation "
                        "(no op produces it); declare it as an input or parameter"
                    )
                if len(dims) != len(tensor.shape):
                    raise ShapeError(
                        f"op {op.name!r} ({op.kind}): {side} {pos} {tname!r} has rank "
                        f"{len(tensor.shape)} but the signature {op.signature.text()!r} gives "
                        f"{len(dims)} dims"
                    )
                for j, (group, size) in enumerate(zip(dims, tensor.shape, strict=True)):
                    if side == "input" and len(group) == 1 and group[0] in window:
                        span = window[group[0]].span or extents[group[0]]
                        if size != span:
                            raise ShapeError(
                                f"op {op.name!r} ({op.kind}): input {pos} {tname!r} dim {j} has "
                                f"size {size} but WINDOW loop dim {group[0]!r} declares span "
                                f"{span}; declare the input size as the dim's span"
                            )
                        continue
                    if side == "input" and window.keys() & set(group):
                        continue  # a window inside a merged group: no size to compare with
                    if group_extent(group, extents) != size:
                        raise ShapeError(
                            f"op {op.name!r} ({op.kind}): {side} {pos} {tname!r} dim {j} has "
                            f"size {size} but loop dims {group} give {group_extent(group, extents)}"
                        )
        for tname in op.outputs:
            if tname in produced:
                raise IRError(f"tensor {tname!r} is produced twice (second time by {op.name!r})")
            if graph.tensors[tname].role is not Role.ACTIVATION:
                raise IRError(
                    f"op {op.name!r} writes {tname!r}, which is a "
                    f"{graph.tensors[tname].role.value}; outputs must be activations"
                )
            produced.add(tname)
            defined.add(tname)
    for name, tensor in graph.tensors.items():
        if tensor.role is Role.ACTIVATION and name not in produced:
            raise IRError(f"activation {name!r} is never produced; remove it or add its producer")
    return graph
