"""One op's own prices under one strategy, from one pass over its operands.

`price_op` reads each operand's layout once (`sharding.operand_layouts`), its local size before
every round (`terms.round_numels`) and its hierarchical all-reduce divisor (`operand_infos`), and
from them the op's intra-operator terms round by round (`round_intra`: `terms.intra_terms` of
each round's cut, summed in round order), its compute (`terms.compute_cost` with its own
backward, `cost.backward`) and its forward compute alone (the step model's F). `OpPrice` keeps
the per-round pieces so a share credit (`evaluate.share_credit`) reprices only the rounds whose
gradient all-reduce another consumer pays. Every number is the same float the evaluator's
definitions give (same operations in the same order). O(rounds^2 x operands) per op.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from dataclasses import replace as dataclass_replace

from shardplan.cost.backward import Piece, backward_bytes
from shardplan.cost.presets import CostOptions
from shardplan.cost.terms import (
    ZERO,
    CommTerms,
    OperandInfo,
    compute_cost,
    faster,
    intra_terms,
    replicate_symbolic,
)
from shardplan.ir.dims import DimKind
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role
from shardplan.ir.traits import backward_recompute
from shardplan.mesh import Mesh, Round
from shardplan.sharding import (
    Layout,
    Strategy,
    cut_problem,
    operand_layout,
    operand_layouts,
    resolved,
)

Fast = tuple[tuple[int, ...], ...]
"""fast[r]: the rounds j != r whose collectives run before round r's (`terms.faster(rounds[j],
rounds[r])`), in ascending order."""


def faster_rounds(rounds: Sequence[Round]) -> Fast:
    """The `faster` relation of a mesh's rounds as a table (O(rounds^2))."""
    return tuple(
        tuple(j for j, other in enumerate(rounds) if j != r and faster(other, rnd))
        for r, rnd in enumerate(rounds)
    )


def operand_infos(
    graph: Graph,
    op: Op,
    strategy: Strategy,
    is_output: bool,
    rounds: Sequence[Round],
    opts: CostOptions,
    layouts: Sequence[Layout] | None = None,
    fast: Fast | None = None,
) -> list[list[OperandInfo]]:
    """Per round, per operand: local size before the round, dtype, role, requires_grad and the
    hierarchical all-reduce divisor (product of q of faster rounds that split or reduce it).
    `layouts`: the operands' layouts when known (`operand_layouts`)."""
    return _operands(graph, op, strategy, is_output, rounds, opts, layouts, fast)[0]


def _operands(
    graph: Graph,
    op: Op,
    strategy: Strategy,
    is_output: bool,
    rounds: Sequence[Round],
    opts: CostOptions,
    layouts: Sequence[Layout] | None,
    fast: Fast | None,
    facts: bool = True,
    read: Sequence[bool] | None = None,
) -> tuple[list[list[OperandInfo]], list[Piece]]:
    """`operand_infos` and the operands as one device holds them (`cost.work.op_pieces`);
    without `facts`, no operand's per-round facts (empty rounds); with `read`, the facts of the
    rounds it marks only (the others hold the previous round's value, never read)."""
    names = op.outputs if is_output else op.inputs
    groups = op.signature.outputs if is_output else op.signature.inputs
    n = len(rounds)
    before = fast if fast is not None else faster_rounds(rounds)
    qs = [rnd.q for rnd in rounds]
    # `terms.reduces` of a cut that leaves the operand whole: partial sums of a REDUCE dim (a
    # result), the gradient all-reduce (an input that needs one, in training)
    reducing = {d.name for d in op.signature.loop_dims if d.kind is DimKind.REDUCE}
    tensors, requires_grad = graph.tensors, graph.requires_grad
    per_operand = []
    pieces = []
    for i, name in enumerate(names):
        t = tensors[name]
        layout = layouts[i] if layouts is not None else operand_layout(op, strategy, i, is_output)
        numel = t.numel
        sizes = [float(numel)]  # `terms.round_numels`, inlined
        for q, s in zip(qs, layout, strict=True):
            sizes.append(sizes[-1] / q if s >= 0 else sizes[-1])
        grad = name in requires_grad
        width = opts.element_bytes(t)
        pieces.append(Piece(sizes[-1] * width, numel, width, t.role is Role.PARAMETER, grad))
        if not facts:
            continue
        carried = {d for group in groups[i] for d in group}
        whole_reduces = opts.train and grad
        # shrinks[j]: round j splits the operand or reduces it (`terms.reduces`)
        shrinks = [
            layout[j] >= 0
            or (
                cut is not None
                and cut not in carried
                and (cut in reducing if is_output else whole_reduces)
            )
            for j, cut in enumerate(strategy)
        ]
        role = t.role
        # ZeRO >= 1: a parameter's gradient is reduce-scattered once instead (cost/zero.py)
        parameter = role is Role.PARAMETER
        zero = opts.zero > 0 and parameter
        infos = []
        last: OperandInfo | None = None
        for r in range(n):
            if read is not None and not read[r] and last is not None:
                infos.append(last)
                continue
            divisor = 1.0
            for j in before[r]:
                if shrinks[j] and not (j < r and layout[j] >= 0):
                    divisor *= qs[j]
            size = sizes[r]
            if last is None or last.numel != size or last.ar_divisor != divisor:
                last = OperandInfo(size, width, role, grad, divisor, zero)
            infos.append(last)  # equal facts, one (immutable) value
        per_operand.append(infos)
    if not per_operand:
        return [[] for _ in range(n)], pieces
    return [list(row) for row in zip(*per_operand, strict=True)], pieces


def round_intra(
    op: Op,
    strategy: Strategy,
    rounds: Sequence[Round],
    ins: Sequence[Sequence[OperandInfo]],
    outs: Sequence[Sequence[OperandInfo]],
    opts: CostOptions,
    only: Sequence[int] | None = None,
) -> list[CommTerms | None]:
    """Per round, the intra-operator terms of its cut (None: a round that adds nothing);
    `only`: price those rounds alone (None for the others)."""
    extents = op.signature.extents
    out: list[CommTerms | None] = []
    for r, rnd in enumerate(rounds):
        cut = strategy[r]
        term: CommTerms | None = None
        if only is not None and r not in only:
            pass
        elif cut is not None:
            term = intra_terms(op, cut, rnd, ins[r], outs[r], extents[cut], opts)
        elif opts.preset.symbolic:
            cuts = [
                intra_terms(op, d.name, rnd, ins[r], outs[r], extents[d.name], opts).total
                for d in op.signature.loop_dims
                if cut_problem(op, d.name, extents[d.name], rnd.q) is None
            ]
            if cuts:
                term = CommTerms(intra_fwd=replicate_symbolic(min(cuts), opts.preset))
        if cut is not None:
            extents[cut] //= rnd.q
        out.append(term)
    return out


def sum_rounds(terms: Sequence[CommTerms | None]) -> CommTerms:
    """The rounds' terms added in round order (what `op_intra` returns)."""
    total = ZERO
    for term in terms:
        if term is not None:
            total = total + term
    return total


@dataclass(frozen=True, slots=True)
class OpPrice:
    """An op's prices under one strategy (module docstring): operand layouts (`inputs`, raw
    `outputs` with partial sums, `resolved` ones as consumers see them), the per-round operand
    facts and intra terms (facts only where `round_intra` reads them: `outs` empty when no
    round does, placeholders in `ins` for a round the op does not cut), their sum `intra`,
    `compute` (forward + own backward) and `forward`."""

    inputs: tuple[Layout, ...]
    outputs: tuple[Layout, ...]
    resolved: tuple[Layout, ...]
    ins: list[list[OperandInfo]]
    outs: list[list[OperandInfo]]
    rounds: list[CommTerms | None]
    intra: CommTerms
    compute: float
    forward: float


def price_op(
    graph: Graph,
    op: Op,
    strategy: Strategy,
    mesh: Mesh,
    opts: CostOptions,
    fast: Fast | None = None,
    forward_opts: CostOptions | None = None,
) -> OpPrice:
    """Everything `OpPrice` holds, in one pass (`forward_opts`: `opts` with train=False, when
    the caller has it)."""
    rounds = mesh.rounds
    fast = fast if fast is not None else faster_rounds(rounds)
    ins_lay, outs_lay = operand_layouts(op, strategy)
    # a round that does not cut the op reads no operand facts (but in the symbolic preset)
    read = None if opts.preset.symbolic else [c is not None for c in strategy]
    ins, in_pieces = _operands(graph, op, strategy, False, rounds, opts, ins_lay, fast, True, read)
    # results' facts are read by a round that cuts a REDUCE dim (partial sums) or by the
    # symbolic preset's price of not cutting (`terms.intra_terms`) only
    reducing = {d.name for d in op.signature.loop_dims if d.kind is DimKind.REDUCE}
    facts = opts.preset.symbolic or any(c in reducing for c in strategy if c is not None)
    outs, out_pieces = _operands(graph, op, strategy, True, rounds, opts, outs_lay, fast, facts)
    per_round = round_intra(op, strategy, rounds, ins, outs, opts)
    flops, nbytes, compute = _compute(op, strategy, rounds, in_pieces, out_pieces, opts, mesh)
    if forward_opts is None:
        forward_opts = dataclass_replace(opts, train=False)
    forward = compute_cost(flops, nbytes, forward_opts, mesh)
    consumed = tuple(resolved(lay) for lay in outs_lay)
    return OpPrice(
        ins_lay, outs_lay, consumed, ins, outs, per_round, sum_rounds(per_round), compute, forward
    )


def op_compute(
    graph: Graph,
    op: Op,
    strategy: Strategy,
    mesh: Mesh,
    opts: CostOptions,
    fast: Fast | None = None,
) -> float:
    """`price_op(...).compute` alone: the operands' pieces without their per-round facts and
    no intra terms (a floor a search can test before pricing a strategy whole)."""
    rounds = mesh.rounds
    fast = fast if fast is not None else faster_rounds(rounds)
    ins_lay, outs_lay = operand_layouts(op, strategy)
    ins = _operands(graph, op, strategy, False, rounds, opts, ins_lay, fast, False)[1]
    outs = _operands(graph, op, strategy, True, rounds, opts, outs_lay, fast, False)[1]
    return _compute(op, strategy, rounds, ins, outs, opts, mesh)[2]


def _compute(
    op: Op,
    strategy: Strategy,
    rounds: Sequence[Round],
    in_pieces: Sequence[Piece],
    out_pieces: Sequence[Piece],
    opts: CostOptions,
    mesh: Mesh,
) -> tuple[float, float, float]:
    """(local FLOPs, local bytes, compute) of one device's piece of `op` under `strategy`."""
    parts = 1
    for r, cut in zip(rounds, strategy, strict=True):
        if cut is not None:
            parts *= r.q
    nbytes = sum(p.nbytes for p in (*in_pieces, *out_pieces))
    bwd = backward_bytes(op.kind, in_pieces, out_pieces)
    flops = op.flops / parts
    return flops, nbytes, compute_cost(flops, nbytes, opts, mesh, bwd, backward_recompute(op.kind))


def shared_intra(
    op: Op,
    strategy: Strategy,
    rounds: Sequence[Round],
    price: OpPrice,
    shared: Sequence[tuple[int, int]],
    opts: CostOptions,
) -> CommTerms:
    """`op_intra` with the (input position, round) pairs `shared` marked grad_shared, repricing
    only their rounds (the others' terms are `price`'s)."""
    ins = list(price.ins)
    touched = sorted({r for _, r in shared})
    for r in touched:
        ins[r] = list(ins[r])
    for pos, r in shared:
        ins[r][pos] = dataclass_replace(ins[r][pos], grad_shared=True)
    fresh = round_intra(op, strategy, rounds, ins, price.outs, opts, touched)
    return sum_rounds([fresh[r] if r in touched else t for r, t in enumerate(price.rounds)])


__all__ = [
    "OpPrice",
    "faster_rounds",
    "op_compute",
    "operand_infos",
    "price_op",
    "round_intra",
    "shared_intra",
    "sum_rounds",
]
