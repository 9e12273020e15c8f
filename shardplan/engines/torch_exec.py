"""Run a shardplan graph in PyTorch in one process: values, one kernel per kind, the executor.

- `init_values`: deterministic numpy values for a graph's parameters, inputs and constants.
- `kernels()`: ONE torch implementation per catalogue kind, keyed by `op.kind` (the same math as
  `shardplan.engines.jax.kernels`): `kernel(op, *operands) -> tensor`; `check_kinds` names the
  first op without one.
- `execute` / `forward`: the single-process executor (ops in graph order); `loss_from_outputs`:
  the training loss both the single-process and the distributed runs differentiate.

The distributed runner (`shardplan.engines.torch_runner`) calls the same kernels on local
shards. Local kernels see global information only through the op (its signature's global
extents), so a mean divides by the global count (`reduce_mean`, `cross_entropy`: a sum over the
local rows over the global row count, partial across the cut rounds). The kinds that need the
device's position (reshape, embedding with the vocabulary cut, conv2d / pool2d with a window dim
cut, batch_norm with a statistics dim cut) are handled by the runner, not the kernel.

torch is imported inside the functions that need it; without it they raise
MissingDependencyError. Values come from `shardplan.engines._common` (`init_params`,
`init_inputs`): the same numbers as the JAX backend, ids and labels as int64.
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
    einsum_letters,
    index_bound,
    init_inputs,
    init_params,
)
from shardplan.engines._common import pair as _pair
from shardplan.errors import BackendError, UnsupportedOpError
from shardplan.ir.dims import DimKind
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op
from shardplan.lazy import require

Kernel = Callable[..., Any]


def _require_torch() -> Any:
    return require("torch", extra="torch", user="the torch backend")


# -- values --------------------------------------------------------------------------------------


def init_values(graph: Graph, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """`(params, inputs)`: numpy values for every parameter, and every input and constant.

    `shardplan.engines._common.init_params` and `init_inputs` with int64 ids and labels: the
    values of `shardplan.engines.jax.init_params` / `make_inputs` (which use int32 ids).
    Deterministic in (seed, tensor name).
    """
    return init_params(graph, seed), init_inputs(graph, seed, np.int64)


# -- kernels -------------------------------------------------------------------------------------


def _reduce_count(op: Op) -> int:
    """Global number of elements a mean-like op divides by: the product of its REDUCE extents."""
    count = 1
    for d in op.signature.loop_dims:
        if d.kind is DimKind.REDUCE:
            count *= d.extent
    return count


def _elementwise(
    torch: Any, fn: Callable[[Any, Any], Any], kind: str, alpha: bool = False
) -> Kernel:
    """`fn` folded over the operands and the importer's Python-number attributes (`scalar` +
    `reverse`, extra `scalars`; `alpha` of add/sub scales the second operand)."""

    def kernel(op: Op, *xs: Any) -> Any:
        values: list[Any] = list(xs)
        scalar = op.attr("scalar")
        if isinstance(scalar, (int, float)) and not isinstance(scalar, bool):
            values.insert(0, scalar) if op.attr("reverse") else values.append(scalar)
        for extra in op.attr("scalars", ()) or ():
            if isinstance(extra, (int, float)) and not isinstance(extra, bool):
                values.append(extra)
        scale = op.attr("alpha") if alpha else None  # add/sub(x, y, alpha): x +- alpha * y
        if scale is not None and len(values) == 2:
            values[1] = values[1] * scale
        if not any(isinstance(v, torch.Tensor) for v in values):
            raise BackendError(f"op {op.name!r} ({kind}) has no tensor operand")
        values = [v if isinstance(v, torch.Tensor) else torch.as_tensor(v) for v in values]
        result = values[0]
        for v in values[1:]:
            result = fn(result, v)
        return result

    return kernel


def _norm_kernels(torch: Any) -> dict[str, Kernel]:
    """The normalisations of `kernels`: layer_norm, rms_norm, batch_norm (batch statistics)."""

    def eps(op: Op) -> float:
        value = op.attr("eps")
        return 1e-5 if value is None else float(value)

    def layer_norm(op: Op, x: Any, gamma: Any = None, beta: Any = None) -> Any:
        mean = x.mean(dim=-1, keepdim=True)
        var = (x - mean).square().mean(dim=-1, keepdim=True)
        return affine((x - mean) * torch.rsqrt(var + eps(op)), gamma, beta)

    def rms_norm(op: Op, x: Any, gamma: Any = None, beta: Any = None) -> Any:
        ms = x.square().mean(dim=-1, keepdim=True)
        return affine(x * torch.rsqrt(ms + eps(op)), gamma, beta)

    def batch_norm(op: Op, x: Any, scale: Any, shift: Any) -> Any:
        axes = tuple(i for i in range(x.ndim) if i != 1)
        shape = [1] * x.ndim
        shape[1] = x.shape[1]
        mean = x.mean(dim=axes, keepdim=True)
        var = (x - mean).square().mean(dim=axes, keepdim=True)
        return (x - mean) * torch.rsqrt(var + eps(op)) * scale.reshape(shape) + shift.reshape(shape)

    return {"layer_norm": layer_norm, "rms_norm": rms_norm, "batch_norm": batch_norm}


def _window_kernels(torch: Any) -> dict[str, Kernel]:
    """The sliding-window kernels of `kernels`: conv2d (groups from the local shapes) and
    max/avg pool2d."""
    F = torch.nn.functional

    def conv2d(op: Op, x: Any, w: Any) -> Any:
        return F.conv2d(  # groups from the (local) shapes: each part holds whole groups
            x, w, stride=_pair(op.attr("stride", 1)), padding=_pair(op.attr("padding", 0)),
            groups=x.shape[1] // w.shape[1],
        )

    def pool2d(op: Op, x: Any) -> Any:
        kernel = _pair(op.attr("kernel", 2))
        stride = _pair(op.attr("stride", op.attr("kernel", 2)))
        padding = _pair(op.attr("padding", 0))
        mode = str(op.attr("mode", "max"))
        if mode == "max":
            return F.max_pool2d(x, kernel, stride, padding)
        if mode == "avg":  # padded cells count (count_include_pad=True), as in the JAX backend
            return F.avg_pool2d(x, kernel, stride, padding, count_include_pad=True)
        raise UnsupportedOpError(f"op {op.name!r} (pool2d): mode {mode!r} is not max or avg")

    return {"conv2d": conv2d, "pool2d": pool2d}


def _reduce_kernels(torch: Any, fl: Callable[[Any], Any]) -> dict[str, Kernel]:
    """The reductions of `kernels`; reduce_mean divides by the GLOBAL count (see module doc)."""

    def axes_of(op: Op, x: Any) -> tuple[int, ...]:
        axes = op.attr("axes")
        return tuple(range(x.ndim)) if axes is None else tuple(int(a) % x.ndim for a in axes)

    def reduce_sum(op: Op, x: Any) -> Any:
        return torch.sum(x, dim=axes_of(op, x), keepdim=bool(op.attr("keepdims", False)))

    def reduce_mean(op: Op, x: Any) -> Any:  # a sum over the GLOBAL count (see module doc)
        return reduce_sum(op, fl(x)) / _reduce_count(op)

    def reduce_max(op: Op, x: Any) -> Any:
        return torch.amax(x, dim=axes_of(op, x), keepdim=bool(op.attr("keepdims", False)))

    return {"reduce_sum": reduce_sum, "reduce_mean": reduce_mean, "reduce_max": reduce_max}


def kernels() -> dict[str, Kernel]:
    """One torch implementation per catalogue kind: `kernel(op, *operands) -> tensor`.

    The math of `shardplan.engines.jax.kernels` (linear = x @ w.T, batch statistics in
    batch_norm, avg pooling counts padded cells, dropout is the identity, cast keeps the
    dtype: the backend computes in one float dtype).
    Elementwise kernels also read the importer's attributes: `scalar` (+ `reverse`) for an
    operand that is a Python number, `alpha` of add/sub, extra `scalars` of maximum/minimum;
    gelu's `approximate` may be a bool or torch's "none"/"tanh".
    """
    torch = _require_torch()
    F = torch.nn.functional

    def fl(x: Any) -> Any:  # integer operands (ids, masks) compute in the default float dtype
        return x if x.is_floating_point() else x.to(torch.get_default_dtype())

    def unary(fn: Callable[[Any], Any], float_only: bool = True) -> Kernel:
        return lambda op, x: fn(fl(x) if float_only else x)

    def gelu(op: Op, x: Any) -> Any:
        approx = op.attr("approximate", False)
        mode = approx if isinstance(approx, str) else ("tanh" if approx else "none")
        return F.gelu(fl(x), approximate=mode)

    def matmul(op: Op, a: Any, b: Any) -> Any:
        return torch.matmul(a, b.transpose(-1, -2) if op.attr("transpose_b") else b)

    def cross_entropy(op: Op, logits: Any, labels: Any) -> Any:
        logp = torch.log_softmax(fl(logits), dim=-1)
        picked = torch.gather(logp, -1, labels.long().unsqueeze(-1))
        return -picked.sum() / _reduce_count(op)

    def einsum(op: Op, *xs: Any) -> Any:
        return torch.einsum(einsum_letters(str(op.attr("spec"))), *[fl(x) for x in xs])

    return {
        "relu": unary(torch.relu, float_only=False),
        "gelu": gelu,
        "silu": unary(F.silu),
        "tanh": unary(torch.tanh),
        "sigmoid": unary(torch.sigmoid),
        "dropout": unary(lambda x: x, float_only=False),  # evaluation mode
        "cast": unary(lambda x: x, float_only=False),  # one float dtype throughout
        "exp": unary(torch.exp),
        "neg": unary(torch.neg, float_only=False),
        "scale": lambda op, x: x * float(op.attr("value", 1.0)),
        "sqrt": unary(torch.sqrt),
        "rsqrt": unary(torch.rsqrt),
        "identity": unary(lambda x: x, float_only=False),
        "add": _elementwise(torch, torch.add, "add", alpha=True),
        "sub": _elementwise(torch, torch.sub, "sub", alpha=True),
        "mul": _elementwise(torch, torch.mul, "mul"),
        "div": _elementwise(torch, torch.div, "div"),
        "maximum": _elementwise(torch, torch.maximum, "maximum"),
        "minimum": _elementwise(torch, torch.minimum, "minimum"),
        "bias_add": bias_add,
        "softmax": lambda op, x: torch.softmax(fl(x), dim=int(op.attr("axis", -1))),
        "linear": lambda op, x, w: torch.matmul(x, w.t()),
        "matmul": matmul,
        "bmm": matmul,
        "reshape": lambda op, x: x.reshape(tuple(int(s) for s in op.attr("shape"))),
        "transpose": lambda op, x: x.permute(tuple(int(p) for p in op.attr("perm"))),
        "embedding": lambda op, table, ids: F.embedding(ids.long(), table),
        "concat": lambda op, *xs: torch.cat(xs, dim=int(op.attr("axis", 0))),
        "cross_entropy": cross_entropy,
        "einsum": einsum,
        "attention": lambda op, *xs: attention(
            op, lambda s: torch.softmax(s, dim=-1), *[fl(x) for x in xs]
        ),
        **_norm_kernels(torch),
        **_window_kernels(torch),
        **_reduce_kernels(torch, fl),
        **moe_kernels.torch_kernels(),
    }


def check_kinds(graph: Graph, table: Mapping[str, Kernel] | None = None) -> None:
    """Raise UnsupportedOpError naming the first op whose kind has no torch kernel."""
    table = kernels() if table is None else table
    for op in graph.ops:
        if op.kind not in table:
            raise UnsupportedOpError(
                f"op {op.name!r} has kind {op.kind!r}, which the torch backend does not "
                f"implement; implemented kinds: {sorted(table)}"
            )


# -- single-process executor ---------------------------------------------------------------------


def _as_torch(values: Mapping[str, Any]) -> dict[str, Any]:
    torch = _require_torch()
    return {
        k: (v if isinstance(v, torch.Tensor) else torch.from_numpy(np.array(v)))
        for k, v in values.items()
    }


def execute(
    graph: Graph,
    params: Mapping[str, Any],
    inputs: Mapping[str, Any],
    table: Mapping[str, Kernel] | None = None,
) -> dict[str, Any]:
    """Evaluate every op of `graph` in order; return every tensor (params, inputs, activations).

    `params` / `inputs` are numpy arrays or torch tensors (see `init_values`); torch tensors are
    used as given (so gradients flow to leaves that require them).
    """
    table = kernels() if table is None else table
    check_kinds(graph, table)
    env: dict[str, Any] = {**_as_torch(inputs), **_as_torch(params)}
    for op in graph.ops:
        try:
            args = [env[t] for t in op.inputs]
        except KeyError as e:
            raise BackendError(
                f"op {op.name!r} ({op.kind}) needs tensor {e.args[0]!r}, which is neither in "
                "params, inputs nor produced earlier; build them with init_values"
            ) from None
        result = table[op.kind](op, *args)
        results = result if isinstance(result, tuple) else (result,)
        if len(results) != len(op.outputs):
            raise BackendError(
                f"op {op.name!r} ({op.kind}) gave {len(results)} results; the graph expects "
                f"{len(op.outputs)}"
            )
        for name, value in zip(op.outputs, results, strict=True):
            if tuple(value.shape) != graph.tensors[name].shape:
                raise BackendError(
                    f"op {op.name!r} ({op.kind}) gave shape {tuple(value.shape)} for {name!r}; "
                    f"the graph says {graph.tensors[name].shape}"
                )
            env[name] = value
    return env


def forward(graph: Graph, params: Mapping[str, Any], inputs: Mapping[str, Any]) -> dict[str, Any]:
    """`{graph output name: tensor}` of the single-process executor."""
    env = execute(graph, params, inputs)
    return {name: env[name] for name in graph.outputs}


def loss_from_outputs(graph: Graph, outputs: Mapping[str, Any]) -> Any:
    """The training loss: the graph's scalar output(s) if any, else the sum of all outputs."""
    scalars = [t for t in graph.outputs if graph.tensors[t].shape == ()]
    names = scalars or list(graph.outputs)
    total = outputs[names[0]].sum()
    for name in names[1:]:
        total = total + outputs[name].sum()
    return total


__all__ = [
    "Kernel",
    "check_kinds",
    "einsum_letters",
    "execute",
    "forward",
    "index_bound",
    "init_values",
    "kernels",
    "loss_from_outputs",
]
