"""Memory per device as a sum of per-op pieces: linear in one-hot strategy variables (the ILP).

`evaluate.memory_per_device` splits exactly into pieces that depend on one op's strategy only:
  * parameter state of every parameter whose first consumer (op, operand) it is: the parameter
    lives in that operand's layout (its "home"), times weights + gradients + optimizer state;
  * training: the op's outputs (resolved layouts, kept for backward) and every graph input it is
    the first consumer of (once per operand position, as the evaluator counts it);
  * inference: the op's working set (outputs + non-parameter inputs), whose maximum over ops is
    the activation term.
So param = sum of param pieces, activations = sum of activation pieces (training) or max of
working sets (inference). O(rounds * operands) per (op, strategy).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardplan.cost.presets import CostOptions
from shardplan.cost.terms import local_bytes, param_bytes, round_numels
from shardplan.ir.graph import Graph
from shardplan.ir.op import Role
from shardplan.mesh import Round
from shardplan.sharding import Strategy, operand_layout, resolved


@dataclass(frozen=True, slots=True)
class MemoryPieces:
    """Bytes per device one op's strategy contributes (see the module docstring)."""

    param: float
    activation: float
    working_set: float


def memory_pieces(
    graph: Graph, index: int, strategy: Strategy, rounds: Sequence[Round], opts: CostOptions
) -> MemoryPieces:
    """The pieces of op `graph.ops[index]` under `strategy`."""
    op = graph.ops[index]
    param = activation = work = 0.0
    for pos, name in enumerate(op.inputs):
        t = graph.tensors[name]
        layout = operand_layout(op, strategy, pos)
        if t.role is Role.PARAMETER:
            if graph.consumers[name][0] == (index, pos):
                local = round_numels(t.numel, layout, rounds)[-1]
                param += param_bytes(local, opts.element_bytes(t), opts)
            continue
        if opts.train:
            if t.role is Role.INPUT and graph.consumers[name][0][0] == index:
                activation += local_bytes(graph, name, layout, rounds, opts)
        else:
            work += local_bytes(graph, name, layout, rounds, opts)
    for pos, name in enumerate(op.outputs):
        local = local_bytes(
            graph, name, resolved(operand_layout(op, strategy, pos, True)), rounds, opts
        )
        if opts.train:
            activation += local
        else:
            work += local
    return MemoryPieces(param, activation, work)


@dataclass(frozen=True, slots=True)
class PieceArrays:
    """The pieces of every strategy of one op, as arrays aligned with its strategy list."""

    param: np.ndarray
    activation: np.ndarray
    working_set: np.ndarray


def memory_piece_arrays(
    graph: Graph,
    rounds: Sequence[Round],
    strategies: Sequence[Sequence[Strategy]],
    opts: CostOptions,
) -> list[PieceArrays]:
    """`memory_pieces` of every strategy of every op (strategies index-aligned with graph.ops)."""
    out = []
    for index, options in enumerate(strategies):
        pieces = [memory_pieces(graph, index, s, rounds, opts) for s in options]
        out.append(
            PieceArrays(
                np.array([p.param for p in pieces]),
                np.array([p.activation for p in pieces]),
                np.array([p.working_set for p in pieces]),
            )
        )
    return out


def memory_from_pieces(pieces: Sequence[MemoryPieces], train: bool) -> tuple[float, float]:
    """(parameter bytes, activation bytes) per device, as `memory_per_device` returns them."""
    param = sum(p.param for p in pieces)
    if train:
        return param, sum(p.activation for p in pieces)
    return param, max((p.working_set for p in pieces), default=0.0)
