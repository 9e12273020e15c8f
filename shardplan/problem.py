"""The planning problem, canonicalised once: `Problem.make(graph, mesh, ...)`.

Every search takes a Problem: the graph, the mesh bound to its machine (`shardplan.hardware`),
the cost options and the per-device memory budget. `make` is the one gate that turns loose user
input (mesh text, "80GB", preset and optimizer names) into these values, so no solver parses
anything. Mesh text gets the machine named by `machine`, else `hardware.DEFAULT_MACHINE`
("a100"); a Mesh object keeps its own machine, and naming a different one is an error rather than
a silent choice. The budget is `memory` when given, else the mesh's `memory_bytes` (None:
unchecked). O(1) beyond parsing.

Argument checks shared with the other entry points (`shardplan.checks`) run here, before any
solver: a wrong type or value is an ArgumentError naming the argument.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from shardplan import checks
from shardplan.cost import CostOptions
from shardplan.cost.presets import PRESETS, Optimizer
from shardplan.cost.zero import check_stage, check_zero_options
from shardplan.errors import ArgumentError, MeshError
from shardplan.hardware import DEFAULT_MACHINE, Machine, get_machine
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh, parse_bytes, parse_mesh


@dataclass(frozen=True, slots=True)
class Problem:
    """What to plan: `graph` on `mesh` (bound to its machine) under `options` within `budget`."""

    graph: Graph
    mesh: Mesh
    options: CostOptions
    budget: float | None = None
    """Bytes per device a plan must fit; None: unchecked (memory is still reported)."""
    zero: int | None = None
    """The ZeRO stage the plan must use (0-3, `cost/zero.py`); None: D-Rec picks one only when
    the budget needs it, other methods plan at stage 0. The searches price stage 0."""

    @property
    def hardware(self) -> Machine:
        return get_machine(self.mesh.machine)

    @classmethod
    def make(
        cls,
        graph: Graph,
        mesh: Mesh | str | int,
        *,
        machine: str | None = None,
        train: bool = True,
        memory: float | str | None = None,
        preset: str = "shardplan",
        optimizer: str = "adam",
        zero: int | None = None,
    ) -> Problem:
        """The canonical Problem of loose arguments (see the module docstring)."""
        if not isinstance(graph, Graph):
            raise ArgumentError(
                "graph must be a shardplan Graph (zoo.build, from_torch, from_onnx, from_jaxpr), "
                f"got {type(graph).__name__}"
            )
        if isinstance(mesh, Mesh):
            if machine is not None and machine != mesh.machine:
                raise MeshError(
                    f"machine {machine!r} given for a Mesh built for {mesh.machine!r}; pass mesh "
                    f"text (e.g. {mesh.text()!r}) to plan on {machine!r}"
                )
        else:
            mesh = parse_mesh(mesh, machine or DEFAULT_MACHINE)
        checks.boolean(train, "train")
        checks.choice(preset, "preset", sorted(PRESETS))
        checks.choice(optimizer, "optimizer", [o.value for o in Optimizer])
        budget = parse_bytes(memory) if memory is not None else mesh.memory_bytes
        if budget is not None and budget <= 0:
            raise MeshError(f"memory budget must be positive, got {memory!r}")
        options = CostOptions.make(preset, train, optimizer)
        if zero is not None:
            check_zero_options(replace(options, zero=check_stage(zero)))
        return cls(graph, mesh, options, budget, zero)


__all__ = ["Problem"]
