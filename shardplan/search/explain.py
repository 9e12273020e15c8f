"""Why an op has its strategy: every candidate cut per round, priced by the one evaluator.

For op X of a plan and each round r, every cut c of that round (each splittable loop dim that
divides, and "none") gives the strategy s' = X's strategy with round r set to c; the plan with X
swapped to s' (every other op unchanged) is scored by `cost.evaluate.op_terms`, the walk the
evaluator sums, and its terms are attributed:
  intra        X's own collectives (and share credits of the operands it reads second);
  compute      X's compute over its cuts;
  edges        each redistribution that X's strategy takes part in: into X from a producer or a
               parameter home, out of X into each consumer, and from the homes of parameters X
               reads first (their home is X's layout) into their other readers;
  rest         every other term of the plan, which X's strategy does not touch, and the
               plan's ZeRO collectives (`cost/zero.py`), re-derived for the swapped plan.
intra + compute + sum(edges) + rest is the evaluator's total for the swapped plan (tests check
it against `evaluate_strategies`). Cost: one evaluator pass per candidate, i.e.
O(rounds * dims * (|V| + |E|)) for one op. `replan` re-runs the search with X fixed to a
candidate (the `--force` what-if) and returns that plan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from shardplan.cost.evaluate import (
    evaluate_strategies,
    op_terms,
    output_layouts,
    param_homes,
)
from shardplan.cost.zero import zero_layouts, zero_pricing
from shardplan.errors import PlanError
from shardplan.ir.op import Role
from shardplan.plans import Plan
from shardplan.sharding import Layout, Strategy, check_strategy


@dataclass(frozen=True, slots=True)
class EdgeCost:
    """A redistribution that depends on the explained op: `tensor` between it and `neighbour`."""

    neighbour: str
    tensor: str
    direction: str  # "in" (into the op), "out" (to a consumer), "home" (parameter it homes)
    cost: float


@dataclass(frozen=True, slots=True)
class Candidate:
    """One cut of one round for the explained op, and what the plan costs with it."""

    round: int
    cut: str | None
    strategy: Strategy
    chosen: bool
    problem: str | None = None  # why the cut is not valid (then no terms)
    intra: float = math.nan
    compute: float = math.nan
    edges: tuple[EdgeCost, ...] = ()
    rest: float = math.nan
    total: float = math.nan
    memory_per_device: float = math.nan

    @property
    def redistribution(self) -> float:
        return math.fsum(e.cost for e in self.edges)

    @property
    def parts_sum(self) -> float:
        """intra + compute + redistribution + rest: equals `total`."""
        return math.fsum((self.intra, self.compute, self.redistribution, self.rest))


def swap_terms(plan: Plan, op_name: str, strategy: Strategy) -> Candidate:
    """The terms of `plan` with `op_name` swapped to `strategy` (see the module docstring)."""
    graph, mesh, opts = plan.graph, plan.mesh, plan.options
    strategies = dict(plan.strategies)
    strategies[op_name] = strategy
    # a ZeRO plan's stage follows the swap: its shards and collectives are re-derived
    zero = zero_pricing(graph, mesh.rounds, strategies, opts, _zero_layouts(plan, strategies))
    stored = {} if plan.zero else plan.param_layouts
    homes = param_homes(graph, strategies, stored)
    out_layout = output_layouts(graph, strategies)
    x = graph.op_index[op_name]
    op = graph.ops[x]
    homed = {
        name
        for name in op.inputs
        if graph.tensors[name].role is Role.PARAMETER
        and name not in stored
        and graph.consumers[name][0][0] == x
    }
    intra = compute = 0.0
    rest: list[float] = []
    edges: list[EdgeCost] = []
    for t in op_terms(graph, mesh, strategies, opts, homes, out_layout):
        if t.index == x:
            intra, compute = t.intra.total, t.compute
            for e in t.edges:
                src = graph.producer.get(e.tensor)
                who = graph.ops[src].name if src is not None else f"{e.tensor} (stored)"
                edges.append(EdgeCost(who, e.tensor, "in", e.terms.total))
            continue
        rest += [t.intra.total, t.compute]
        for e in t.edges:
            if e.tensor in op.outputs:
                edges.append(EdgeCost(t.op.name, e.tensor, "out", e.terms.total))
            elif e.tensor in homed:
                edges.append(EdgeCost(t.op.name, e.tensor, "home", e.terms.total))
            else:
                rest.append(e.terms.total)
    rest += [terms.total for terms in zero.by_reader.values()]
    cost = evaluate_strategies(graph, mesh, strategies, opts, _zero_layouts(plan, strategies))
    return Candidate(
        -1,
        None,
        strategy,
        tuple(strategy) == tuple(plan.strategies[op_name]),
        None,
        intra,
        compute,
        tuple(edges),
        math.fsum(rest),
        cost.total,
        cost.memory_per_device,
    )


def candidates(plan: Plan, op_name: str) -> list[Candidate]:
    """Every cut of every round for `op_name`, the other rounds kept as the plan has them."""
    op = plan.graph.op(op_name)
    current = tuple(plan.strategies[op_name])
    out: list[Candidate] = []
    for r in range(len(plan.mesh.rounds)):
        cuts: list[str | None] = [d.name for d in op.signature.loop_dims if d.splittable]
        cuts.append(None)
        for cut in cuts:
            strategy = current[:r] + (cut,) + current[r + 1 :]
            try:
                check_strategy(op, strategy, plan.mesh.rounds)
            except PlanError as e:
                out.append(Candidate(r, cut, strategy, False, str(e).split(": ", 1)[-1]))
                continue
            c = swap_terms(plan, op_name, strategy)
            out.append(
                Candidate(
                    r,
                    cut,
                    strategy,
                    strategy == current,
                    None,
                    c.intra,
                    c.compute,
                    c.edges,
                    c.rest,
                    c.total,
                    c.memory_per_device,
                )
            )
    return out


def _zero_layouts(plan: Plan, strategies: Mapping[str, Strategy]) -> Mapping[str, Layout]:
    """The stored parameter layouts of `plan`'s ZeRO stage under `strategies`."""
    if plan.zero == 3:
        return zero_layouts(plan.graph, plan.mesh.rounds, strategies)
    return {} if plan.zero else plan.param_layouts


def replan(plan: Plan, fixed: Mapping[str, Strategy], method: str = "drec") -> Plan:
    """`plan`'s Problem (its budget, machine, options) searched again with `fixed` ops pinned
    (the `--force` what-if); a plan built by hand has the Problem of its graph, mesh, options."""
    from dataclasses import replace

    from shardplan.problem import Problem
    from shardplan.search.api import solve

    problem = plan.problem or Problem(plan.graph, plan.mesh, replace(plan.options, zero=0))
    zero = problem.zero if problem.zero is not None else plan.zero or None
    problem = replace(problem, options=replace(problem.options, zero=0), zero=zero)
    return solve(problem, method, fixed=fixed)


def strategy_diff(a: Plan, b: Plan) -> list[tuple[str, Strategy, Strategy, float]]:
    """Ops whose strategy differs between two plans of the same graph: (name, a's, b's, the
    op's own cost in b minus in a), in graph order. PlanError if the graphs differ."""
    missing = sorted(set(a.strategies) ^ set(b.strategies))
    if missing:
        raise PlanError(
            f"the plans are of different graphs ({a.graph.name} and {b.graph.name}): ops "
            f"{missing[:5]} are in only one of them"
        )
    if len(a.mesh.rounds) != len(b.mesh.rounds):
        raise PlanError(
            f"the plans are for meshes {a.mesh.text()} and {b.mesh.text()} with different "
            "rounds; diff compares plans of one mesh"
        )
    assert a.cost is not None and b.cost is not None
    ca = {c.name: c.total for c in a.cost.ops}
    cb = {c.name: c.total for c in b.cost.ops}
    return [
        (
            op.name,
            tuple(a.strategies[op.name]),
            tuple(b.strategies[op.name]),
            cb[op.name] - ca[op.name],
        )
        for op in a.graph.ops
        if tuple(a.strategies[op.name]) != tuple(b.strategies[op.name])
    ]
