"""Plans: the strategies of every operator, the method that found them, and their predicted cost.

`Plan` is a frozen value; `evaluate(plan)` (the one scorer) recomputes its CostBreakdown from the
strategies alone. Plans leave the process through `shardplan.exporters` (JSON, MindSpore
`in_strategy`, JAX PartitionSpecs, DTensor placements); this module imports none of them.
`validate(plan)` rejects non-dividing cuts, FROZEN cuts and wrong round counts with a
PlanError naming the operator.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from shardplan import units
from shardplan.cost import CostBreakdown, CostOptions, ScoreCache, evaluate_strategies
from shardplan.cost.rows import Rows
from shardplan.cost.zero import check_stage, zero_layouts
from shardplan.errors import PlanError
from shardplan.ir.graph import Graph
from shardplan.ir.op import Role
from shardplan.mesh import Mesh
from shardplan.problem import Problem
from shardplan.sharding import (
    REPLICATED,
    Layout,
    Strategy,
    check_strategies,
    operand_layout,
    resolved,
)


@dataclass(frozen=True, slots=True)
class Plan:
    """A complete sharding plan for `graph` on `mesh`.

    Attributes:
        strategies: op name -> per-round loop dim (or None), for every op of the graph.
        param_layouts: parameters whose storage layout differs from their first consumer's
            (FSDP/ZeRO sharding); others live where their first consumer reads them.
        options: what the cost model prices, including the ZeRO stage (`zero`, 0-3: see
            `with_zero` and `cost/zero.py`).
        status: "ok", or a solver's honest status ("optimal", "time-limit gap=3.1%", ...).
    """

    graph: Graph
    mesh: Mesh
    strategies: Mapping[str, Strategy]
    method: str
    options: CostOptions = field(default_factory=CostOptions)
    search_seconds: float = 0.0
    param_layouts: Mapping[str, Layout] = field(default_factory=dict)
    status: str = "ok"
    notes: tuple[str, ...] = ()
    cost: CostBreakdown | None = None
    problem: Problem | None = field(default=None, compare=False, repr=False)
    """The Problem the plan was solved for (budget, machine, ...); None: built by hand."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategies", MappingProxyType(dict(self.strategies)))
        object.__setattr__(self, "param_layouts", MappingProxyType(dict(self.param_layouts)))
        if self.cost is None:
            validate(self)
            object.__setattr__(
                self,
                "cost",
                evaluate_strategies(
                    self.graph, self.mesh, self.strategies, self.options, self.param_layouts
                ),
            )

    @property
    def zero(self) -> int:
        """The ZeRO stage of the plan's parameter state (0-3, `cost/zero.py`)."""
        return self.options.zero

    def __repr__(self) -> str:
        """One line (the graph and every strategy are fields, not something to print whole)."""
        c = self.cost
        cost = "" if c is None else f", cost {units.cost(c.total, c.units)}"
        memory = "" if c is None else f", {units.nbytes(c.memory_per_device)}/device"
        return (
            f"Plan({self.graph.name!r} on mesh {self.mesh.text()}, method {self.method!r}, "
            f"{len(self.graph.ops)} ops{cost}{memory}, status {self.status!r})"
        )

    def summary(self) -> str:
        """A few lines a person reads: the mesh axes with their links and how many ops each
        splits, the cost split, memory, status and notes. O(ops x rounds)."""
        c, mesh = self.cost, self.mesh
        assert c is not None
        lines = [f"{self.graph.name} on mesh {mesh.text()} ({mesh.machine}), method {self.method}"]
        for axis, (name, size) in enumerate(zip(mesh.names, mesh.shape, strict=True)):
            rounds = [r.index for r in mesh.rounds if r.mesh_axis == axis]
            cut = sum(any(s[r] is not None for r in rounds) for s in self.strategies.values())
            use = f"{cut} of {len(self.graph.ops)} ops split" if size > 1 else "unused (size 1)"
            lines.append(
                f"  {name} axis ({size}, {units.bandwidth(mesh.bandwidth_bytes_per_s[axis])}): "
                f"{use}"
            )
        cm = c.comm
        lines += [
            f"  cost {units.cost(c.total, c.units)} per step: compute "
            f"{units.cost(c.compute, c.units)}, communication "
            f"{units.cost(cm.total, c.units, c.total)}",
            f"  memory {units.nbytes(c.memory_per_device)} per device (params+grads+optimizer "
            f"{units.nbytes(c.param_memory)}, activations {units.nbytes(c.activation_memory)})",
            f"  status {self.status}" + (f", ZeRO stage {self.zero}" if self.zero else ""),
        ]
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])

    # -- derived views ------------------------------------------------------------------------
    def tensor_layouts(self) -> dict[str, Layout]:
        """Every activation's layout (as its producer leaves it) and every parameter's home."""
        from shardplan.cost.evaluate import param_homes

        layouts: dict[str, Layout] = {}
        for op in self.graph.ops:
            for i, name in enumerate(op.outputs):
                layouts[name] = resolved(operand_layout(op, self.strategies[op.name], i, True))
        layouts.update(param_homes(self.graph, self.strategies, self.param_layouts))
        return layouts

    def input_layouts(self) -> dict[str, Layout]:
        """Graph inputs/constants: the layout their first consumer reads."""
        out: dict[str, Layout] = {}
        for op in self.graph.ops:
            for i, name in enumerate(op.inputs):
                if self.graph.tensors[name].role in (Role.INPUT, Role.CONSTANT) and name not in out:
                    out[name] = operand_layout(op, self.strategies[op.name], i)
        return out


def scored_plan(
    graph: Graph,
    mesh: Mesh,
    strategies: Mapping[str, Strategy],
    method: str,
    options: CostOptions,
    cache: ScoreCache,
    param_layouts: Mapping[str, Layout] | None = None,
    repeats: tuple[Rows, Sequence[int]] | None = None,
) -> Plan:
    """`Plan(...)`, validated and scored alike, with the prices `cache` shares between the plans
    one search scores (repeated layers priced once across them); `repeats`: the rows when a
    fold of repeated blocks knows them (`evaluate_strategies`)."""
    layouts = dict(param_layouts or {})
    _validate(graph, mesh, strategies, layouts, check_cuts=False)  # the evaluator checks them
    cost = evaluate_strategies(graph, mesh, strategies, options, layouts, cache, repeats)
    return Plan(graph, mesh, strategies, method, options, 0.0, layouts, cost=cost)


def validate(plan: Plan) -> None:
    """Raise PlanError (naming the op) unless every op has a valid strategy for the mesh."""
    _validate(plan.graph, plan.mesh, plan.strategies, plan.param_layouts)


def _validate(
    graph: Graph,
    mesh: Mesh,
    strategies: Mapping[str, Strategy],
    param_layouts: Mapping[str, Layout],
    check_cuts: bool = True,
) -> None:
    rounds = mesh.rounds
    missing = [op.name for op in graph.ops if op.name not in strategies]
    if missing:
        raise PlanError(f"plan has no strategy for ops {missing[:5]} ({len(missing)} in all)")
    extra = sorted(set(strategies) - set(graph.op_index))
    if extra:
        raise PlanError(f"plan has strategies for unknown ops {extra[:5]}")
    if check_cuts:
        check_strategies(graph.ops, strategies, rounds)
    for name, layout in param_layouts.items():
        t = graph.tensors.get(name)
        if t is None or t.role is not Role.PARAMETER:
            raise PlanError(f"param_layouts names {name!r}, which is not a parameter")
        if len(layout) != len(rounds):
            raise PlanError(f"parameter {name!r}: layout {layout} needs {len(rounds)} rounds")
        counts = [1] * len(t.shape)
        for r, s in zip(rounds, layout, strict=True):
            if isinstance(s, bool) or not isinstance(s, int) or s < REPLICATED:
                raise PlanError(
                    f"parameter {name!r}: layout {layout} entry {s!r} must be a tensor dim or -1"
                )
            if s >= len(t.shape):
                raise PlanError(f"parameter {name!r}: round {r.index} splits dim {s} of {t.shape}")
            if s >= 0:
                counts[s] *= r.q
        for dim, (size, c) in enumerate(zip(t.shape, counts, strict=True)):
            if size % c:
                raise PlanError(
                    f"parameter {name!r}: dim {dim} of size {size} is not divisible into {c} parts"
                )


def evaluate(plan: Plan, options: CostOptions | None = None) -> CostBreakdown:
    """Score `plan` (optionally under other cost options) with the one evaluator."""
    return evaluate_strategies(
        plan.graph, plan.mesh, plan.strategies, options or plan.options, plan.param_layouts
    )


def with_status(plan: Plan, status: str, notes: tuple[str, ...] = ()) -> Plan:
    return replace(plan, status=status, notes=plan.notes + notes)


def with_zero(plan: Plan, zero: int, cache: ScoreCache | None = None) -> Plan:
    """`plan`'s strategies at ZeRO stage `zero`, scored again (`cache`: one of the new options).

    Stage 3 stores every parameter as its ZeRO shard (`param_layouts`), stages 1-2 each where
    it is read (other layouts, an FSDP plan's, are replaced); stage 0 keeps the plan's own
    layouts unless they were stage 3's. Same method, status and notes."""
    check_stage(zero)
    opts = replace(plan.options, zero=zero)
    rounds = plan.mesh.rounds
    layouts: Mapping[str, Layout] = {}
    if zero == 3:
        layouts = zero_layouts(plan.graph, rounds, plan.strategies)
    elif zero == 0 and plan.zero != 3:
        layouts = plan.param_layouts
    cost = evaluate_strategies(plan.graph, plan.mesh, plan.strategies, opts, layouts, cache)
    return replace(plan, options=opts, param_layouts=layouts, cost=cost)


def spmd_plan(plan: Plan) -> Plan:
    """What an SPMD engine (JAX, DTensor) runs of a ZeRO plan, priced as it runs: stage 0, with
    stage 3's shards kept as stored parameter layouts (gathered where read, gradients
    all-reduced: the "fsdp" pricing); stages 1-2 shard only the optimizer, which the engines
    leave to the user's optimizer. Stage-0 plans are returned as they are."""
    if not plan.zero:
        return plan
    return Plan(
        plan.graph,
        plan.mesh,
        plan.strategies,
        plan.method,
        replace(plan.options, zero=0),
        plan.search_seconds,
        plan.param_layouts,
        plan.status,
        plan.notes,
    )
