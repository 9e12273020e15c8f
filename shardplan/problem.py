"""The planning problem, canonicalised once: `Problem.make(model, mesh, ...)`.

Every search takes a Problem: the model (a Graph, or a builder `batch -> Graph` that the
training-step search calls at each micro-batch size), the mesh bound to its Machine
(`shardplan.hardware`: a preset by name or the user's own value), the cost options (preset,
training or inference, optimizer, precision), the per-device memory budget, the ZeRO stage and,
for the training step, the global batch. `make` is the one gate that turns loose user input
(mesh text, "80GB", dtype, preset, optimizer and machine names) into these values, so no solver
parses anything. Mesh text gets the machine given by `machine`, else `hardware.DEFAULT_MACHINE`
("a100"); a Mesh object keeps its own machine, and naming a different one is an error rather
than a silent choice. The budget is `memory` when given, else the mesh's `memory_bytes` (None:
unchecked); it is the one budget every solver reads, and plans carry their Problem (and their
JSON stores it) so re-planning keeps it. O(1) beyond parsing (and one build of a builder).

Argument checks shared with the other entry points (`shardplan.checks`) run here, before any
solver: a wrong type or value is an ArgumentError naming the argument.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from shardplan import checks
from shardplan.cost import CostOptions
from shardplan.cost.presets import PRESETS, Optimizer
from shardplan.cost.zero import check_stage, check_zero_options
from shardplan.errors import ArgumentError, MeshError
from shardplan.hardware import DEFAULT_MACHINE, Machine
from shardplan.ir.graph import Graph
from shardplan.ir.op import Role
from shardplan.mesh import Mesh, parse_bytes, parse_mesh

Builder = Callable[[int], Graph | None]
"""A model at a batch size (None: it cannot be built at that size)."""

DTYPES = ("bf16", "fp16", "fp32")


@dataclass(frozen=True, slots=True)
class Problem:
    """What to plan: `graph` on `mesh` (bound to its machine) under `options` within `budget`.

    For the training step, `build` rebuilds the model at a micro-batch size (None: only `graph`,
    at the global `batch`, exists) and `batch` is the global batch (samples per step).
    """

    graph: Graph
    mesh: Mesh
    options: CostOptions
    budget: float | None = None
    """Bytes per device a plan must fit; None: unchecked (memory is still reported)."""
    zero: int | None = None
    """The ZeRO stage the plan must use (0-3, `cost/zero.py`); None: D-Rec picks one only when
    the budget needs it, other methods plan at stage 0. The searches price stage 0."""
    batch: int | None = None
    """The global batch; None: the leading dim of the graph's first input."""
    build: Builder | None = field(default=None, compare=False, repr=False)

    @property
    def hardware(self) -> Machine:
        assert self.mesh.hardware is not None  # a Mesh always binds its Machine
        return self.mesh.hardware

    @property
    def global_batch(self) -> int:
        """The global batch of a training-step problem (given, or read off the graph)."""
        return self.batch if self.batch is not None else graph_batch(self.graph)

    def builder(self) -> Builder:
        """The model at batch b: the user's builder, else the graph itself at its own batch."""
        if self.build is not None:
            return self.build
        graph, batch = self.graph, self.global_batch
        return lambda b: graph if b == batch else None

    @classmethod
    def make(
        cls,
        model: Graph | Builder,
        mesh: Mesh | str | int,
        *,
        machine: str | Machine | None = None,
        train: bool = True,
        memory: float | str | None = None,
        preset: str = "shardplan",
        optimizer: str = "adam",
        zero: int | None = None,
        dtype: str | None = None,
        batch: int | None = None,
    ) -> Problem:
        """The canonical Problem of loose arguments (see the module docstring)."""
        if batch is not None:
            checks.positive_int(batch, "batch")
        graph, build = _model(model, batch)
        mesh = _mesh(mesh, machine)
        checks.boolean(train, "train")
        checks.choice(preset, "preset", sorted(PRESETS))
        checks.choice(optimizer, "optimizer", [o.value for o in Optimizer])
        if dtype is not None:
            checks.choice(dtype, "dtype", list(DTYPES))
        budget = parse_bytes(memory) if memory is not None else mesh.memory_bytes
        if budget is not None and budget <= 0:
            raise MeshError(f"memory budget must be positive, got {memory!r}")
        options = CostOptions.make(preset, train, optimizer, dtype)
        if zero is not None:
            check_zero_options(replace(options, zero=check_stage(zero)))
        return cls(graph, mesh, options, budget, zero, batch, build)


def _model(model: object, batch: int | None) -> tuple[Graph, Builder | None]:
    """The graph (at the global batch) and the builder, if the model is one."""
    if isinstance(model, Graph):
        return model, None
    if callable(model):
        if batch is None:
            raise ArgumentError(
                "a model builder (batch -> Graph) needs the global batch: pass batch=N"
            )
        graph = model(batch)
        if not isinstance(graph, Graph):
            raise ArgumentError(
                f"the model builder returned {type(graph).__name__} at the global batch "
                f"{batch}, not a shardplan Graph"
            )
        return graph, model  # type: ignore[return-value]
    raise ArgumentError(
        "graph must be a shardplan Graph (zoo.build, from_torch, from_onnx, from_jaxpr) or, for "
        f"the training step, a builder batch -> Graph; got {type(model).__name__}"
    )


def _mesh(mesh: Mesh | str | int, machine: str | Machine | None) -> Mesh:
    """Mesh text bound to `machine`; a Mesh as it is (naming another machine is an error)."""
    if isinstance(mesh, Mesh):
        name = machine.name if isinstance(machine, Machine) else machine
        if name is not None and name != mesh.machine:
            raise MeshError(
                f"machine {name!r} given for a Mesh built for {mesh.machine!r}; pass mesh "
                f"text (e.g. {mesh.text()!r}) to plan on {name!r}"
            )
        return mesh
    return parse_mesh(mesh, machine or DEFAULT_MACHINE)


def graph_batch(graph: Graph) -> int:
    """The batch of a graph: the leading dim of its first input."""
    for t in graph.tensors.values():
        if t.role is Role.INPUT and t.shape:
            return t.shape[0]
    raise ArgumentError(
        f"graph {graph.name!r} has no input to read the batch size from; pass batch="
    )


__all__ = ["DTYPES", "Builder", "Problem", "graph_batch"]
