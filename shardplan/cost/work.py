"""What one op's piece reads, writes and computes on one device under a strategy.

`op_pieces`: its operands and results as `cost.backward.Piece`s (local bytes, element count,
width, parameter, needs a gradient); `forward_compute`: the roofline of its forward alone, the
part of `cost.terms.compute_cost` the step model puts in the forward; `ideal_compute`: the price
of an op's ideal 1/k piece (FLOPs and forward and backward bytes all divided by k), a lower bound
of any real piece's (each holds at least 1/k of every operand). O(operands x rounds).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from shardplan.cost.backward import Piece, backward_bytes
from shardplan.cost.presets import CostOptions
from shardplan.cost.terms import compute_cost, local_bytes
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role
from shardplan.mesh import Mesh, Round
from shardplan.sharding import Strategy, operand_layout


def op_pieces(
    graph: Graph, op: Op, strategy: Strategy, rounds: Sequence[Round], opts: CostOptions
) -> tuple[list[Piece], list[Piece]]:
    """(inputs, results) of an op as one device holds them under `strategy` (`cost.backward`)."""
    out: tuple[list[Piece], list[Piece]] = ([], [])
    for is_output, names in ((False, op.inputs), (True, op.outputs)):
        for i, name in enumerate(names):
            t = graph.tensors[name]
            lay = operand_layout(op, strategy, i, is_output)
            nbytes = local_bytes(graph, name, lay, rounds, opts)
            grad = name in graph.requires_grad
            piece = Piece(nbytes, t.numel, opts.element_bytes(t), t.role is Role.PARAMETER, grad)
            out[is_output].append(piece)
    return out


def forward_compute(
    graph: Graph, op: Op, strategy: Strategy, mesh: Mesh, opts: CostOptions
) -> float:
    """The forward part of an op's compute (`compute_cost` of its forward alone)."""
    parts = 1
    for r, cut in zip(mesh.rounds, strategy, strict=True):
        if cut is not None:
            parts *= r.q
    ins, outs = op_pieces(graph, op, strategy, mesh.rounds, opts)
    nbytes = sum(p.nbytes for p in (*ins, *outs))
    return compute_cost(op.flops / parts, nbytes, replace(opts, train=False), mesh)


def whole_op_bytes(graph: Graph, op: Op, opts: CostOptions) -> tuple[float, float]:
    """(forward, backward) bytes of the whole, unsplit op (`ideal_compute`'s sizes)."""
    ins, outs = op_pieces(graph, op, (), (), opts)
    return sum(p.nbytes for p in (*ins, *outs)), backward_bytes(op.kind, ins, outs)


def ideal_compute(
    flops: float, sizes: tuple[float, float], k: float, opts: CostOptions, mesh: Mesh
) -> float:
    """`compute_cost` of the op's 1/k piece with everything split: FLOPs, and the forward and
    backward bytes `sizes` of `whole_op_bytes`."""
    fwd, bwd = sizes
    return compute_cost(flops / k, fwd / k, opts, mesh, bwd / k)


__all__ = ["forward_compute", "ideal_compute", "op_pieces", "whole_op_bytes"]
