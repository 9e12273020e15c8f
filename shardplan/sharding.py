"""Strategies and the layouts they imply (pure functions of an op's signature; no costs here).

A strategy gives, for each round of the mesh, the loop dim an operator cuts q ways (or None:
replicate). From it follow, per round, every operand's layout: split along tensor dim j (the loop
dim is the major loop dim of j's group), REPLICATED (the loop dim does not index the tensor), or
PARTIAL (a REDUCE loop dim left the result as partial sums). All functions are O(rounds * rank).
"""

from __future__ import annotations

from collections.abc import Sequence

from shardplan.errors import PlanError
from shardplan.ir.dims import DimKind
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op
from shardplan.ir.signature import TensorDims
from shardplan.mesh import Mesh, Round

Strategy = tuple[str | None, ...]
"""Per round: the loop dim cut in that round, or None (replicate)."""

REPLICATED = -1
PARTIAL = -2
Layout = tuple[int, ...]
"""Per round: a tensor dim (>= 0) the tensor is split along, REPLICATED or PARTIAL."""


def layout_of_cut(dims: TensorDims, loop_dim: str | None, is_output: bool, op: Op) -> int:
    """The layout one cut gives one operand (see module docstring)."""
    if loop_dim is None:
        return REPLICATED
    for position, group in enumerate(dims):
        if group and group[0] == loop_dim:
            return position
    if is_output and op.signature.loop_dim(loop_dim).kind is DimKind.REDUCE:
        return PARTIAL
    return REPLICATED


def operand_layout(op: Op, strategy: Strategy, position: int, is_output: bool = False) -> Layout:
    dims = (op.signature.outputs if is_output else op.signature.inputs)[position]
    return tuple(layout_of_cut(dims, d, is_output, op) for d in strategy)


def resolved(layout: Layout) -> Layout:
    """The layout consumers see: the op all-reduces its partial sums itself."""
    return tuple(REPLICATED if s == PARTIAL else s for s in layout)


def cut_problem(op: Op, loop_dim: str, local_extent: int, q: int) -> str | None:
    """Why cutting `loop_dim` q ways is invalid for `op` (None when it is valid)."""
    try:
        dim = op.signature.loop_dim(loop_dim)
    except Exception:
        return f"loop dim {loop_dim!r} does not exist"
    if dim.kind is DimKind.FROZEN:
        return f"loop dim {loop_dim!r} is FROZEN"
    if local_extent % q:
        return f"local extent {local_extent} of {loop_dim!r} is not divisible by {q}"
    # The one window rule: a WINDOW cut also splits the (larger) input dim, so it must divide it.
    parts = dim.extent // max(local_extent, 1) * q
    if dim.span and dim.span % parts:
        return (
            f"WINDOW loop dim {loop_dim!r} splits an input dim of size {dim.span}, "
            f"which is not divisible into {parts} parts"
        )
    for dims in (*op.signature.inputs, *op.signature.outputs):
        for group in dims:
            if loop_dim in group[1:]:
                return f"loop dim {loop_dim!r} is a minor dim of tensor group {group}"
    return None


def local_extents(
    op: Op, strategy: Strategy, rounds: Sequence[Round], upto: int | None = None
) -> dict[str, int]:
    """Loop-dim extents after the cuts of rounds [0, upto) (all rounds by default)."""
    extents = op.signature.extents
    for r, loop_dim in zip(rounds[:upto], strategy[:upto], strict=False):
        if loop_dim is not None:
            extents[loop_dim] //= r.q
    return extents


def check_strategy(op: Op, strategy: Strategy, rounds: Sequence[Round]) -> None:
    """Raise PlanError naming the op if `strategy` is not valid on these rounds."""
    if len(strategy) != len(rounds):
        raise PlanError(
            f"op {op.name!r}: strategy {strategy} has {len(strategy)} cuts but the "
            f"mesh has {len(rounds)} rounds"
        )
    extents = op.signature.extents
    for r, loop_dim in zip(rounds, strategy, strict=True):
        if loop_dim is None:
            continue
        problem = cut_problem(op, loop_dim, extents.get(loop_dim, 0), r.q)
        if problem:
            raise PlanError(f"op {op.name!r} ({op.kind}) round {r.index} (q={r.q}): {problem}")
        extents[loop_dim] //= r.q


def split_counts(layout: Layout, rank: int, rounds: Sequence[Round]) -> tuple[int, ...]:
    """MindSpore-style split count per tensor dim, e.g. (4, 2)."""
    counts = [1] * rank
    for r, s in zip(rounds, layout, strict=True):
        if s >= 0:
            counts[s] *= r.q
    return tuple(counts)


def local_shape(shape: Sequence[int], layout: Layout, rounds: Sequence[Round]) -> tuple[int, ...]:
    counts = split_counts(layout, len(shape), rounds)
    return tuple(max(1, s // c) for s, c in zip(shape, counts, strict=True))


def in_strategy(
    op: Op, strategy: Strategy, graph: Graph, mesh: Mesh
) -> tuple[tuple[int, ...], ...]:
    rounds = mesh.rounds
    return tuple(
        split_counts(operand_layout(op, strategy, i), len(graph.tensors[t].shape), rounds)
        for i, t in enumerate(op.inputs)
    )


def layout_text(layout: Layout) -> str:
    """Per round: `S(j)`, `R` or `P`, e.g. `S(0) S(0) R`."""
    return " ".join("R" if s == REPLICATED else "P" if s == PARTIAL else f"S({s})" for s in layout)
