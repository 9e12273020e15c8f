"""The front door of the search: `plan(graph, mesh, method=...)` -> Plan, with the memory driver.

Methods: "drec" (default), "ilp", "dp", and the expert plans "data-parallel", "megatron",
"fsdp". Whatever the method, the returned Plan is scored by the one evaluator. With a memory
budget (bytes per device) a plan that exceeds it is never returned: D-Rec reacts by re-running
with a growing penalty on bytes left replicated (lambda_k = 4^k * cost / budget, k = 0..7), then by
sharding the storage of parameters it replicates (ZeRO-style); if even that does not fit it raises
InfeasibleError saying by how much. Other methods raise InfeasibleError when over budget.
"""

from __future__ import annotations

import math
import time
from typing import Any

from shardplan.cost import CostOptions
from shardplan.errors import InfeasibleError, SolverError
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh, parse_bytes, parse_mesh
from shardplan.plan import Plan, with_status
from shardplan.search import experts
from shardplan.search.drec import drec

METHODS = ("drec", "ilp", "dp", *experts.EXPERTS)


def plan(
    graph: Graph,
    mesh: Mesh | str | int,
    method: str = "drec",
    train: bool = True,
    memory: float | str | None = None,
    preset: str = "shardplan",
    optimizer: str = "adam",
    **options: Any,
) -> Plan:
    """Plan `graph` on `mesh` with `method`; raise InfeasibleError rather than exceed `memory`.

    Args:
        graph: a verified Graph (zoo.build, from_torch, from_onnx, from_jaxpr).
        mesh: a Mesh or mesh text ("8", "2x8", "4x8").
        method: one of METHODS.
        train: model the backward pass and optimizer state (default) or inference.
        memory: per-device budget in bytes or text ("80GB"); None: unchecked (still reported).
        preset: cost preset, "shardplan" or "mindspore".
        options: method options (ilp/dp: time_limit seconds).
    """
    mesh = parse_mesh(mesh)
    budget = parse_bytes(memory) if memory is not None else mesh.memory_bytes
    opts = CostOptions.make(preset, train, optimizer)
    if method not in METHODS:
        raise SolverError(f"unknown method {method!r}; choose one of {list(METHODS)}")
    start = time.perf_counter()
    if method == "drec":
        result = _drec_within(graph, mesh, opts, budget, start)
    elif method == "ilp":
        from shardplan.search.ilp import solve_ilp

        result = solve_ilp(graph, mesh, opts, memory=budget, **options)
    elif method == "dp":
        from shardplan.search.dp import solve_dp

        result = solve_dp(graph, mesh, opts, **options)
    else:
        result = _expert(graph, mesh, opts, method, start)
    if budget is not None and result.cost is not None and result.cost.memory_per_device > budget:
        raise InfeasibleError(
            f"{method} plan of {graph.name!r} on mesh {mesh.text()} needs "
            f"{result.cost.memory_per_device / 1e9:.3g} GB per device, over the "
            f"{budget / 1e9:.3g} GB budget by {(result.cost.memory_per_device - budget) / 1e9:.3g}"
            " GB; use more devices, a smaller batch, method 'drec'/'fsdp', or plan the training "
            "step with --dtype bf16 (micro-batches, recomputation, ZeRO, pipeline stages)"
        )
    unused = unused_devices_note(result)
    return with_status(result, result.status, (unused,)) if unused else result


def unused_devices_note(p: Plan) -> str | None:
    """Say so when a plan leaves rounds of the mesh unused (every op replicated across them):
    the planner found that spreading the work over those links costs more than it saves."""
    rounds = p.mesh.rounds
    idle = [r for r in range(len(rounds)) if all(s[r] is None for s in p.strategies.values())]
    if not idle:
        return None
    parts = []
    for axis, name in enumerate(p.mesh.names):
        ways = math.prod(rounds[r].q for r in idle if rounds[r].mesh_axis == axis)
        size = p.mesh.shape[axis]
        if ways == size:
            parts.append(f"mesh axis {name!r} ({size}-way)")
        elif ways > 1:
            parts.append(f"{ways} of the {size} ways of mesh axis {name!r}")
    return (
        f"{' and '.join(parts)} left unused: every op is replicated across it, because "
        "splitting this model and batch over those links costs more time than it saves; a "
        "larger batch would use it (or plan on fewer devices)"
    )


def _expert(graph: Graph, mesh: Mesh, opts: CostOptions, method: str, start: float) -> Plan:
    params: dict[str, tuple[int, ...]] = {}
    if method == "data-parallel":
        strategies = experts.data_parallel(graph, mesh)
    elif method == "megatron":
        strategies = experts.megatron(graph, mesh)
    else:
        strategies = experts.data_parallel(graph, mesh)
        params = experts.fsdp_param_layouts(graph, mesh)
    return Plan(graph, mesh, strategies, method, opts, time.perf_counter() - start, params)


def _drec_within(
    graph: Graph, mesh: Mesh, opts: CostOptions, budget: float | None, start: float
) -> Plan:
    strategies = drec(graph, mesh, opts)
    best = Plan(graph, mesh, strategies, "drec", opts, time.perf_counter() - start)
    assert best.cost is not None
    if budget is None or best.cost.memory_per_device <= budget:
        return best
    notes: list[str] = [
        f"unconstrained D-Rec plan needs {best.cost.memory_per_device / 1e9:.3g}"
        f" GB > {budget / 1e9:.3g} GB budget"
    ]
    base = max(best.cost.total, 1e-30)
    leanest = best
    for k in range(8):
        lam = base / budget * 4.0**k
        candidate = Plan(graph, mesh, drec(graph, mesh, opts, lam), "drec", opts)
        assert candidate.cost is not None and leanest.cost is not None
        if candidate.cost.memory_per_device < leanest.cost.memory_per_device:
            leanest = candidate
        if candidate.cost.memory_per_device <= budget:
            notes.append(f"memory penalty lambda=4^{k}*cost/budget made it fit")
            return Plan(
                graph,
                mesh,
                candidate.strategies,
                "drec",
                opts,
                time.perf_counter() - start,
                notes=tuple(notes),
            )
    sharded = _shard_replicated_params(leanest)
    assert sharded.cost is not None
    if sharded.cost.memory_per_device <= budget:
        notes.append("parameters kept replicated by the plan are stored sharded (ZeRO-style)")
        return Plan(
            graph,
            mesh,
            sharded.strategies,
            "drec",
            opts,
            time.perf_counter() - start,
            sharded.param_layouts,
            notes=tuple(notes),
        )
    raise InfeasibleError(
        f"no D-Rec plan of {graph.name!r} fits {budget / 1e9:.3g} GB per device on mesh "
        f"{mesh.text()}: the leanest needs {sharded.cost.memory_per_device / 1e9:.3g} GB "
        f"(over by {(sharded.cost.memory_per_device - budget) / 1e9:.3g} GB); use more devices, "
        "a smaller batch, a larger --memory, or plan the training step with --dtype bf16 "
        "(micro-batches, recomputation, ZeRO, pipeline stages)"
    )


def _shard_replicated_params(p: Plan) -> Plan:
    """Store each parameter split, in the rounds where its home layout replicates it."""
    homes = p.tensor_layouts()
    layouts: dict[str, tuple[int, ...]] = {}
    for t in p.graph.parameters:
        layout = list(homes[t.name])
        local = list(t.shape)
        for r, rnd in enumerate(p.mesh.rounds):
            if layout[r] >= 0:
                local[layout[r]] //= rnd.q
        for r, rnd in enumerate(p.mesh.rounds):
            if layout[r] < 0:
                options = [d for d in range(len(local)) if local[d] % rnd.q == 0]
                if options:
                    d = max(options, key=lambda k: (local[k], -k))
                    local[d] //= rnd.q
                    layout[r] = d
        layouts[t.name] = tuple(layout)
    return Plan(p.graph, p.mesh, p.strategies, p.method, p.options, p.search_seconds, layouts)
