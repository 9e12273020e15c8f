"""Run a shardplan graph on JAX/XLA, optionally under a plan's layouts; compile it to HLO.

- `init_params` / `make_inputs`: deterministic numpy values for a graph's parameters, inputs and
  constants (`shardplan.engines._common`, shared with the torch backend; int32 ids and labels
  in range, a causal mask for `causal_mask` constants).
- `kernels()`: ONE jax.numpy implementation per catalogue kind, keyed by `op.kind`.
- `forward_fn` / `loss_fn`: a pure `f(params, inputs)` evaluating the ops in graph order; with
  `layouts` and a mesh, every op output with a layout gets `jax.lax.with_sharding_constraint`.
- shardings come from `shardplan.exporters.jax` (`jax_mesh`, `partition_spec`,
  `shardings_for`: one JAX mesh axis per round).
- `sharded_call` / `compiled_text`: jit with `in_shardings` and run, or return the compiled HLO.

jax is imported inside the functions that need it; without it they raise MissingDependencyError.
Every op is evaluated inside `jax.named_scope(op.name)`, so HLO metadata `op_name`s carry the
shardplan operator name (used to match measured collectives with predicted ones).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from shardplan.engines import moe_kernels
from shardplan.engines._common import (
    affine,
    attention,
    bias_add,
    index_bound,
    init_inputs,
    init_params,
)
from shardplan.engines._common import einsum_letters as _einsum_spec
from shardplan.engines._common import pair as _pair
from shardplan.errors import BackendError, UnsupportedOpError
from shardplan.exporters.jax import jax_mesh, named_sharding, shardings_for
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role
from shardplan.lazy import require
from shardplan.mesh import Mesh, parse_mesh
from shardplan.sharding import Layout

Kernel = Callable[..., Any]
Params = Mapping[str, Any]
Layouts = Mapping[str, Layout]


def _require_jax() -> Any:
    return require("jax", extra="jax", user="the JAX backend")


# -- values ------------------------------------------------------------------------------------


def make_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Values for every input and constant tensor of `graph`: `_common.init_inputs` with int32
    ids and labels (in [0, vocab or classes)); float inputs are float32 standard normal, a
    `causal_mask` constant is 0 on/below the diagonal and -1e9 above. Deterministic in
    (seed, tensor name); `init_params` gives the parameters.
    """
    return init_inputs(graph, seed, np.int32)


def abstract_args(graph: Graph) -> tuple[dict[str, Any], dict[str, Any]]:
    """`jax.ShapeDtypeStruct`s for (params, inputs): lower and compile without any data."""
    jax = _require_jax()
    import jax.numpy as jnp

    params = {t.name: jax.ShapeDtypeStruct(t.shape, jnp.float32) for t in graph.parameters}
    inputs: dict[str, Any] = {}
    for t in graph.tensors.values():
        if t.role in (Role.INPUT, Role.CONSTANT):
            dtype = jnp.float32 if index_bound(graph, t.name) is None else jnp.int32
            inputs[t.name] = jax.ShapeDtypeStruct(t.shape, dtype)
    return params, inputs


# -- kernels -----------------------------------------------------------------------------------


def _gelu_tanh(approximate: Any) -> bool:
    """torch says approximate="none"|"tanh"; the zoo may pass a bool."""
    return approximate == "tanh" if isinstance(approximate, str) else bool(approximate)


def _norm_kernels(jnp: Any, lax: Any) -> dict[str, Kernel]:
    """The normalisations of `kernels`: layer_norm, rms_norm, batch_norm (batch statistics)."""

    def eps(op: Op) -> float:
        return float(op.attr("eps", 1e-5))

    def layer_norm(op: Op, x: Any, gamma: Any = None, beta: Any = None) -> Any:
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        return affine((x - mean) * lax.rsqrt(var + eps(op)), gamma, beta)

    def rms_norm(op: Op, x: Any, gamma: Any = None, beta: Any = None) -> Any:
        ms = jnp.mean(jnp.square(x), axis=-1, keepdims=True)
        return affine(x * lax.rsqrt(ms + eps(op)), gamma, beta)

    def batch_norm(op: Op, x: Any, scale: Any, shift: Any) -> Any:
        axes = tuple(i for i in range(x.ndim) if i != 1)
        mean = jnp.mean(x, axis=axes, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=axes, keepdims=True)
        shape = [1] * x.ndim
        shape[1] = x.shape[1]
        return (x - mean) * lax.rsqrt(var + eps(op)) * scale.reshape(shape) + shift.reshape(shape)

    return {"layer_norm": layer_norm, "rms_norm": rms_norm, "batch_norm": batch_norm}


def _window_kernels(jnp: Any, lax: Any) -> dict[str, Kernel]:
    """The sliding-window kernels of `kernels`: conv2d (NCHW, OIHW) and max/avg pool2d."""

    def conv2d(op: Op, x: Any, w: Any) -> Any:
        sy, sx = _pair(op.attr("stride", 1))
        py, px = _pair(op.attr("padding", 0))
        return lax.conv_general_dilated(x, w, window_strides=(sy, sx),
                                        padding=((py, py), (px, px)),
                                        dimension_numbers=("NCHW", "OIHW", "NCHW"),
                                        feature_group_count=x.shape[1] // w.shape[1])

    def pool2d(op: Op, x: Any) -> Any:
        ky, kx = _pair(op.attr("kernel", 2))
        sy, sx = _pair(op.attr("stride", op.attr("kernel", 2)))
        py, px = _pair(op.attr("padding", 0))
        window, strides = (1, 1, ky, kx), (1, 1, sy, sx)
        padding = ((0, 0), (0, 0), (py, py), (px, px))
        mode = str(op.attr("mode", "max"))
        if mode == "max":
            return lax.reduce_window(x, -jnp.inf, lax.max, window, strides, padding)
        if mode == "avg":  # padded cells count (torch's count_include_pad=True)
            return lax.reduce_window(x, 0.0, lax.add, window, strides, padding) / (ky * kx)
        raise UnsupportedOpError(f"op {op.name!r} (pool2d): mode {mode!r} is not max or avg")

    return {"conv2d": conv2d, "pool2d": pool2d}


def kernels() -> dict[str, Kernel]:
    """One jax.numpy implementation per catalogue kind: `kernel(op, *operands) -> result`.

    Results are one array, or a tuple for ops with several results.
    """
    jax = _require_jax()
    import jax.numpy as jnp
    from jax import lax

    def matmul(op: Op, a: Any, b: Any) -> Any:
        return jnp.matmul(a, jnp.swapaxes(b, -1, -2) if op.attr("transpose_b") else b)

    def reducer(fn: Callable[..., Any]) -> Kernel:
        def kernel(op: Op, x: Any) -> Any:
            axes = op.attr("axes")
            axis = None if axes is None else tuple(int(a) for a in axes)
            return fn(x, axis=axis, keepdims=bool(op.attr("keepdims", False)))

        return kernel

    def cross_entropy(op: Op, logits: Any, labels: Any) -> Any:
        logp = jax.nn.log_softmax(logits, axis=-1)
        picked = jnp.take_along_axis(logp, labels[..., None].astype(jnp.int32), axis=-1)
        return -jnp.mean(picked)

    def unary(fn: Callable[[Any], Any]) -> Kernel:
        return lambda op, x: fn(x)

    def binary(fn: Callable[[Any, Any], Any]) -> Kernel:
        def kernel(op: Any, a: Any, b: Any = None) -> Any:
            if b is None:  # one tensor and a Python scalar (importers: `scalar`, `reverse`)
                s = op.attr("scalar")
                return fn(s, a) if op.attr("reverse") else fn(a, s)
            return fn(a, b)

        return kernel

    return {
        "relu": unary(jax.nn.relu),
        "gelu": lambda op, x: jax.nn.gelu(x, approximate=_gelu_tanh(op.attr("approximate"))),
        "silu": unary(jax.nn.silu),
        "tanh": unary(jnp.tanh),
        "sigmoid": unary(jax.nn.sigmoid),
        "dropout": unary(lambda x: x),  # evaluation mode
        "cast": unary(lambda x: x),  # the backend computes in one float dtype
        "exp": unary(jnp.exp),
        "neg": unary(jnp.negative),
        "scale": lambda op, x: x * float(op.attr("value", 1.0)),
        "sqrt": unary(jnp.sqrt),
        "rsqrt": unary(lax.rsqrt),
        "identity": unary(lambda x: x),
        "add": binary(jnp.add),
        "sub": binary(jnp.subtract),
        "mul": binary(jnp.multiply),
        "div": binary(jnp.divide),
        "maximum": binary(jnp.maximum),
        "minimum": binary(jnp.minimum),
        "bias_add": bias_add,
        "softmax": lambda op, x: jax.nn.softmax(x, axis=int(op.attr("axis", -1))),
        "linear": lambda op, x, w: jnp.matmul(x, w.T),
        "matmul": matmul,
        "bmm": matmul,
        "reduce_sum": reducer(jnp.sum),
        "reduce_mean": reducer(jnp.mean),
        "reduce_max": reducer(jnp.max),
        "reshape": lambda op, x: jnp.reshape(x, tuple(int(s) for s in op.attr("shape"))),
        "transpose": lambda op, x: jnp.transpose(x, tuple(int(p) for p in op.attr("perm"))),
        "embedding": lambda op, table, ids: jnp.take(table, ids.astype(jnp.int32), axis=0),
        "concat": lambda op, *xs: jnp.concatenate(xs, axis=int(op.attr("axis", 0))),
        "cross_entropy": cross_entropy,
        "einsum": lambda op, *xs: jnp.einsum(_einsum_spec(str(op.attr("spec"))), *xs),
        "attention": lambda op, *xs: attention(op, lambda s: jax.nn.softmax(s, axis=-1), *xs),
        **_norm_kernels(jnp, lax),
        **_window_kernels(jnp, lax),
        **moe_kernels.jax_kernels(),
    }


def _as_mesh(mesh: Mesh | str | int) -> Mesh:
    return parse_mesh(mesh)


# -- evaluation --------------------------------------------------------------------------------


def _check_kinds(graph: Graph, table: Mapping[str, Kernel]) -> None:
    for op in graph.ops:
        if op.kind not in table:
            raise UnsupportedOpError(
                f"op {op.name!r} has kind {op.kind!r}, which the JAX backend does not implement; "
                f"implemented kinds: {sorted(table)}")


def forward_fn(graph: Graph, layouts: Layouts | None = None,
               mesh: Mesh | str | int | None = None,
               reads: Mapping[tuple[str, int], Layout] | None = None,
               ) -> Callable[[Params, Params], dict[str, Any]]:
    """A pure `f(params, inputs) -> {graph output name: array}` evaluating ops in graph order.

    `inputs` holds the graph's inputs and constants (see `make_inputs`). With `layouts` (tensor
    name -> Layout) and `mesh`, every op output that has a layout is constrained with
    `jax.lax.with_sharding_constraint` (layouts of params/inputs are for `in_shardings`; see
    `sharded_call`). `reads` ((op name, input position) -> Layout) constrains an operand where
    the op reads it in another layout than it arrives in: the redistribution then happens on the
    edge, before the op, as the cost model prices it (else XLA may move the op's own work, e.g.
    a gradient contraction, instead). Unknown op kinds raise UnsupportedOpError here, before any
    tracing.
    """
    jax = _require_jax()
    table = kernels()
    _check_kinds(graph, table)
    constraints: dict[str, Any] = {}
    if layouts:
        if mesh is None:
            raise BackendError("forward_fn: layouts need a mesh (e.g. mesh='8')")
        produced = {t for op in graph.ops for t in op.outputs}
        constraints = shardings_for(graph, mesh, {t: lay for t, lay in layouts.items()
                                                  if t in produced or t not in graph.tensors})
    read_constraints: dict[tuple[str, int], Any] = {}
    if reads:
        if mesh is None:
            raise BackendError("forward_fn: reads need a mesh (e.g. mesh='8')")
        jmesh, m = jax_mesh(_as_mesh(mesh)), _as_mesh(mesh)
        for (op_name, pos), layout in reads.items():
            tensor = graph.tensors[graph.ops[graph.op_index[op_name]].inputs[pos]]
            read_constraints[op_name, pos] = named_sharding(jmesh, m, layout, tensor)
    outputs = graph.outputs
    ops = graph.ops

    def f(params: Params, inputs: Params) -> dict[str, Any]:
        env: dict[str, Any] = {**inputs, **params}
        for op in ops:
            try:
                args = [env[t] for t in op.inputs]
            except KeyError as e:
                raise BackendError(f"op {op.name!r} ({op.kind}) needs tensor {e.args[0]!r}, which "
                                   "is neither in params, inputs nor produced earlier") from None
            with jax.named_scope(op.name):
                for pos in range(len(args)):
                    read = read_constraints.get((op.name, pos))
                    if read is not None:  # the edge's redistribution, charged to this op
                        args[pos] = jax.lax.with_sharding_constraint(args[pos], read)
                result = table[op.kind](op, *args)
                results = result if isinstance(result, tuple) else (result,)
                if len(results) != len(op.outputs):
                    raise BackendError(f"op {op.name!r} ({op.kind}) gave {len(results)} results; "
                                       f"the graph expects {len(op.outputs)}")
                for name, value in zip(op.outputs, results, strict=True):
                    sharding = constraints.get(name)
                    if sharding is not None:
                        value = jax.lax.with_sharding_constraint(value, sharding)
                    env[name] = value
        return {name: env[name] for name in outputs}

    return f


def loss_from_outputs(graph: Graph, outputs: Mapping[str, Any]) -> Any:
    """The training loss: the graph's scalar output(s) if any, else the sum of all outputs."""
    _require_jax()
    import jax.numpy as jnp

    scalars = [t for t in graph.outputs if graph.tensors[t].shape == ()]
    names = scalars or list(graph.outputs)
    total = jnp.sum(outputs[names[0]])
    for name in names[1:]:
        total = total + jnp.sum(outputs[name])
    return total


def loss_fn(graph: Graph, layouts: Layouts | None = None,
            mesh: Mesh | str | int | None = None) -> Callable[[Params, Params], Any]:
    """`f(params, inputs) -> scalar loss` (see `loss_from_outputs`)."""
    forward = forward_fn(graph, layouts, mesh)
    return lambda params, inputs: loss_from_outputs(graph, forward(params, inputs))


def _select(graph: Graph, values: Params | None, roles: tuple[Role, ...], what: str,
            abstract: Params) -> dict[str, Any]:
    names = [t.name for t in graph.tensors.values() if t.role in roles]
    if values is None:
        return {n: abstract[n] for n in names}
    missing = [n for n in names if n not in values]
    if missing:
        raise BackendError(f"{what} lack {len(missing)} tensors of graph {graph.name!r}, e.g. "
                           f"{missing[:3]}; build them with init_params/make_inputs")
    return {n: values[n] for n in names}


def _jitted(graph: Graph, mesh: Mesh | str | int, param_layouts: Layouts | None,
            input_layouts: Layouts | None, layouts: Layouts | None, params: Params | None,
            inputs: Params | None, train: bool,
            reads: Mapping[tuple[str, int], Layout] | None = None,
            ) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    jax = _require_jax()
    mesh = _as_mesh(mesh)
    jmesh = jax_mesh(mesh)
    abstract_p, abstract_i = abstract_args(graph)
    p = _select(graph, params, (Role.PARAMETER,), "params", abstract_p)
    x = _select(graph, inputs, (Role.INPUT, Role.CONSTANT), "inputs", abstract_i)
    for what, given, allowed in (("param_layouts", param_layouts, p),
                                 ("input_layouts", input_layouts, x)):
        unknown = sorted(set(given or ()) - set(allowed))
        if unknown:
            raise BackendError(f"{what} names tensors that are not graph "
                               f"{'parameters' if what == 'param_layouts' else 'inputs'}: "
                               f"{unknown[:3]}")
    tensors = graph.tensors
    p_sh = {n: named_sharding(jmesh, mesh, (param_layouts or {}).get(n), tensors[n]) for n in p}
    x_sh = {n: named_sharding(jmesh, mesh, (input_layouts or {}).get(n), tensors[n]) for n in x}
    forward = forward_fn(graph, layouts, mesh, reads)

    if not train:
        return jax.jit(forward, in_shardings=(p_sh, x_sh)), p, x

    def step(params_: Params, inputs_: Params) -> tuple[Any, Any, Any]:
        def objective(q: Params) -> tuple[Any, Any]:
            outs = forward(q, inputs_)
            return loss_from_outputs(graph, outs), outs

        (loss, outs), grads = jax.value_and_grad(objective, has_aux=True)(params_)
        grads = {n: jax.lax.with_sharding_constraint(g, p_sh[n]) for n, g in grads.items()}
        return outs, loss, grads

    return jax.jit(step, in_shardings=(p_sh, x_sh)), p, x


def sharded_call(graph: Graph, mesh: Mesh | str | int, param_layouts: Layouts | None,
                 input_layouts: Layouts | None, layouts: Layouts | None, params: Params,
                 inputs: Params, train: bool = False) -> Any:
    """Run `graph` jitted on `jax_mesh(mesh)`.

    Params and inputs are placed by `param_layouts` / `input_layouts` (tensor name -> Layout;
    missing names are replicated) through `in_shardings`; op outputs in `layouts` are constrained.
    Returns the outputs dict (jax arrays) when `train` is False; when True, returns
    `(outputs, loss, grads)` from `jax.value_and_grad` of `loss_from_outputs` w.r.t. params, the
    gradients constrained to their parameter's sharding.
    """
    fn, p, x = _jitted(graph, mesh, param_layouts, input_layouts, layouts, params, inputs, train)
    try:
        return fn(p, x)
    except (ValueError, TypeError, RuntimeError) as e:
        raise BackendError(f"JAX failed to run graph {graph.name!r} on mesh "
                           f"{_as_mesh(mesh).text()}: {e}") from e


def compiled_text(graph: Graph, mesh: Mesh | str | int, param_layouts: Layouts | None = None,
                  input_layouts: Layouts | None = None, layouts: Layouts | None = None,
                  params: Params | None = None, inputs: Params | None = None,
                  train: bool = False) -> str:
    """`jax.jit(...).lower(...).compile().as_text()` of the same call as `sharded_call`.

    `params` / `inputs` may be omitted: shapes and dtypes then come from the graph (no data).
    """
    fn, p, x = _jitted(graph, mesh, param_layouts, input_layouts, layouts, params, inputs, train)
    try:
        return str(fn.lower(p, x).compile().as_text())
    except (ValueError, TypeError, RuntimeError) as e:
        raise BackendError(f"JAX failed to compile graph {graph.name!r} on mesh "
                           f"{_as_mesh(mesh).text()}: {e}") from e


__all__ = [
    "abstract_args", "compiled_text", "forward_fn", "init_params", "kernels", "loss_fn",
    "loss_from_outputs", "make_inputs", "sharded_call",
]
