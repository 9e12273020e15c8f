"""Plans: the strategies of every operator, the method that found them, and their predicted cost.

`Plan` is a frozen value; `evaluate(plan)` (the one scorer) recomputes its CostBreakdown from the
strategies alone. `to_json`/`from_json` round-trip exactly (schema "shardplan.plan/1": the graph,
the mesh, the options and the strategies are stored; the cost is stored for readers and recomputed
on load). `validate(plan)` rejects non-dividing cuts, FROZEN cuts and wrong round counts with a
PlanError naming the operator.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from shardplan.cost import CostBreakdown, CostOptions, Optimizer, evaluate_strategies, get_preset
from shardplan.errors import PlanError
from shardplan.ir.graph import Graph
from shardplan.ir.op import Role
from shardplan.ir.serialize import graph_from_dict, graph_to_dict
from shardplan.mesh import Mesh
from shardplan.sharding import (
    Layout,
    Strategy,
    check_strategy,
    in_strategy,
    layout_text,
    local_shape,
    operand_layout,
    resolved,
)

SCHEMA = "shardplan.plan/1"


@dataclass(frozen=True, slots=True)
class Plan:
    """A complete sharding plan for `graph` on `mesh`.

    Attributes:
        strategies: op name -> per-round loop dim (or None), for every op of the graph.
        param_layouts: parameters whose storage layout differs from their first consumer's
            (FSDP/ZeRO sharding); others live where their first consumer reads them.
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

    # -- derived views ------------------------------------------------------------------------
    def in_strategy(self, op_name: str) -> tuple[tuple[int, ...], ...]:
        op = self.graph.op(op_name)
        return in_strategy(op, self.strategies[op_name], self.graph, self.mesh)

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

    def mindspore_strategies(self) -> dict[str, tuple[tuple[int, ...], ...]]:
        """MindSpore `in_strategy` of every op (split count per operand dim)."""
        return {op.name: self.in_strategy(op.name) for op in self.graph.ops}

    # convenience entry points; the exporters own the logic (imported lazily, torch/jax optional)
    def placements(self) -> dict[str, Any]:
        """DTensor placements per tensor over a DeviceMesh with one dim per round."""
        from shardplan.exporters.dtensor import placements

        return placements(self)

    def partition_specs(self) -> dict[str, Any]:
        """JAX PartitionSpecs per tensor over a jax Mesh with one axis per round."""
        from shardplan.backends.jax import partition_spec

        return {
            name: partition_spec(layout, len(self.graph.tensors[name].shape), self.mesh)
            for name, layout in {**self.input_layouts(), **self.tensor_layouts()}.items()
        }

    def op_rows(self) -> list[dict[str, Any]]:
        rounds = self.mesh.rounds
        rows = []
        costs = {c.name: c for c in (self.cost.ops if self.cost else ())}
        for op in self.graph.ops:
            strategy = self.strategies[op.name]
            c = costs.get(op.name)
            rows.append(
                {
                    "name": op.name,
                    "kind": op.kind,
                    "layer": op.layer,
                    "strategy": [d for d in strategy],
                    "in_strategy": [list(s) for s in self.in_strategy(op.name)],
                    "local_shapes": [
                        list(
                            local_shape(
                                self.graph.tensors[t].shape, operand_layout(op, strategy, i), rounds
                            )
                        )
                        for i, t in enumerate(op.inputs)
                    ],
                    "output_layout": [
                        layout_text(operand_layout(op, strategy, i, True))
                        for i in range(len(op.outputs))
                    ],
                    "comm": (c.intra + c.redistribution) if c else 0.0,
                    "activation_bytes": c.activation_bytes if c else 0.0,
                }
            )
        return rows

    # -- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "model": self.graph.name,
            "mesh": self.mesh.to_dict(),
            "method": self.method,
            "status": self.status,
            "search_seconds": self.search_seconds,
            "options": {
                "preset": self.options.preset.name,
                "train": self.options.train,
                "optimizer": self.options.optimizer.value,
                "dtype": self.options.precision.name if self.options.precision else None,
            },
            "cost": self.cost.to_dict() if self.cost else None,
            "notes": list(self.notes),
            "ops": self.op_rows(),
            "param_layouts": {k: list(v) for k, v in self.param_layouts.items()},
            "graph": graph_to_dict(self.graph),
        }

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_json(cls, text: str | dict[str, Any]) -> Plan:
        try:
            data = json.loads(text) if isinstance(text, str) else text
        except json.JSONDecodeError as e:
            raise PlanError(f"plan JSON does not parse: {e}") from e
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise PlanError(
                f"not a shardplan plan (schema must be {SCHEMA!r}); "
                "write plans with `shardplan plan --json FILE`"
            )
        try:
            graph = graph_from_dict(data["graph"])
            mesh = Mesh.from_dict(data["mesh"])
            o = data["options"]
            options = CostOptions.make(
                get_preset(o["preset"]), bool(o["train"]), Optimizer(o["optimizer"]), o.get("dtype")
            )
            strategies = {row["name"]: tuple(row["strategy"]) for row in data["ops"]}
            params = {k: tuple(v) for k, v in data.get("param_layouts", {}).items()}
            return cls(
                graph,
                mesh,
                strategies,
                str(data["method"]),
                options,
                float(data["search_seconds"]),
                params,
                str(data.get("status", "ok")),
                tuple(data.get("notes", ())),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise PlanError(f"plan JSON is malformed: {e!r}") from e


def validate(plan: Plan) -> None:
    """Raise PlanError (naming the op) unless every op has a valid strategy for the mesh."""
    rounds = plan.mesh.rounds
    missing = [op.name for op in plan.graph.ops if op.name not in plan.strategies]
    if missing:
        raise PlanError(f"plan has no strategy for ops {missing[:5]} ({len(missing)} in all)")
    extra = sorted(set(plan.strategies) - set(plan.graph.op_index))
    if extra:
        raise PlanError(f"plan has strategies for unknown ops {extra[:5]}")
    for op in plan.graph.ops:
        check_strategy(op, tuple(plan.strategies[op.name]), rounds)
    for name, layout in plan.param_layouts.items():
        t = plan.graph.tensors.get(name)
        if t is None or t.role is not Role.PARAMETER:
            raise PlanError(f"param_layouts names {name!r}, which is not a parameter")
        if len(layout) != len(rounds):
            raise PlanError(f"parameter {name!r}: layout {layout} needs {len(rounds)} rounds")
        counts = [1] * len(t.shape)
        for r, s in zip(rounds, layout, strict=True):
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
