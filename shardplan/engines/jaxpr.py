"""Run a plain JAX function under a plan's shardings: `apply_plan(fn, plan)`.

    graph = from_jaxpr(fn, params, x, labels)      # shardplan.importers.jaxpr
    p = shardplan.plan(graph, "8")
    sharded_fn = apply_plan(fn, p)                  # same signature and results as fn
    loss = sharded_fn(params, x, labels)

Each call traces `fn` (cached per argument shapes), translates its jaxpr exactly as the importer
does, checks it is the plan's graph, and evaluates the jaxpr equation by equation under `jax.jit`
on the plan's device mesh (`shardplan.exporters.jax.jax_mesh`: one axis per round), constraining
every planned tensor to its layout. O(|equations|) per trace; jax is imported lazily.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from shardplan.errors import PlanError
from shardplan.exporters.jax import axis_names, jax_mesh, partition_spec
from shardplan.importers.jaxpr import (
    OPAQUE,
    import_jaxpr,
    is_dropped,
    leaf_names,
    require_jax,
    sub_jaxpr,
)
from shardplan.ir.graph import Graph
from shardplan.mesh import parse_mesh


def apply_plan(fn: Callable[..., Any], plan: Any, mesh: Any = None) -> Callable[..., Any]:
    """`fn` run under `plan`'s shardings: a function with `fn`'s signature and results.

    Each call traces `fn` on its arguments (cached per argument shapes), translates the jaxpr
    exactly as `from_jaxpr` does and checks that it is the graph the plan was made for (same
    tensor names and shapes, else PlanError). It then evaluates the jaxpr equation by equation
    under `jax.jit` on the plan's device mesh: the parameters (first argument) and inputs are
    placed by the plan's layouts through `in_shardings`, and every value that is a planned tensor
    is constrained to its layout with `jax.lax.with_sharding_constraint` (in training, JAX applies
    the same constraint to its gradient). `mesh` overrides the devices: a shardplan Mesh or mesh
    text with the plan's rounds, or a `jax.sharding.Mesh` whose axes are the rounds (`r0`, ...).
    """
    jax = require_jax()

    jmesh = _device_mesh(plan, mesh)
    layouts = dict(plan.tensor_layouts())
    layouts.update(plan.input_layouts())
    cache: dict[Any, Callable[..., Any]] = {}

    def sharding(tensor: str, rank: int) -> Any:
        from jax.sharding import NamedSharding, PartitionSpec

        layout = layouts.get(tensor)
        if layout is None:
            return NamedSharding(jmesh, PartitionSpec())
        return NamedSharding(jmesh, partition_spec(layout, rank, plan.mesh))

    def build(args: tuple[Any, ...]) -> Callable[..., Any]:
        unknown = "replicate" if any(op.kind == OPAQUE for op in plan.graph.ops) else "error"
        with warnings.catch_warnings():  # from_jaxpr already warned about opaque operators
            warnings.simplefilter("ignore")
            imported = import_jaxpr(fn, *args, name=plan.graph.name, unknown=unknown)
        _check_same_graph(imported.graph, plan.graph)
        closed = imported.closed_jaxpr
        tensor_of = imported.tensor_of
        names = [n for group in leaf_names(fn, args) for n in group]
        in_leaves = []
        for var, n in zip(closed.jaxpr.invars, names, strict=True):
            rank = len(var.aval.shape)
            in_leaves.append(sharding(n, rank) if n in plan.graph.tensors else sharding("", rank))
        treedef = jax.tree_util.tree_structure(args)
        in_shardings = jax.tree_util.tree_unflatten(treedef, in_leaves)

        def constrain(var: Any, value: Any) -> Any:
            tensor = tensor_of.get(var)
            if tensor is None or tensor not in layouts or not hasattr(value, "shape"):
                return value
            if tuple(value.shape) != plan.graph.tensors[tensor].shape:
                return value
            return jax.lax.with_sharding_constraint(value, sharding(tensor, len(value.shape)))

        def run(*call_args: Any) -> Any:
            flat = jax.tree_util.tree_leaves(call_args)
            outs = _evaluate(closed.jaxpr, closed.consts, flat, constrain)
            return jax.tree_util.tree_unflatten(imported.out_tree, outs)

        return jax.jit(run, in_shardings=tuple(in_shardings))

    def sharded(*args: Any) -> Any:
        leaves, treedef = jax.tree_util.tree_flatten(args)
        key = (
            treedef,
            tuple(
                (tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", type(x)))) for x in leaves
            ),
        )
        if key not in cache:
            cache[key] = build(args)
        return cache[key](*args)

    sharded.__name__ = f"sharded_{getattr(fn, '__name__', 'fn')}"
    sharded.__doc__ = f"{getattr(fn, '__name__', 'fn')} under the {plan.method} plan"
    return sharded


def _evaluate(
    jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], constrain: Callable[[Any, Any], Any]
) -> list[Any]:
    """Evaluate `jaxpr`, inlining jit/closed_call sub-jaxprs, constraining every value."""
    jax = require_jax()
    literal = jax.extend.core.Literal
    env: dict[Any, Any] = {}

    def read(atom: Any) -> Any:
        return atom.val if isinstance(atom, literal) else env[atom]

    for var, value in zip(jaxpr.constvars, consts, strict=True):
        env[var] = value
    for var, value in zip(jaxpr.invars, args, strict=True):
        env[var] = constrain(var, value)
    for eqn in jaxpr.eqns:
        invals = [read(a) for a in eqn.invars]
        sub = sub_jaxpr(eqn) if eqn.primitive.name in _INLINE_EVAL else None
        if sub is not None:
            inner, inner_consts = sub
            outvals = _evaluate(
                inner, inner_consts, invals[len(invals) - len(inner.invars) :], constrain
            )
        else:
            bound = eqn.primitive.get_bind_params(eqn.params)
            subfuns, params = ([], bound) if isinstance(bound, dict) else bound  # jax < 0.5
            result = eqn.primitive.bind(*subfuns, *invals, **params)
            outvals = list(result) if eqn.primitive.multiple_results else [result]
        for var, value in zip(eqn.outvars, outvals, strict=True):
            if not is_dropped(var):
                env[var] = constrain(var, value)
    return [read(v) for v in jaxpr.outvars]


_INLINE_EVAL = ("jit", "pjit", "closed_call", "core_call")
"""Sub-jaxprs `apply_plan` evaluates in place (custom_jvp/vjp calls keep their rules)."""


def _device_mesh(plan: Any, mesh: Any) -> Any:

    if mesh is None:
        return jax_mesh(plan.mesh)
    if hasattr(mesh, "axis_names") and hasattr(mesh, "devices"):  # a jax.sharding.Mesh
        want = axis_names(plan.mesh)
        sizes = tuple(r.q for r in plan.mesh.rounds)
        if tuple(mesh.axis_names) != want or tuple(mesh.devices.shape) != sizes:
            raise PlanError(
                f"apply_plan: the JAX mesh has axes {tuple(mesh.axis_names)} of sizes "
                f"{tuple(mesh.devices.shape)}; the plan needs {want} of sizes {sizes}"
            )
        return mesh
    parsed = parse_mesh(mesh)
    if [r.q for r in parsed.rounds] != [r.q for r in plan.mesh.rounds]:
        raise PlanError(
            f"apply_plan: mesh {parsed.text()} has rounds "
            f"{[r.q for r in parsed.rounds]} but the plan was made for mesh "
            f"{plan.mesh.text()} with rounds {[r.q for r in plan.mesh.rounds]}"
        )
    return jax_mesh(parsed)


def _check_same_graph(got: Graph, want: Graph) -> None:
    diff = [
        n
        for n, t in want.tensors.items()
        if n not in got.tensors or got.tensors[n].shape != t.shape
    ]
    if diff or len(got.ops) != len(want.ops):
        n = diff[0] if diff else ""
        detail = (
            f"tensor {n!r} is {want.tensors[n].shape} in the plan but "
            f"{got.tensors[n].shape if n in got.tensors else 'missing'} in the traced "
            "function"
            if diff
            else f"{len(want.ops)} ops in the plan, {len(got.ops)} traced"
        )
        raise PlanError(
            f"apply_plan: the plan was made for another graph than this function's "
            f"on these arguments ({detail}); plan the graph of from_jaxpr(fn, *args)"
        )


__all__ = ["apply_plan"]
