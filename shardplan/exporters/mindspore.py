"""A plan as MindSpore `in_strategy`: per operator, the split count of every operand dim.

`in_strategy(plan, op)` is the product, over the rounds that split a dim, of their q (the rounds
of one mesh axis multiply); a replicated or partial round contributes 1. O(|ops| * rounds * rank).
"""

from __future__ import annotations

from shardplan.plans import Plan
from shardplan.sharding import in_strategy as _in_strategy

InStrategy = tuple[tuple[int, ...], ...]


def in_strategy(plan: Plan, op_name: str) -> InStrategy:
    """MindSpore `in_strategy` of `op_name` under `plan` (split count per operand dim)."""
    op = plan.graph.op(op_name)
    return _in_strategy(op, plan.strategies[op_name], plan.graph, plan.mesh)


def mindspore_strategies(plan: Plan) -> dict[str, InStrategy]:
    """MindSpore `in_strategy` of every op of `plan`, in graph order."""
    return {op.name: in_strategy(plan, op.name) for op in plan.graph.ops}


__all__ = ["InStrategy", "in_strategy", "mindspore_strategies"]
