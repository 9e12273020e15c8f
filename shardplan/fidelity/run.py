"""Running a plan for `shardplan.fidelity.verify`: the sharded program compiled from the plan's
layouts, the unsharded reference, the numeric comparison of the two, and the compute dtype.

Both programs compute in `dtype` ("float64" by default, "float32" on request): `x64(dtype)` is
the scope in which JAX keeps 64-bit arrays (`jax.enable_x64`), and `cast_floats` turns the
float32 values of `init_params` / `make_inputs` into that dtype (integer ids and labels stay
int32). In float64 a reduction in another order changes a result by ~1e-16 relative instead of
~1e-7, so even the ResNets' 50-150 small batch norms (which amplify reduction-order noise by
~1e4, and flip ReLU derivatives near 0 in float32) agree to ~1e-12; the tolerances are
`TOLERANCES[dtype]`.

A tensor passes when max|sharded - unsharded| <= rtol * max|unsharded| + atol; its relative
error is max|sharded - unsharded| / max(max|unsharded|, atol / rtol).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardplan.errors import BackendError
from shardplan.ir.traits import Trait, has_trait
from shardplan.lazy import require
from shardplan.plans import Plan

DTYPES = ("float64", "float32")
"""Compute dtypes of the verification (first = default)."""

TOLERANCES: Mapping[str, tuple[float, float]] = {"float64": (1e-9, 1e-12), "float32": (1e-4, 1e-6)}
"""dtype -> default (rtol, atol). float32: reassociated sums differ by 1e-7..1e-5 relative on
every zoo model but the ResNets (docs/verification.md); float64: 1e-16..1e-12."""


def check_dtype(dtype: str) -> str:
    """`dtype` if it is one of `DTYPES`, else BackendError."""
    if dtype not in DTYPES:
        raise BackendError(f"verification dtype {dtype!r} is not supported; use one of {DTYPES}")
    return dtype


def x64(dtype: str) -> AbstractContextManager[Any]:
    """The JAX scope for computing in `dtype`: 64-bit arrays on for float64, off for float32."""
    return _jax().enable_x64(check_dtype(dtype) == "float64")


def cast_floats(values: Mapping[str, Any], dtype: str) -> dict[str, Any]:
    """Float arrays (or `ShapeDtypeStruct`s) in `dtype`; integer ids and labels unchanged."""
    jax = _jax()
    out: dict[str, Any] = {}
    for name, value in values.items():
        if not np.issubdtype(value.dtype, np.floating):
            out[name] = value
        elif isinstance(value, jax.ShapeDtypeStruct):
            out[name] = jax.ShapeDtypeStruct(value.shape, np.dtype(dtype))
        else:
            out[name] = np.asarray(value, dtype)
    return out


def plan_layouts(plan: Plan) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(parameter homes, input/constant layouts, activation layouts) of `plan`."""
    layouts = plan.tensor_layouts()
    params = {t.name for t in plan.graph.parameters}
    return (
        {k: v for k, v in layouts.items() if k in params},
        plan.input_layouts(),
        {k: v for k, v in layouts.items() if k not in params},
    )


def plan_reads(plan: Plan) -> dict[tuple[str, int], Any]:
    """(op, input position) -> the layout the op reads an operand in, where that differs from
    the layout it arrives in (its producer's, a parameter's home, an input's first reader's)."""
    from shardplan.sharding import operand_layout

    arriving = {**plan.tensor_layouts(), **plan.input_layouts()}
    reads: dict[tuple[str, int], Any] = {}
    for op in plan.graph.ops:
        for pos, name in enumerate(op.inputs):
            want = operand_layout(op, plan.strategies[op.name], pos)
            if name in arriving and arriving[name] != want:
                reads[op.name, pos] = want
    return reads


def compile_sharded(
    plan: Plan,
    train: bool,
    params: Mapping[str, Any] | None = None,
    inputs: Mapping[str, Any] | None = None,
    dtype: str = "float32",
) -> tuple[Any, Any, Any, str]:
    """(compiled executable, params, inputs, HLO text) of the plan's sharded program: parameters
    and inputs placed by the plan's layouts, every operator output constrained (training: every
    parameter gradient too). Without params/inputs it compiles from shapes alone, with float
    tensors in `dtype`. Call it inside `x64(dtype)` when `dtype` is float64."""
    from shardplan.engines import jax as jb

    if params is None or inputs is None:
        shapes_p, shapes_i = jb.abstract_args(plan.graph)
        params = cast_floats(shapes_p, dtype) if params is None else params
        inputs = cast_floats(shapes_i, dtype) if inputs is None else inputs
    p_lay, i_lay, a_lay = plan_layouts(plan)
    fn, p, x = jb._jitted(
        plan.graph, plan.mesh, p_lay, i_lay, a_lay, params, inputs, train, plan_reads(plan)
    )
    try:
        compiled = fn.lower(p, x).compile()
    except (ValueError, TypeError, RuntimeError) as e:
        raise BackendError(
            f"JAX failed to compile the {plan.method} plan of "
            f"{plan.graph.name!r} on mesh {plan.mesh.text()}: {e}"
        ) from e
    return compiled, p, x, str(compiled.as_text())


# -- numerics ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TensorError:
    """Largest deviation of one checked tensor (output, loss or gradient)."""

    name: str
    max_abs_error: float
    max_abs_reference: float
    relative_error: float
    ok: bool


def tensor_error(name: str, got: Any, want: Any, rtol: float, atol: float) -> TensorError:
    """max|got - want| against rtol * max|want| + atol (see the module docstring)."""
    g = np.asarray(got, np.float64)
    w = np.asarray(want, np.float64)
    if g.shape != w.shape:
        return TensorError(
            name, float("inf"), float(np.abs(w).max(initial=0.0)), float("inf"), False
        )
    err = float(np.abs(g - w).max(initial=0.0)) if g.size else 0.0
    scale = float(np.abs(w).max(initial=0.0)) if w.size else 0.0
    finite = bool(np.all(np.isfinite(g))) and bool(np.all(np.isfinite(w)))
    rel = err / max(scale, atol / rtol if rtol > 0 else atol, 1e-30)
    return TensorError(name, err, scale, rel, finite and err <= rtol * scale + atol)


def reference(plan: Plan, train: bool, params: Any, inputs: Any) -> Any:
    """The unsharded program on one device: outputs, or (outputs, loss, grads) when training."""
    jax = _jax()
    from shardplan.engines import jax as jb

    graph = plan.graph
    forward = jb.forward_fn(graph)
    if not train:
        return jax.jit(forward)(params, inputs)

    def step(p: Any, x: Any) -> Any:
        def objective(q: Any) -> Any:
            outs = forward(q, x)
            return jb.loss_from_outputs(graph, outs), outs

        (loss, outs), grads = jax.value_and_grad(objective, has_aux=True)(p)
        return outs, loss, grads

    return jax.jit(step)(params, inputs)


def _jax() -> Any:
    return require("jax", extra="jax", user="running a plan on JAX")


def flatten_results(result: Any, train: bool) -> dict[str, Any]:
    """{"output NAME": ..., "loss": ..., "grad PARAM": ...} of a program's result."""
    if not train:
        return {f"output {k}": v for k, v in result.items()}
    outs, loss, grads = result
    flat = {f"output {k}": v for k, v in outs.items()}
    flat["loss"] = loss
    flat.update({f"grad {k}": v for k, v in grads.items()})
    return flat


def relu_sign_flips(plan: Plan, params: Mapping[str, Any], inputs: Mapping[str, Any]) -> int:
    """Elements feeding a ReLU whose sign differs between the sharded and the unsharded forward
    pass while they lie within rounding noise of zero (|x| <= 1e-4 max|x| of that tensor).

    One such flip changes the ReLU's derivative from 0 to 1 for that element; after a batch norm
    over few elements this moves the gradients of the layers below by O(1/elements per channel),
    far beyond any floating-point tolerance although both programs are correct. Computes in the
    dtype of `params` (call it inside the same `x64` scope as the run it diagnoses).
    """
    jax = _jax()
    from shardplan.engines import jax as jb

    graph = plan.graph
    probes = sorted({op.inputs[0] for op in graph.ops if has_trait(op.kind, Trait.KINK)})
    if not probes:
        return 0
    table = jb.kernels()
    p_lay, i_lay, a_lay = plan_layouts(plan)
    shardings = jb.shardings_for(graph, plan.mesh, a_lay)

    def values(constrain: bool) -> Any:
        def run(p: Any, x: Any) -> Any:
            env = {**x, **p}
            for op in graph.ops:
                result = table[op.kind](op, *[env[t] for t in op.inputs])
                results = result if isinstance(result, tuple) else (result,)
                for name, value in zip(op.outputs, results, strict=True):
                    if constrain and name in shardings:
                        value = jax.lax.with_sharding_constraint(value, shardings[name])
                    env[name] = value
            return {t: env[t] for t in probes}

        return run

    mesh = plan.mesh
    jmesh = jb.jax_mesh(mesh)
    from jax.sharding import NamedSharding, PartitionSpec

    def sharding(name: str, layout: Any) -> Any:
        if layout is None:
            return NamedSharding(jmesh, PartitionSpec())
        return NamedSharding(jmesh, jb.partition_spec(layout, len(graph.tensors[name].shape), mesh))

    p_sh = {n: sharding(n, p_lay.get(n)) for n in params}
    x_sh = {n: sharding(n, i_lay.get(n)) for n in inputs}
    want = jax.jit(values(False))(params, inputs)
    got = jax.jit(values(True), in_shardings=(p_sh, x_sh))(params, inputs)
    flips = 0
    for name in probes:
        a, b = np.asarray(want[name], np.float64), np.asarray(got[name], np.float64)
        near = np.abs(a) <= 1e-4 * max(float(np.abs(a).max(initial=0.0)), 1e-30)
        flips += int(np.sum(near & ((a > 0) != (b > 0))))
    return flips


__all__ = [
    "DTYPES",
    "TOLERANCES",
    "TensorError",
    "cast_floats",
    "check_dtype",
    "compile_sharded",
    "plan_reads",
    "flatten_results",
    "plan_layouts",
    "reference",
    "relu_sign_flips",
    "tensor_error",
    "x64",
]
