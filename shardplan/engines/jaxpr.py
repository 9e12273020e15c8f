"""Run a plain JAX function under a plan's shardings: `shard(fn, plan, mesh)` (`apply_plan` is
its earlier name; users reach it as `shardplan.jax.shard`).

    graph = shardplan.from_jaxpr(fn, params, x, labels)      # fn(params, x, labels)
    p = shardplan.plan(graph, shardplan.Mesh((2, 4), ("data", "model")))
    sharded_fn = shardplan.jax.shard(fn, p)                   # same signature and results
    loss = sharded_fn(params, x, labels)

Each call traces `fn` on its arguments (cached per argument shapes), translates the jaxpr exactly
as `from_jaxpr` does and checks that it is the graph the plan was made for (same tensor names
and shapes, else PlanError). It then evaluates the jaxpr equation by equation under `jax.jit`:
the parameters (first argument) and inputs are placed by the plan's layouts through
`in_shardings`, and every value that is a planned tensor is constrained to its layout with
`jax.lax.with_sharding_constraint` (in training, JAX applies the same constraint to its
gradient), so `jax.grad` of the sharded function is sharded too.

PartitionSpecs (`partition_specs`): a plan cuts once per prime ROUND; a mesh axis of 4 has two
rounds. When every round of each mesh axis splits the same tensor dim (or none) for every
tensor, the specs name the mesh's own axes (`P("data", None, "model")`) and the JAX mesh has the
plan's axis names and shape; otherwise they name round axes (`r0`, `r1`, ...) on a round-shaped
mesh made from the same devices in the same order (`shardplan.exporters.jax.partition_specs`).
Partial sums are not a JAX sharding: a tensor's spec is its resolved layout (XLA inserts the
reductions).
Costs: O(|tensors| * rounds) for the specs; one trace and one translation per argument shape.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

from shardplan.errors import PlanError
from shardplan.exporters.jax import axis_layouts, axis_names, jax_mesh, partition_specs
from shardplan.importers.jaxpr import (
    import_jaxpr,
    is_dropped,
    leaf_names,
    require_jax,
    sub_jaxpr,
)
from shardplan.ir.graph import Graph
from shardplan.ir.traits import Trait, has_trait
from shardplan.mesh import Mesh, parse_mesh


def _jax_mesh(plan: Any, mesh: Any) -> tuple[Any, tuple[str, ...] | None]:
    """The jax Mesh to run on, and the axis names the specs use (None: round axes)."""
    import numpy as np
    from jax.sharding import Mesh as JaxMesh

    expressible = axis_layouts(plan) is not None and bool(plan.mesh.rounds)
    rounds = tuple(r.q for r in plan.mesh.rounds)
    round_names = axis_names(plan.mesh)
    if mesh is None or isinstance(mesh, (str, int, Mesh)):
        parsed = plan.mesh if mesh is None else parse_mesh(mesh)
        if tuple(r.q for r in parsed.rounds) != rounds:
            raise PlanError(
                f"shard: mesh {parsed.text()} has rounds {[r.q for r in parsed.rounds]} but the "
                f"plan was made for mesh {plan.mesh.text()} with rounds {list(rounds)}"
            )
        round_mesh = jax_mesh(parsed)
        if expressible and parsed.shape == plan.mesh.shape:
            devices = round_mesh.devices.reshape(plan.mesh.shape)
            return JaxMesh(devices, parsed.names), tuple(parsed.names)
        return round_mesh, None
    if not (hasattr(mesh, "axis_names") and hasattr(mesh, "devices")):
        raise PlanError(
            f"shard: mesh must be a jax.sharding.Mesh, a shardplan Mesh or mesh text, "
            f"not {type(mesh).__name__}"
        )
    names, shape = tuple(mesh.axis_names), tuple(mesh.devices.shape)
    if names == round_names and shape == rounds:
        return mesh, None
    if shape != plan.mesh.shape:
        raise PlanError(
            f"shard: the JAX mesh has axes {names} of sizes {shape}; the plan needs sizes "
            f"{plan.mesh.shape} (its mesh {plan.mesh.text()}) or round axes {round_names} of "
            f"sizes {rounds}"
        )
    if expressible:
        return mesh, names
    # rounds of one axis are contiguous and row-major: reshaping keeps every device's place
    return JaxMesh(np.asarray(mesh.devices).reshape(rounds), round_names), None


def shard(fn: Callable[..., Any], plan: Any, mesh: Any = None) -> Callable[..., Any]:
    """`fn` run under `plan`'s shardings: a function with `fn`'s signature and results.

    Args:
        fn: `fn(params, *inputs)`, the function `from_jaxpr` imported for the plan.
        plan: a plan of `from_jaxpr(fn, *example_args)`.
        mesh: None (the plan's mesh on the first devices), mesh text / a shardplan Mesh with the
            plan's rounds, or a `jax.sharding.Mesh`: with the plan's mesh shape (its axis names
            are used when the plan is expressible on them, else a round mesh of its devices) or
            with the round axes `r0`, `r1`, ...

    The returned function has `.mesh` (the jax Mesh) and `.axis_names` (None: round axes).
    Raises PlanError when the plan is for another graph or the mesh does not fit.
    """
    from shardplan.search.api import warn_if_nothing_split

    jax = require_jax()
    warn_if_nothing_split(plan, "shard")
    jmesh, names = _jax_mesh(plan, mesh)
    specs = partition_specs(plan, names)
    cache: dict[Any, Callable[..., Any]] = {}

    def sharding(tensor: str) -> Any:
        from jax.sharding import NamedSharding, PartitionSpec

        return NamedSharding(jmesh, specs.get(tensor, PartitionSpec()))

    def build(args: tuple[Any, ...]) -> Callable[..., Any]:
        opaque = any(has_trait(op.kind, Trait.OPAQUE) for op in plan.graph.ops)
        unknown = "replicate" if opaque else "error"
        with warnings.catch_warnings():  # from_jaxpr already warned about opaque operators
            warnings.simplefilter("ignore")
            imported = import_jaxpr(fn, *args, name=plan.graph.name, unknown=unknown)
        check_same_graph(imported.graph, plan.graph)
        closed = imported.closed_jaxpr
        tensor_of = imported.tensor_of
        names_in = [n for group in leaf_names(fn, args) for n in group]
        in_leaves = [sharding(n) for n in names_in]
        treedef = jax.tree_util.tree_structure(args)
        in_shardings = jax.tree_util.tree_unflatten(treedef, in_leaves)

        def constrain(var: Any, value: Any) -> Any:
            tensor = tensor_of.get(var)
            if tensor is None or tensor not in specs or not hasattr(value, "shape"):
                return value
            if tuple(value.shape) != plan.graph.tensors[tensor].shape:
                return value
            return jax.lax.with_sharding_constraint(value, sharding(tensor))

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
    sharded.mesh = jmesh  # type: ignore[attr-defined]
    sharded.axis_names = names  # type: ignore[attr-defined]
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
"""Sub-jaxprs `shard` evaluates in place (custom_jvp/vjp calls keep their rules)."""


def check_same_graph(got: Graph, want: Graph) -> None:
    """PlanError unless `want` (the plan's graph) is `got` (the traced function's)."""
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
            f"shard: the plan was made for another graph than this function's "
            f"on these arguments ({detail}); plan the graph of from_jaxpr(fn, *args)"
        )


def apply_plan(fn: Callable[..., Any], plan: Any, mesh: Any = None) -> Callable[..., Any]:
    """The earlier name of `shard` (same arguments and result)."""
    return shard(fn, plan, mesh)


__all__ = ["apply_plan", "check_same_graph", "shard"]
