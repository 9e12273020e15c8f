"""Strategies and the layouts they imply (pure functions of an op's signature; no costs here).

A strategy gives, for each round of the mesh, the loop dim an operator cuts q ways (or None:
replicate). From it follow, per round, every operand's layout: split along tensor dim j (the loop
dim is the major loop dim of j's group), REPLICATED (the loop dim does not index the tensor), or
PARTIAL (a REDUCE loop dim left the result as partial sums). All functions are O(rounds * rank).

Layouts are tuples of ints because the cost model and D-Rec read them in hot loops. Wherever a
layout leaves the core (tables, JSON, DTensor, verification) it becomes `Placement` values,
which print themselves DTensor-style: `S(d)` split on tensor dim d, `R` replicated, `P(sum)` /
`P(max)` partial results (`placements(layout, reducers)`; `Placement.parse` reads them back).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

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


def operand_layouts(op: Op, strategy: Strategy) -> tuple[tuple[Layout, ...], tuple[Layout, ...]]:
    """(`operand_layout` of every input, of every result) in one pass: each operand's major loop
    dims read once, O(operands x (rank + rounds)). The strategy's cuts must be the op's loop dims
    (`check_strategy`)."""
    sig = op.signature
    reduce = {d.name for d in sig.loop_dims if d.kind is DimKind.REDUCE}

    def layout(dims: TensorDims, is_output: bool) -> Layout:
        majors: dict[str, int] = {}
        for position, group in enumerate(dims):
            if group:
                majors.setdefault(group[0], position)
        missing = PARTIAL if is_output else REPLICATED
        return tuple(
            REPLICATED if d is None else majors.get(d, missing if d in reduce else REPLICATED)
            for d in strategy
        )

    return (
        tuple(layout(dims, False) for dims in sig.inputs),
        tuple(layout(dims, True) for dims in sig.outputs),
    )


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
    for operands in (op.signature.inputs, op.signature.outputs):
        for dims in operands:
            for group in dims:
                # a loop dim indexes an operand once (`Signature`): in the group, not first
                if loop_dim in group and group[0] != loop_dim:
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


def check_strategies(
    ops: Sequence[Op],
    strategies: Mapping[str, Strategy],
    rounds: Sequence[Round],
    classes: Sequence[int] | None = None,
    seen: set[tuple[object, ...]] | None = None,
) -> None:
    """`check_strategy` for every op; ops of equal signature and strategy (repeated layers) are
    checked once, since validity reads nothing else (`classes`: op class ids that refine equal
    signatures, to skip hashing them; `seen`: the (class, strategy) pairs already found valid,
    kept by the caller across plans of one graph and mesh). O(ops) hashing plus one check per
    class."""
    seen = seen if seen is not None else set()
    for index, op in enumerate(ops):
        strategy = tuple(strategies[op.name])
        key = (op.signature if classes is None else classes[index], strategy)
        try:
            known = key in seen
        except TypeError:  # an unhashable entry: let the check name it
            known = False
        if not known:
            check_strategy(op, strategy, rounds)
            seen.add(key)


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


# -- placements: a layout entry as a value that prints itself ---------------------------------

_PLACEMENT_TEXT = re.compile(r"^(?:S\((\d+)\)|R|P(?:\((sum|max|min)\))?)$")


@dataclass(frozen=True, slots=True)
class Placement:
    """One round of a tensor's layout: `Placement.shard(d)`, `Placement.replicate()` or
    `Placement.partial("sum" | "max" | "min")`; `str()` gives `S(d)`, `R`, `P(sum)`."""

    dim: int | None = None
    reducer: str | None = None

    def __post_init__(self) -> None:
        if self.dim is not None and (self.dim < 0 or self.reducer is not None):
            raise PlanError(f"a shard placement needs a tensor dim >= 0, got {self!r}")
        if self.reducer is not None and self.reducer not in ("sum", "max", "min"):
            raise PlanError(f"partial placement reducer must be sum, max or min: {self.reducer!r}")

    @classmethod
    def shard(cls, dim: int) -> Placement:
        return cls(dim=dim)

    @classmethod
    def replicate(cls) -> Placement:
        return cls()

    @classmethod
    def partial(cls, reducer: str = "sum") -> Placement:
        return cls(reducer=reducer)

    @property
    def is_shard(self) -> bool:
        return self.dim is not None

    @property
    def is_partial(self) -> bool:
        return self.reducer is not None

    @property
    def is_replicate(self) -> bool:
        return self.dim is None and self.reducer is None

    def __str__(self) -> str:
        if self.dim is not None:
            return f"S({self.dim})"
        return f"P({self.reducer})" if self.reducer is not None else "R"

    @classmethod
    def parse(cls, text: str) -> Placement:
        """`S(d)`, `R`, `P` (= `P(sum)`), `P(sum)`, `P(max)` or `P(min)` -> Placement."""
        m = _PLACEMENT_TEXT.match(text.strip())
        if m is None:
            raise PlanError(f"{text!r} is not a placement; write S(d), R, P(sum) or P(max)")
        if m.group(1) is not None:
            return cls.shard(int(m.group(1)))
        return cls.replicate() if text.strip() == "R" else cls.partial(m.group(2) or "sum")

    @classmethod
    def of(cls, entry: int, reducer: str | None = None) -> Placement:
        """The placement of one layout entry (a tensor dim, REPLICATED or PARTIAL)."""
        if entry >= 0:
            return cls.shard(entry)
        if entry == REPLICATED:
            return cls.replicate()
        if entry == PARTIAL:
            return cls.partial(reducer or "sum")
        raise PlanError(f"layout entry {entry} is not a tensor dim, REPLICATED or PARTIAL")


def placements(
    layout: Layout, reducers: Sequence[str | None] | None = None
) -> tuple[Placement, ...]:
    """A Layout as one Placement per round; `reducers[r]` names round r's partial reducer."""
    return tuple(
        Placement.of(s, reducers[r] if reducers is not None else None) for r, s in enumerate(layout)
    )


def partial_reducers(op: Op, strategy: Strategy, position: int = 0) -> tuple[str | None, ...]:
    """Per round: the reducer (`"sum"`, `"max"`, ...) of result `position` where it is PARTIAL."""
    layout = operand_layout(op, strategy, position, True)
    out: list[str | None] = []
    for cut, s in zip(strategy, layout, strict=True):
        if s == PARTIAL and cut is not None:
            reducer = op.signature.loop_dim(cut).reducer
            out.append(reducer.value if reducer is not None else "sum")
        else:
            out.append(None)
    return tuple(out)


def output_placements(op: Op, strategy: Strategy, position: int = 0) -> tuple[Placement, ...]:
    """The placements result `position` of `op` leaves under `strategy` (partials with reducer)."""
    layout = operand_layout(op, strategy, position, True)
    return placements(layout, partial_reducers(op, strategy, position))


def layout_text(layout: Layout, reducers: Sequence[str | None] | None = None) -> str:
    """Per round, space-separated: e.g. `S(0) S(0) R`, `S(0) P(sum)`."""
    return " ".join(str(p) for p in placements(layout, reducers))


def check_fixed(graph: Graph, mesh: Mesh, fixed: Mapping[str, Strategy]) -> dict[str, Strategy]:
    """The user-fixed strategies, checked: known op, one entry per round, valid cuts."""
    out: dict[str, Strategy] = {}
    for name, strategy in fixed.items():
        if name not in graph.op_index:
            near = difflib.get_close_matches(name, list(graph.op_index), n=3)
            hint = f"; did you mean {', '.join(near)}?" if near else ""
            raise PlanError(f"fixed strategy for op {name!r}: no such op in {graph.name}{hint}")
        strategy = tuple(strategy)
        if len(strategy) != len(mesh.rounds):
            raise PlanError(
                f"fixed strategy {strategy} for op {name!r}: give one cut per round "
                f"({len(mesh.rounds)} rounds on mesh {mesh.text()}; '-' for none)"
            )
        check_strategy(graph.op(name), strategy, mesh.rounds)
        out[name] = strategy
    return out
