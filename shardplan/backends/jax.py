"""Run a shardplan graph on JAX/XLA, optionally under a plan's layouts, and read its collectives.

- `init_params` / `make_inputs`: deterministic numpy values for a graph's parameters, inputs and
  constants (integer ids and labels in range, a causal mask for `causal_mask` constants).
- `kernels()`: ONE jax.numpy implementation per catalogue kind, keyed by `op.kind`.
- `forward_fn` / `loss_fn`: a pure `f(params, inputs)` evaluating the ops in graph order; with
  `layouts` and a mesh, every op output with a layout gets `jax.lax.with_sharding_constraint`.
- `jax_mesh` / `partition_spec` / `shardings_for`: a shardplan Mesh becomes a JAX mesh with one
  axis per round (`r0`, `r1`, ..., sizes q, devices row-major over the rounds, i.e. outermost
  mesh axis first); a Layout becomes a PartitionSpec whose entry for tensor dim j is the tuple of
  round axes split along j (REPLICATED and PARTIAL rounds contribute nothing).
- `sharded_call` / `compiled_text`: jit with `in_shardings` and run, or return the compiled HLO.
- `parse_collectives`: the collectives XLA actually inserted, from compiled HLO text.

jax is imported inside the functions that need it; without it they raise MissingDependencyError.
Every op is evaluated inside `jax.named_scope(op.name)`, so HLO metadata `op_name`s carry the
shardplan operator name (used to match measured collectives with predicted ones).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardplan.backends._common import einsum_letters as _einsum_spec
from shardplan.backends._common import pair as _pair
from shardplan.errors import BackendError, MissingDependencyError, UnsupportedOpError
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role, Tensor
from shardplan.mesh import Mesh, parse_mesh
from shardplan.sharding import Layout

Kernel = Callable[..., Any]
Params = Mapping[str, Any]
Layouts = Mapping[str, Layout]

_INSTALL_HINT = "install it with: pip install 'shardplan[jax]'"
_NORM_KINDS = ("layer_norm", "rms_norm", "batch_norm")


def _require_jax() -> Any:
    try:
        import jax
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            f"the JAX backend needs the `jax` extra, which is not installed ({e}); "
            f"{_INSTALL_HINT}") from e
    return jax


# -- values ------------------------------------------------------------------------------------


def _rng(seed: int, name: str) -> np.random.Generator:
    """One generator per (seed, tensor name): a tensor's values do not depend on the others."""
    return np.random.default_rng([int(seed), zlib.crc32(name.encode())])


def init_params(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """float32 values for every parameter: normal * 0.02, except norm scales (gamma) = 1.

    Deterministic in (seed, parameter name).
    """
    norm_scales = {op.inputs[1] for op in graph.ops
                   if op.kind in _NORM_KINDS and len(op.inputs) > 1}
    out: dict[str, np.ndarray] = {}
    for t in graph.parameters:
        if t.name in norm_scales:
            out[t.name] = np.ones(t.shape, np.float32)
        else:
            out[t.name] = (_rng(seed, t.name).standard_normal(t.shape) * 0.02).astype(np.float32)
    return out


def _int_range(graph: Graph, tensor: Tensor) -> int | None:
    """Upper bound (exclusive) when `tensor` holds embedding ids or class labels, else None."""
    if tensor.dtype_bytes not in (4, 8):  # int32 or int64 ids/labels
        return None
    bound: int | None = None
    for op_index, position in graph.consumers.get(tensor.name, ()):
        op = graph.ops[op_index]
        high = None
        if op.kind == "embedding" and position == 1:
            high = graph.tensors[op.inputs[0]].shape[0]
        elif op.kind == "cross_entropy" and position == 1:
            high = graph.tensors[op.inputs[0]].shape[-1]
        if high is not None:
            bound = high if bound is None else min(bound, high)
    return bound


def _constant_value(tensor: Tensor) -> np.ndarray:
    shape = tensor.shape
    if "causal_mask" in tensor.name and len(shape) >= 2 and shape[-1] == shape[-2]:
        s = shape[-1]
        mask = np.triu(np.full((s, s), -1e9, np.float32), k=1)
        return np.broadcast_to(mask, shape).astype(np.float32)
    return np.zeros(shape, np.float32)


def make_inputs(graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Values for every input and constant tensor of `graph`.

    Inputs that feed an embedding's ids or a cross_entropy's labels (dtype_bytes 4) are int32 in
    [0, vocab or classes); other inputs are float32 standard normal. Constants: a tensor named
    like `causal_mask` with square trailing dims is 0 on/below the diagonal and -1e9 above; any
    other constant is zeros. Deterministic in (seed, tensor name).
    """
    out: dict[str, np.ndarray] = {}
    for t in graph.tensors.values():
        if t.role is Role.CONSTANT:
            out[t.name] = _constant_value(t)
        elif t.role is Role.INPUT:
            rng = _rng(seed, t.name)
            high = _int_range(graph, t)
            if high is not None:
                out[t.name] = rng.integers(0, high, size=t.shape, dtype=np.int32)
            else:
                out[t.name] = rng.standard_normal(t.shape).astype(np.float32)
    return out


def abstract_args(graph: Graph) -> tuple[dict[str, Any], dict[str, Any]]:
    """`jax.ShapeDtypeStruct`s for (params, inputs): lower and compile without any data."""
    jax = _require_jax()
    import jax.numpy as jnp

    params = {t.name: jax.ShapeDtypeStruct(t.shape, jnp.float32) for t in graph.parameters}
    inputs: dict[str, Any] = {}
    for t in graph.tensors.values():
        if t.role in (Role.INPUT, Role.CONSTANT):
            dtype = jnp.int32 if t.role is Role.INPUT and _int_range(graph, t) else jnp.float32
            inputs[t.name] = jax.ShapeDtypeStruct(t.shape, dtype)
    return params, inputs


# -- kernels -----------------------------------------------------------------------------------


def _gelu_tanh(approximate: Any) -> bool:
    """torch says approximate="none"|"tanh"; the zoo may pass a bool."""
    return approximate == "tanh" if isinstance(approximate, str) else bool(approximate)


def kernels() -> dict[str, Kernel]:
    """One jax.numpy implementation per catalogue kind: `kernel(op, *operands) -> result`.

    Results are one array, or a tuple for ops with several results.
    """
    jax = _require_jax()
    import jax.numpy as jnp
    from jax import lax

    def eps(op: Op) -> float:
        return float(op.attr("eps", 1e-5))

    def bias_add(op: Op, x: Any, bias: Any) -> Any:
        axis = int(op.attr("axis", -1)) % x.ndim
        shape = [1] * x.ndim
        shape[axis] = bias.shape[0]
        return x + bias.reshape(shape)

    def affine(y: Any, gamma: Any, beta: Any) -> Any:
        y = y if gamma is None else y * gamma
        return y if beta is None else y + beta

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

    def matmul(op: Op, a: Any, b: Any) -> Any:
        return jnp.matmul(a, jnp.swapaxes(b, -1, -2) if op.attr("transpose_b") else b)

    def conv2d(op: Op, x: Any, w: Any) -> Any:
        if int(op.attr("groups", 1)) != 1:
            raise UnsupportedOpError(f"op {op.name!r} (conv2d): only groups=1 is supported")
        sy, sx = _pair(op.attr("stride", 1))
        py, px = _pair(op.attr("padding", 0))
        return lax.conv_general_dilated(x, w, window_strides=(sy, sx),
                                        padding=((py, py), (px, px)),
                                        dimension_numbers=("NCHW", "OIHW", "NCHW"))

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
        return lambda op, a, b: fn(a, b)

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
        "layer_norm": layer_norm,
        "rms_norm": rms_norm,
        "batch_norm": batch_norm,
        "linear": lambda op, x, w: jnp.matmul(x, w.T),
        "matmul": matmul,
        "bmm": matmul,
        "conv2d": conv2d,
        "pool2d": pool2d,
        "reduce_sum": reducer(jnp.sum),
        "reduce_mean": reducer(jnp.mean),
        "reduce_max": reducer(jnp.max),
        "reshape": lambda op, x: jnp.reshape(x, tuple(int(s) for s in op.attr("shape"))),
        "transpose": lambda op, x: jnp.transpose(x, tuple(int(p) for p in op.attr("perm"))),
        "embedding": lambda op, table, ids: jnp.take(table, ids.astype(jnp.int32), axis=0),
        "concat": lambda op, *xs: jnp.concatenate(xs, axis=int(op.attr("axis", 0))),
        "cross_entropy": cross_entropy,
        "einsum": lambda op, *xs: jnp.einsum(_einsum_spec(str(op.attr("spec"))), *xs),
    }


# -- sharding ----------------------------------------------------------------------------------


def _as_mesh(mesh: Mesh | str | int) -> Mesh:
    return parse_mesh(mesh)


def axis_names(mesh: Mesh | str | int) -> tuple[str, ...]:
    """The JAX axis names of `mesh`'s rounds: `("r0", "r1", ...)`."""
    return tuple(f"r{r.index}" for r in _as_mesh(mesh).rounds)


def jax_mesh(mesh: Mesh | str | int) -> Any:
    """A `jax.sharding.Mesh` with one Auto axis per round (`r0`, `r1`, ...; sizes q).

    Devices are the first `mesh.size` of `jax.devices()`, laid out row-major over the rounds, so
    round 0 (outermost mesh axis) varies slowest.
    """
    jax = _require_jax()
    from jax.sharding import AxisType
    from jax.sharding import Mesh as JaxMesh

    mesh = _as_mesh(mesh)
    devices = jax.devices()
    if len(devices) < mesh.size:
        raise BackendError(
            f"mesh {mesh.text()} needs {mesh.size} devices but JAX sees {len(devices)}; on CPU set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={mesh.size} before jax is imported")
    rounds = mesh.rounds
    names = axis_names(mesh)
    if not rounds:  # a mesh of one device: one trivial axis
        return JaxMesh(np.array(devices[:1]), ("r0",), axis_types=(AxisType.Auto,))
    grid = np.array(devices[: mesh.size], dtype=object).reshape(tuple(r.q for r in rounds))
    return JaxMesh(grid, names, axis_types=(AxisType.Auto,) * len(rounds))


def _check_layout(layout: Layout, shape: tuple[int, ...], mesh: Mesh, what: str) -> None:
    rounds = mesh.rounds
    if len(layout) != len(rounds):
        raise BackendError(f"{what}: layout {tuple(layout)} has {len(layout)} entries but mesh "
                           f"{mesh.text()} has {len(rounds)} rounds")
    counts = [1] * len(shape)
    for r, s in zip(rounds, layout, strict=True):
        if s >= len(shape):
            raise BackendError(f"{what}: layout {tuple(layout)} splits tensor dim {s} but the "
                               f"tensor has rank {len(shape)} (shape {shape})")
        if s >= 0:
            counts[s] *= r.q
    for j, (size, count) in enumerate(zip(shape, counts, strict=True)):
        if size % count:
            raise BackendError(f"{what}: dim {j} of size {size} is not divisible into {count} "
                               f"parts (layout {tuple(layout)} on mesh {mesh.text()})")


def partition_spec(layout: Layout, rank: int, mesh: Mesh | str | int | None = None) -> Any:
    """PartitionSpec of `layout`: entry j is the tuple of round axes split along tensor dim j
    (None when no round splits it); REPLICATED and PARTIAL rounds contribute nothing."""
    _require_jax()
    from jax.sharding import PartitionSpec

    names = axis_names(mesh) if mesh is not None else tuple(f"r{i}" for i in range(len(layout)))
    if len(names) != len(layout):
        raise BackendError(f"layout {tuple(layout)} has {len(layout)} entries but the mesh has "
                           f"{len(names)} rounds")
    entries: list[tuple[str, ...] | None] = []
    for j in range(rank):
        axes = tuple(name for name, s in zip(names, layout, strict=True) if s == j)
        entries.append(axes or None)
    for s in layout:
        if s >= rank:
            raise BackendError(f"layout {tuple(layout)} splits tensor dim {s} of a rank-{rank} "
                               "tensor")
    return PartitionSpec(*entries)


def _sharding(jmesh: Any, mesh: Mesh, layout: Layout | None, tensor: Tensor) -> Any:
    from jax.sharding import NamedSharding, PartitionSpec

    if layout is None:
        return NamedSharding(jmesh, PartitionSpec())
    _check_layout(layout, tensor.shape, mesh, f"tensor {tensor.name!r}")
    return NamedSharding(jmesh, partition_spec(layout, len(tensor.shape), mesh))


def shardings_for(graph: Graph, mesh: Mesh | str | int,
                  tensor_layouts: Layouts) -> dict[str, Any]:
    """`NamedSharding` per tensor of `tensor_layouts` (tensor name -> Layout) on `jax_mesh(mesh)`.

    Raises BackendError naming the tensor for an unknown tensor, a layout of the wrong length,
    a split dim beyond the tensor's rank or a dim not divisible by its split count.
    """
    _require_jax()
    mesh = _as_mesh(mesh)
    jmesh = jax_mesh(mesh)
    out: dict[str, Any] = {}
    for name, layout in tensor_layouts.items():
        if name not in graph.tensors:
            raise BackendError(f"layout given for tensor {name!r}, which graph {graph.name!r} "
                               "does not have")
        out[name] = _sharding(jmesh, mesh, layout, graph.tensors[name])
    return out


# -- evaluation --------------------------------------------------------------------------------


def _check_kinds(graph: Graph, table: Mapping[str, Kernel]) -> None:
    for op in graph.ops:
        if op.kind not in table:
            raise UnsupportedOpError(
                f"op {op.name!r} has kind {op.kind!r}, which the JAX backend does not implement; "
                f"implemented kinds: {sorted(table)}")


def forward_fn(graph: Graph, layouts: Layouts | None = None,
               mesh: Mesh | str | int | None = None) -> Callable[[Params, Params], dict[str, Any]]:
    """A pure `f(params, inputs) -> {graph output name: array}` evaluating ops in graph order.

    `inputs` holds the graph's inputs and constants (see `make_inputs`). With `layouts` (tensor
    name -> Layout) and `mesh`, every op output that has a layout is constrained with
    `jax.lax.with_sharding_constraint` (layouts of params/inputs are for `in_shardings`; see
    `sharded_call`). Unknown op kinds raise UnsupportedOpError here, before any tracing.
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
            inputs: Params | None, train: bool) -> tuple[Any, dict[str, Any], dict[str, Any]]:
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
    p_sh = {n: _sharding(jmesh, mesh, (param_layouts or {}).get(n), graph.tensors[n]) for n in p}
    x_sh = {n: _sharding(jmesh, mesh, (input_layouts or {}).get(n), graph.tensors[n]) for n in x}
    forward = forward_fn(graph, layouts, mesh)

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


# -- collectives -------------------------------------------------------------------------------

COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all",
                    "collective-permute")

_DTYPE_BYTES = {
    "pred": 1, "s2": 1, "u2": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2,
    "s32": 4, "u32": 4, "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8,
    "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3": 1, "f8e4m3b11fnuz": 1,
    "f8e4m3fnuz": 1, "f8e5m2fnuz": 1, "f8e3m4": 1, "f4e2m1fn": 1, "f8e8m0fnu": 1, "token": 0,
}

_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.+?)\s+"
    r"(?P<kind>all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
    r"(?P<suffix>-start|-done)?\(")
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\]")
_EXPLICIT_GROUPS = re.compile(r"replica_groups=\{(\{[\d,\s]*\}(?:\s*,\s*\{[\d,\s]*\})*)?\}")
_IOTA_GROUPS = re.compile(r"replica_groups=\[([\d,\s]+)\]<=\[")
# `device_ids=(...)` (a device permutation) may sit between the mesh and the axes
_MESH_GROUPS = re.compile(
    r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=[^{]*?)?\s*\{([^}]*)\}")
_PAIRS = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_NUM_PARTITIONS = re.compile(r"num_partitions=(\d+)")
_NUM_REPLICAS = re.compile(r"replica_count=(\d+)")


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective of compiled HLO.

    Attributes:
        kind: all-reduce | all-gather | reduce-scatter | all-to-all | collective-permute.
        bytes_per_device: size of the result buffer on one device (tuple results: summed).
        group_size: devices per replica group; for collective-permute, the number of devices
            that send to another device.
        op_name: the `op_name` metadata (contains the shardplan op name scope), or "".
        instruction: the HLO instruction name, e.g. `all-reduce.3`.
    """

    kind: str
    bytes_per_device: int
    group_size: int
    op_name: str = ""
    instruction: str = ""


def hlo_arrays(shape_text: str,
               element_bytes: Mapping[str, int] | None = None) -> list[tuple[str, int]]:
    """[(`f32[8,16]`, bytes), ...] of the arrays in an HLO shape (a tuple gives several).

    `element_bytes` overrides the width of HLO element types, e.g. `{"f64": 4}` counts a float64
    program's buffers at the float32 width of the plan it verifies.
    """
    widths = {**_DTYPE_BYTES, **(element_bytes or {})}
    out = []
    for dtype, dims in _ARRAY.findall(shape_text):
        if dtype not in widths:
            continue
        n = 1
        for d in dims.split(","):
            d = d.strip().lstrip("<=")
            if d:
                n *= int(d)
        out.append((f"{dtype}[{dims}]", n * widths[dtype]))
    return out


def _group_size(line: str, kind: str, devices: int) -> int:
    if kind == "collective-permute":
        m = _PAIRS.search(line)
        if not m:
            return 0
        pairs = re.findall(r"\{(\d+),(\d+)\}", m.group(1))
        return len({int(s) for s, t in pairs if s != t})
    m = _IOTA_GROUPS.search(line)
    if m:
        return int(m.group(1).split(",")[-1])
    m = _MESH_GROUPS.search(line)
    if m:
        sizes = {k: int(v) for k, v in re.findall(r"'([^']*)'\s*=\s*(\d+)", m.group(1))}
        size = 1
        for token in re.findall(r"'[^']*'(?::\(\d+\)\d+)?", m.group(2)):
            sub = re.fullmatch(r"'([^']*)':\(\d+\)(\d+)", token)
            size *= int(sub.group(2)) if sub else sizes.get(token.strip("'"), 1)
        return size
    m = _EXPLICIT_GROUPS.search(line)
    if m:
        if not m.group(1):
            return devices  # `replica_groups={}`: one group of every device
        first = re.search(r"\{([\d,\s]*)\}", m.group(1))
        return len([d for d in first.group(1).split(",") if d.strip()]) if first else devices
    return devices


def parse_collectives(hlo_text: str,
                      element_bytes: Mapping[str, int] | None = None) -> list[Collective]:
    """Every collective instruction of (compiled) HLO text, in text order.

    Understands replica groups written explicitly (`{{0,1},{2,3}}`), as iota tiles
    (`[2,4]<=[8]`, `[4,2]<=[2,4]T(1,0)`) and as mesh axes (`mesh['a'=2,'b'=4] {'b'}`); an empty
    group list means all devices (num_partitions x replica_count of the module). Async pairs
    count once, at `-start` (for all-gather / collective-permute starts, whose result is an
    (operand, result) tuple, the last tuple element is the result buffer). `element_bytes`: see
    `hlo_arrays`.
    """
    m = _NUM_PARTITIONS.search(hlo_text)
    r = _NUM_REPLICAS.search(hlo_text)
    devices = (int(m.group(1)) if m else 1) * (int(r.group(1)) if r else 1)
    found: list[Collective] = []
    for line in hlo_text.splitlines():
        inst = _INSTRUCTION.match(line)
        if not inst or inst.group("suffix") == "-done":
            continue
        kind = inst.group("kind")
        shape = inst.group("shape")
        if inst.group("suffix") == "-start" and kind in ("all-gather", "collective-permute"):
            parts = _ARRAY.findall(shape)
            if shape.lstrip().startswith("(") and len(parts) >= 2:
                dtype, dims = parts[-1]
                shape = f"{dtype}[{dims}]"
        name = _OP_NAME.search(line)
        nbytes = sum(b for _, b in hlo_arrays(shape, element_bytes))
        found.append(Collective(kind, nbytes, _group_size(line, kind, devices),
                                name.group(1) if name else "", inst.group("name")))
    return found


def collective_summary(collectives: list[Collective]) -> dict[str, tuple[int, int]]:
    """kind -> (count, total bytes per device)."""
    out: dict[str, tuple[int, int]] = {}
    for c in collectives:
        count, total = out.get(c.kind, (0, 0))
        out[c.kind] = (count + 1, total + c.bytes_per_device)
    return out


__all__ = [
    "COLLECTIVE_KINDS", "Collective", "abstract_args", "axis_names", "collective_summary",
    "compiled_text", "forward_fn", "init_params", "jax_mesh", "kernels", "loss_fn",
    "loss_from_outputs", "make_inputs", "parse_collectives", "partition_spec", "sharded_call",
    "shardings_for",
]
