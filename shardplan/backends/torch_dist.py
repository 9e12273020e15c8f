"""Run a shardplan graph in PyTorch, and run a Plan on torch.distributed DTensors (gloo, CPU).

- `init_values`: deterministic numpy values for a graph's parameters, inputs and constants.
- `kernels()`: ONE torch implementation per catalogue kind, keyed by `op.kind` (the same math as
  `shardplan.backends.jax.kernels`): `kernel(op, *operands) -> tensor`.
- `execute` / `forward`: the single-process executor (ops in graph order).
- `run_distributed(plan)`: spawns one local process per device (`torch.multiprocessing`, start
  method "spawn", gloo), builds a DeviceMesh shaped like the plan's rounds
  (`shardplan.exporters.dtensor.mesh_shape`), distributes every parameter and input to its
  planned placements with `distribute_tensor`, and executes the graph op by op: each operand is
  `.redistribute`d to the placements the op's strategy reads (`operand_layout`: split ->
  `Shard(d)`, replicated -> `Replicate()`), the kernel runs on the local shards (`to_local()`),
  and the result is wrapped with `DTensor.from_local` in the op's raw output placements
  (`Shard(d)`, `Replicate()`, or `Partial()` where a REDUCE cut leaves partial sums; consumers'
  redistributions then insert the all-reduce / reduce-scatter). Rank 0 compares the outputs
  (and, by default, every activation; with `train=True` also every parameter gradient) with the
  single-process run of the same executor and returns a `DistReport`.
- `verify_torch(plan)`: the hook behind `shardplan verify PLAN --engine torch`.

Numerics: float32 by default; a tensor matches when max|dist - single| <= rtol * max|single| +
atol with rtol 1e-4, atol 1e-5 (`TOLERANCES`, a normwise criterion). Sharded partial sums add
in another order than the single-process run, so bitwise equality is not expected; relative
errors measured on the zoo and on imported HF models are <= 1e-5 (mostly ~1e-7). Deep chains
of batch norms over a few elements (ResNet-50 at 32x32 pixels) amplify fp32 rounding beyond any
useful tolerance — the single-process fp32 run itself is then ~1e-2 away from float64 — so
`dtype="float64"` runs both sides in float64 (rtol 1e-9, atol 1e-12) to check the sharding
exactly, without fp32 noise.

Local kernels see global information only through the op (its signature's global extents), so a
mean divides by the global count (`reduce_mean`, `cross_entropy`: a sum over the local rows over
the global row count, partial across the cut rounds). Four kinds need the device's position and
are handled by the distributed runner, not the kernel:
- `reshape`: the target shape attribute is global; the local target is derived from the output
  layout.
- `embedding` with the vocabulary `v` cut: masked lookup of the ids the local table block owns
  (offset = block index * local rows), zeros elsewhere, result `Partial()`.
- `conv2d` / `pool2d` with a WINDOW dim (`y`, `x`) cut: the input is read replicated along that
  spatial dim in the cutting rounds (an all-gather where the cost model predicts a halo
  exchange), padded explicitly, and each device convolves the rows its output block needs.
- `batch_norm` with a statistics dim (batch, spatial) cut: the per-channel sums are made
  `Partial()` and redistributed to `Replicate()` (all-reduce), twice (mean, then variance), so
  the statistics are the global batch statistics of the single-process run.

Redistributions are DTensor's: on gloo a Shard(a) -> Shard(b) change runs as all-gather + chunk
(no CPU all-to-all) and nested shards of one dim as sequential all-gathers; `DistReport.
redistributions` counts the per-round placement changes the runner asked for, by the collective
they mean (what the cost model prices), not the gloo calls.

Gradients (`train=True`): operands read replicated by an op that cuts something in that round get
`Partial()` gradient placements (`to_local(grad_placements=...)`), so DTensor all-reduces the
gradient of replicated parameters (the data-parallel gradient sync) in backward.

torch is imported inside the functions that need it; without it they raise
MissingDependencyError. Values: parameters are normal * 0.02 (norm scales 1), the same numbers as
`shardplan.backends.jax.init_params`; see `init_values` for inputs and constants.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import math
import os
import shutil
import socket
import string
import tempfile
import time
import zlib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardplan.errors import (
    BackendError,
    MissingDependencyError,
    ShardplanError,
    UnsupportedOpError,
)
from shardplan.ir.dims import DimKind
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role, Tensor
from shardplan.plan import Plan
from shardplan.sharding import PARTIAL, REPLICATED, Layout, Strategy, operand_layout

Kernel = Callable[..., Any]

RTOL = 1e-4
ATOL = 1e-5
TOLERANCES: dict[str, tuple[float, float]] = {"float32": (RTOL, ATOL), "float64": (1e-9, 1e-12)}
"""dtype -> default (rtol, atol): a tensor matches when max|dist - single| <= rtol * max|single|
+ atol."""

DEFAULT_TIMEOUT = 300.0
"""Seconds `run_distributed` waits for its processes (all plans of one call) before killing them."""

_NORM_KINDS = ("layer_norm", "rms_norm", "batch_norm")
_INSTALL_HINT = "install it with: pip install 'shardplan[torch]'"


def _require_torch() -> Any:
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise MissingDependencyError(
            f"the torch backend needs the `torch` extra, which is not installed ({e}); "
            f"{_INSTALL_HINT}"
        ) from e
    return torch


# -- values --------------------------------------------------------------------------------------


def _rng(seed: int, name: str) -> np.random.Generator:
    """One generator per (seed, tensor name): a tensor's values do not depend on the others."""
    return np.random.default_rng([int(seed), zlib.crc32(name.encode())])


def index_bound(graph: Graph, name: str) -> int | None:
    """Exclusive upper bound when tensor `name` holds embedding ids or class labels, else None."""
    bound: int | None = None
    for op_index, position in graph.consumers.get(name, ()):
        op = graph.ops[op_index]
        high = None
        if op.kind == "embedding" and position == 1:
            high = graph.tensors[op.inputs[0]].shape[0]
        elif op.kind == "cross_entropy" and position == 1:
            high = graph.tensors[op.inputs[0]].shape[-1]
        if high is not None:
            bound = high if bound is None else min(bound, high)
    return bound


def _constant_value(tensor: Tensor, rng: np.random.Generator) -> np.ndarray:
    shape = tensor.shape
    leaf = tensor.name.replace("/", ".").split(".")[-1]
    if "causal_mask" in tensor.name and len(shape) >= 2 and shape[-1] == shape[-2]:
        mask = np.triu(np.full((shape[-1], shape[-1]), -1e9, np.float32), k=1)
        return np.array(np.broadcast_to(mask, shape), np.float32)
    if leaf.endswith("ones"):
        return np.ones(shape, np.float32)
    if leaf.endswith("zeros"):
        return np.zeros(shape, np.float32)
    return rng.standard_normal(shape).astype(np.float32)


def init_values(graph: Graph, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """`(params, inputs)`: numpy values for every parameter, and every input and constant.

    Parameters: float32 normal * 0.02, norm scales (gamma) 1 — the values of
    `shardplan.backends.jax.init_params`. A tensor (input or constant) that feeds an embedding's
    ids or a cross_entropy's labels is int64 in [0, rows or classes), whatever its dtype_bytes;
    other inputs are float32 standard normal. Constants: a `causal_mask` with square trailing
    dims is 0 on/below the diagonal and -1e9 above; a name ending in `ones` / `zeros` is that;
    any other constant (the importer's folded values: masks, index positions) is float32
    standard normal, because the graph does not store its values. Deterministic in
    (seed, tensor name).
    """
    norm_scales = {
        op.inputs[1] for op in graph.ops if op.kind in _NORM_KINDS and len(op.inputs) > 1
    }
    params: dict[str, np.ndarray] = {}
    inputs: dict[str, np.ndarray] = {}
    for t in graph.tensors.values():
        rng = _rng(seed, t.name)
        if t.role is Role.PARAMETER:
            if t.name in norm_scales:
                params[t.name] = np.ones(t.shape, np.float32)
            else:
                params[t.name] = (rng.standard_normal(t.shape) * 0.02).astype(np.float32)
            continue
        if t.role is Role.ACTIVATION:
            continue
        high = index_bound(graph, t.name)
        if high is not None:
            inputs[t.name] = rng.integers(0, high, size=t.shape, dtype=np.int64)
        elif t.role is Role.CONSTANT:
            inputs[t.name] = _constant_value(t, rng)
        else:
            inputs[t.name] = rng.standard_normal(t.shape).astype(np.float32)
    return params, inputs


# -- kernels -------------------------------------------------------------------------------------


def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    a, b = value
    return int(a), int(b)


def einsum_letters(spec: str) -> str:
    """`"b s e c, b s m -> e c m"` -> `"bsec,bsm->ecm"`: multi-letter loop names become letters."""
    from shardplan.ir.signature import parse_operands

    lhs, rhs = spec.split("->")
    sides = [parse_operands(lhs), parse_operands(rhs)]
    letters: dict[str, str] = {}
    for operands in sides:
        for dims in operands:
            for group in dims:
                if len(group) != 1:
                    raise UnsupportedOpError(
                        f"einsum spec {spec!r}: grouped dims {group} are not supported"
                    )
                if group[0] not in letters:
                    if len(letters) >= len(string.ascii_letters):
                        raise UnsupportedOpError(f"einsum spec {spec!r} has too many loop dims")
                    letters[group[0]] = string.ascii_letters[len(letters)]

    def side(operands: Any) -> str:
        return ",".join("".join(letters[g[0]] for g in dims) for dims in operands)

    return f"{side(sides[0])}->{side(sides[1])}"


def _reduce_count(op: Op) -> int:
    """Global number of elements a mean-like op divides by: the product of its REDUCE extents."""
    count = 1
    for d in op.signature.loop_dims:
        if d.kind is DimKind.REDUCE:
            count *= d.extent
    return count


def kernels() -> dict[str, Kernel]:
    """One torch implementation per catalogue kind: `kernel(op, *operands) -> tensor`.

    The math of `shardplan.backends.jax.kernels` (linear = x @ w.T, batch statistics in
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

    def eps(op: Op) -> float:
        value = op.attr("eps")
        return 1e-5 if value is None else float(value)

    def unary(fn: Callable[[Any], Any], float_only: bool = True) -> Kernel:
        return lambda op, x: fn(fl(x) if float_only else x)

    def gelu(op: Op, x: Any) -> Any:
        approx = op.attr("approximate", False)
        mode = approx if isinstance(approx, str) else ("tanh" if approx else "none")
        return F.gelu(fl(x), approximate=mode)

    def elementwise(fn: Callable[[Any, Any], Any], kind: str) -> Kernel:
        def kernel(op: Op, *xs: Any) -> Any:
            values: list[Any] = list(xs)
            scalar = op.attr("scalar")
            if isinstance(scalar, (int, float)) and not isinstance(scalar, bool):
                values.insert(0, scalar) if op.attr("reverse") else values.append(scalar)
            for extra in op.attr("scalars", ()) or ():
                if isinstance(extra, (int, float)) and not isinstance(extra, bool):
                    values.append(extra)
            alpha = op.attr("alpha")
            if alpha is not None and kind in ("add", "sub") and len(values) == 2:
                values[1] = values[1] * alpha
            if not any(isinstance(v, torch.Tensor) for v in values):
                raise BackendError(f"op {op.name!r} ({kind}) has no tensor operand")
            values = [v if isinstance(v, torch.Tensor) else torch.as_tensor(v) for v in values]
            result = values[0]
            for v in values[1:]:
                result = fn(result, v)
            return result

        return kernel

    def bias_add(op: Op, x: Any, bias: Any) -> Any:
        axis = int(op.attr("axis", -1)) % x.ndim
        shape = [1] * x.ndim
        shape[axis] = bias.shape[0]
        return x + bias.reshape(shape)

    def affine(y: Any, gamma: Any, beta: Any) -> Any:
        y = y if gamma is None else y * gamma
        return y if beta is None else y + beta

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

    def matmul(op: Op, a: Any, b: Any) -> Any:
        return torch.matmul(a, b.transpose(-1, -2) if op.attr("transpose_b") else b)

    def conv2d(op: Op, x: Any, w: Any) -> Any:
        if int(op.attr("groups", 1)) != 1:
            raise UnsupportedOpError(f"op {op.name!r} (conv2d): only groups=1 is supported")
        return F.conv2d(
            x, w, stride=_pair(op.attr("stride", 1)), padding=_pair(op.attr("padding", 0))
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

    def axes_of(op: Op, x: Any) -> tuple[int, ...]:
        axes = op.attr("axes")
        return tuple(range(x.ndim)) if axes is None else tuple(int(a) % x.ndim for a in axes)

    def reduce_sum(op: Op, x: Any) -> Any:
        return torch.sum(x, dim=axes_of(op, x), keepdim=bool(op.attr("keepdims", False)))

    def reduce_mean(op: Op, x: Any) -> Any:  # a sum over the GLOBAL count (see module doc)
        return reduce_sum(op, fl(x)) / _reduce_count(op)

    def reduce_max(op: Op, x: Any) -> Any:
        return torch.amax(x, dim=axes_of(op, x), keepdim=bool(op.attr("keepdims", False)))

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
        "add": elementwise(torch.add, "add"),
        "sub": elementwise(torch.sub, "sub"),
        "mul": elementwise(torch.mul, "mul"),
        "div": elementwise(torch.div, "div"),
        "maximum": elementwise(torch.maximum, "maximum"),
        "minimum": elementwise(torch.minimum, "minimum"),
        "bias_add": bias_add,
        "softmax": lambda op, x: torch.softmax(fl(x), dim=int(op.attr("axis", -1))),
        "layer_norm": layer_norm,
        "rms_norm": rms_norm,
        "batch_norm": batch_norm,
        "linear": lambda op, x, w: torch.matmul(x, w.t()),
        "matmul": matmul,
        "bmm": matmul,
        "conv2d": conv2d,
        "pool2d": pool2d,
        "reduce_sum": reduce_sum,
        "reduce_mean": reduce_mean,
        "reduce_max": reduce_max,
        "reshape": lambda op, x: x.reshape(tuple(int(s) for s in op.attr("shape"))),
        "transpose": lambda op, x: x.permute(tuple(int(p) for p in op.attr("perm"))),
        "embedding": lambda op, table, ids: F.embedding(ids.long(), table),
        "concat": lambda op, *xs: torch.cat(xs, dim=int(op.attr("axis", 0))),
        "cross_entropy": cross_entropy,
        "einsum": einsum,
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


# -- reports -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TensorError:
    """Distributed vs single-process values of one tensor.

    `max_abs` = max |dist - single|; `max_rel` = max_abs / max(max |single|, atol / rtol) (relative
    to the tensor's scale, floored so that a tensor of rounding noise, e.g. a gradient that is
    mathematically zero, does not report a huge relative error); `ok` = equal shapes, NaNs in the
    same places and max_abs <= rtol * max|single| + atol (so max_rel <= rtol implies ok).
    """

    name: str
    max_abs: float
    max_rel: float
    ok: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class DistReport:
    """What `run_distributed` measured for one plan.

    Attributes:
        model, method, mesh: the plan's graph name, method and mesh text.
        mesh_shape: the DeviceMesh shape (q per round); world_size: processes (= devices).
        ok: every compared tensor within tolerance.
        outputs: graph outputs; activations: worst activation, first op whose output differs
            (`first_mismatch`, None if none) and how many were compared; grads (train only):
            every parameter's gradient.
        max_abs_error / max_rel_error: worst over everything compared.
        redistributions: per-round placement transitions the runner asked DTensor for, by the
            collective they imply ("all-gather" S->R, "all-reduce" P->R, "reduce-scatter" P->S,
            "all-to-all" S(a)->S(b), "slice" R->S (local)), counted once per round and operand.
        seconds: rank 0's distributed execution time (forward, and backward when train);
            wall_seconds: the whole call (process start-up included), shared by its plans.
    """

    model: str
    method: str
    mesh: str
    mesh_shape: tuple[int, ...]
    world_size: int
    train: bool
    ok: bool
    dtype: str
    rtol: float
    atol: float
    outputs: tuple[TensorError, ...]
    max_abs_error: float
    max_rel_error: float
    activations_checked: int = 0
    worst_activation: TensorError | None = None
    first_mismatch: str | None = None
    grads: tuple[TensorError, ...] = ()
    redistributions: Mapping[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    wall_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": "torch.distributed (gloo, DTensor)",
            "model": self.model,
            "method": self.method,
            "mesh": self.mesh,
            "mesh_shape": list(self.mesh_shape),
            "world_size": self.world_size,
            "train": self.train,
            "ok": self.ok,
            "dtype": self.dtype,
            "rtol": self.rtol,
            "atol": self.atol,
            "max_abs_error": self.max_abs_error,
            "max_rel_error": self.max_rel_error,
            "outputs": [e.to_dict() for e in self.outputs],
            "activations_checked": self.activations_checked,
            "worst_activation": self.worst_activation.to_dict() if self.worst_activation else None,
            "first_mismatch": self.first_mismatch,
            "grads": [e.to_dict() for e in self.grads],
            "redistributions": dict(self.redistributions),
            "seconds": self.seconds,
            "wall_seconds": self.wall_seconds,
        }

    def text(self) -> str:
        """A few human-readable lines (what `shardplan verify --engine torch` prints)."""
        status = "OK" if self.ok else "MISMATCH"
        lines = [
            f"{status}: {self.model} ({self.method}) on mesh {self.mesh} = DeviceMesh"
            f"{self.mesh_shape}, {self.world_size} gloo processes, "
            f"{'forward+backward' if self.train else 'forward'} in {self.seconds:.2f}s",
            f"  {self.dtype}, tolerance max|err| <= {self.rtol:g} * max|ref| + {self.atol:g}; "
            "max abs error "
            f"{self.max_abs_error:.3g}, max rel error {self.max_rel_error:.3g}",
        ]
        for e in self.outputs:
            lines.append(
                f"  output {e.name}: abs {e.max_abs:.3g} rel {e.max_rel:.3g} "
                f"{'ok' if e.ok else 'MISMATCH'}"
            )
        if self.activations_checked:
            worst = self.worst_activation
            lines.append(
                f"  {self.activations_checked} activations compared; worst "
                f"{worst.name if worst else '-'} abs {worst.max_abs if worst else 0.0:.3g}"
                + (f"; first mismatch at op {self.first_mismatch}" if self.first_mismatch else "")
            )
        if self.grads:
            g = max(self.grads, key=lambda e: (not e.ok, e.max_rel))
            bad = sum(not e.ok for e in self.grads)
            lines.append(
                f"  {len(self.grads)} parameter gradients compared, {bad} mismatched; worst "
                f"{g.name} abs {g.max_abs:.3g} rel {g.max_rel:.3g}"
            )
        if self.redistributions:
            parts = ", ".join(f"{k} {v}" for k, v in sorted(self.redistributions.items()))
            lines.append(f"  redistributions (per round): {parts}")
        return "\n".join(lines)


def _error(name: str, got: Any, ref: Any, rtol: float, atol: float) -> TensorError:
    torch = _require_torch()
    got = got.detach().to(torch.float64)
    ref = ref.detach().to(torch.float64)
    if got.shape != ref.shape:
        return TensorError(name, math.inf, math.inf, False)
    if got.numel() == 0:
        return TensorError(name, 0.0, 0.0, True)
    same_nan = torch.equal(torch.isnan(got), torch.isnan(ref))
    diff = torch.nan_to_num((got - ref).abs(), nan=0.0)
    max_abs = float(diff.max())
    scale = float(torch.nan_to_num(ref.abs(), nan=0.0).max())
    floor = max(scale, atol / rtol if rtol > 0 else 0.0)
    max_rel = max_abs / floor if floor > 0 else (0.0 if max_abs == 0 else math.inf)
    ok = same_nan and math.isfinite(max_abs) and max_abs <= rtol * scale + atol
    return TensorError(name, max_abs, max_rel, ok)


def _worst(errors: Sequence[TensorError]) -> tuple[float, float]:
    return (
        max((e.max_abs for e in errors), default=0.0),
        max((e.max_rel for e in errors), default=0.0),
    )


# -- the distributed runner (inside each process) ------------------------------------------------


def _transition(src: Any, dst: Any) -> str | None:
    """The collective one round's placement change implies (None: no change)."""
    if src == dst:
        return None
    if src.is_partial():
        return "reduce-scatter" if dst.is_shard() else "all-reduce"
    if src.is_shard():
        return "all-to-all" if dst.is_shard() else "all-gather"
    return "slice" if dst.is_shard() else "replicate-to-partial"


class _Runner:
    """Executes one plan on DTensors in one process of the world."""

    def __init__(self, plan: Plan, mesh: Any, table: Mapping[str, Kernel], train: bool) -> None:
        import torch
        from torch.distributed import tensor as dt

        self.torch, self.dt = torch, dt
        self.plan, self.graph, self.mesh, self.table = plan, plan.graph, mesh, table
        self.rounds = plan.mesh.rounds
        self.train = train
        coordinate = mesh.get_coordinate()
        self.coords = tuple(int(c) for c in coordinate) if coordinate is not None else ()
        self.redistributions: Counter[str] = Counter()
        self.env: dict[str, Any] = {}

    # -- placements ------------------------------------------------------------------------------
    def placements(self, layout: Layout, reducers: Sequence[str | None] = ()) -> tuple[Any, ...]:
        dt = self.dt
        if not self.rounds:  # one device: a trivial mesh dim
            return (dt.Replicate(),)
        out = []
        for r, s in enumerate(layout):
            if s == REPLICATED:
                out.append(dt.Replicate())
            elif s == PARTIAL:
                reducer = reducers[r] if r < len(reducers) else None
                out.append(dt.Partial(reducer or "sum"))
            else:
                out.append(dt.Shard(s))
        return tuple(out)

    def block(self, rounds: Sequence[int]) -> int:
        """Block index of this device along a dim split by `rounds` (round order, row-major)."""
        index = 0
        for r in sorted(rounds):
            index = index * self.rounds[r].q + self.coords[r]
        return index

    def local_shape(self, shape: Sequence[int], layout: Layout) -> tuple[int, ...]:
        out = list(shape)
        for r, s in enumerate(layout):
            if s >= 0:
                out[s] //= self.rounds[r].q
        return tuple(out)

    # -- values ----------------------------------------------------------------------------------
    def distribute(self, values: Mapping[str, np.ndarray]) -> None:
        """`distribute_tensor` every value to its planned placements (the DTensor exporter's)."""
        from shardplan.exporters.dtensor import placement_texts, to_placements

        torch, dt = self.torch, self.dt
        texts = placement_texts(self.plan)
        for name, array in values.items():
            placements = to_placements(texts[name]) or (dt.Replicate(),)
            value = torch.from_numpy(np.array(array))
            d = dt.distribute_tensor(value, self.mesh, placements, src_data_rank=None)
            if self.train and self.graph.tensors[name].role is Role.PARAMETER:
                d = d.detach().requires_grad_(True)
            self.env[name] = d

    # -- ops -------------------------------------------------------------------------------------
    def run(self) -> None:
        for op in self.graph.ops:
            try:
                self.run_op(op)
            except ShardplanError:
                raise
            except Exception as e:
                raise BackendError(
                    f"op {op.name!r} ({op.kind}) with strategy "
                    f"{tuple(self.plan.strategies[op.name])} failed on rank "
                    f"{self.torch.distributed.get_rank()}: {type(e).__name__}: {e}"
                ) from e

    def run_op(self, op: Op) -> None:
        dt = self.dt
        strategy: Strategy = tuple(self.plan.strategies[op.name])
        kinds = {d.name: d.kind for d in op.signature.loop_dims}
        window = {r for r, d in enumerate(strategy) if d is not None and kinds[d] is DimKind.WINDOW}
        locals_: list[Any] = []
        for i, name in enumerate(op.inputs):
            layout = list(operand_layout(op, strategy, i))
            if i == 0 and window:  # read the spatial dims whole; the op slices its rows
                for r in window:
                    layout[r] = REPLICATED
            target = self.placements(tuple(layout))
            x = self.env[name]
            if tuple(x.placements) != target:
                for src, dst in zip(x.placements, target, strict=True):
                    kind = _transition(src, dst)
                    if kind:
                        self.redistributions[kind] += 1
                x = x.redistribute(self.mesh, target)
            grad = tuple(
                dt.Partial() if self.rounds and layout[r] == REPLICATED and strategy[r] else p
                for r, p in enumerate(target)
            )
            locals_.append(x.to_local(grad_placements=grad))
        result = self.local_call(op, strategy, locals_, window)
        results = result if isinstance(result, tuple) else (result,)
        if len(results) != len(op.outputs):
            raise BackendError(
                f"op {op.name!r} ({op.kind}) gave {len(results)} results; the graph expects "
                f"{len(op.outputs)}"
            )
        from shardplan.exporters.dtensor import partial_reducers

        for i, (name, value) in enumerate(zip(op.outputs, results, strict=True)):
            layout = operand_layout(op, strategy, i, True)
            shape = self.graph.tensors[name].shape
            expect = self.local_shape(shape, layout)
            if tuple(value.shape) != expect:
                raise BackendError(
                    f"op {op.name!r} ({op.kind}) strategy {strategy}: local result {name!r} has "
                    f"shape {tuple(value.shape)}, expected {expect} (global {shape}, layout "
                    f"{layout})"
                )
            self.env[name] = dt.DTensor.from_local(
                value,
                self.mesh,
                self.placements(layout, partial_reducers(op, strategy, i)),
                shape=self.torch.Size(shape),
                stride=_contiguous_stride(shape),
            )

    def local_call(self, op: Op, strategy: Strategy, locals_: list[Any], window: set[int]) -> Any:
        if op.kind == "reshape":
            layout = operand_layout(op, strategy, 0, True)
            target = self.local_shape(self.graph.tensors[op.outputs[0]].shape, layout)
            return self.table["reshape"](_with_attrs(op, shape=target), *locals_)
        if op.kind == "embedding" and "v" in strategy:
            return self.masked_lookup(op, strategy, *locals_)
        if op.kind in ("conv2d", "pool2d") and window:
            return self.windowed(op, strategy, locals_, window)
        if op.kind == "batch_norm" and any(d not in (None, "d1") for d in strategy):
            return self.batch_norm(op, strategy, *locals_)
        return self.table[op.kind](op, *locals_)

    def masked_lookup(self, op: Op, strategy: Strategy, table: Any, ids: Any) -> Any:
        """Embedding with the vocabulary cut: each device looks up the ids its rows own."""
        torch = self.torch
        rows = table.shape[0]
        offset = self.block([r for r, d in enumerate(strategy) if d == "v"]) * rows
        local = ids.long() - offset
        owned = (local >= 0) & (local < rows)
        out = torch.nn.functional.embedding(local.clamp(0, rows - 1), table)
        return out * owned.unsqueeze(-1).to(out.dtype)

    def windowed(self, op: Op, strategy: Strategy, locals_: list[Any], window: set[int]) -> Any:
        """conv2d / pool2d with y or x cut: pad explicitly, keep the rows this block needs."""
        torch = self.torch
        x = locals_[0]
        if op.kind == "conv2d":
            kernel = tuple(int(k) for k in locals_[1].shape[2:])
            stride = _pair(op.attr("stride", 1))
            fill = 0.0
        else:
            kernel = _pair(op.attr("kernel", 2))
            stride = _pair(op.attr("stride", op.attr("kernel", 2)))
            fill = -math.inf if str(op.attr("mode", "max")) == "max" else 0.0
        py, px = _pair(op.attr("padding", 0))
        x = torch.nn.functional.pad(x, (px, px, py, py), value=fill)
        extents = op.signature.extents
        for axis, name in ((2, "y"), (3, "x")):
            cut = [r for r in window if strategy[r] == name]
            if not cut:
                continue
            parts = math.prod(self.rounds[r].q for r in cut)
            rows = extents[name] // parts
            k, s = kernel[axis - 2], stride[axis - 2]
            start = self.block(cut) * rows * s
            x = x.narrow(axis, start, (rows - 1) * s + k)
        return self.table[op.kind](_with_attrs(op, padding=(0, 0)), x, *locals_[1:])

    def batch_norm(self, op: Op, strategy: Strategy, x: Any, scale: Any, shift: Any) -> Any:
        """Batch statistics over every device of the batch/spatial cuts (two all-reduces)."""
        torch, dt = self.torch, self.dt
        stats = [r for r, d in enumerate(strategy) if d not in (None, "d1")]
        partial = tuple(
            dt.Partial() if r in stats else dt.Shard(0) if d == "d1" else dt.Replicate()
            for r, d in enumerate(strategy)
        )
        whole = tuple(dt.Replicate() if p.is_partial() else p for p in partial)

        def all_sum(local: Any) -> Any:
            d = dt.DTensor.from_local(local, self.mesh, partial)
            return d.redistribute(self.mesh, whole).to_local(grad_placements=partial)

        axes = tuple(i for i in range(x.ndim) if i != 1)
        count = math.prod(d.extent for d in op.signature.loop_dims if d.name != "d1")
        shape = [1] * x.ndim
        shape[1] = x.shape[1]
        mean = (all_sum(x.sum(dim=axes)) / count).reshape(shape)
        centred = x - mean
        var = (all_sum(centred.square().sum(dim=axes)) / count).reshape(shape)
        eps = op.attr("eps")
        inv = torch.rsqrt(var + (1e-5 if eps is None else float(eps)))
        return centred * inv * scale.reshape(shape) + shift.reshape(shape)

    # -- results ---------------------------------------------------------------------------------
    def full(self, name: str) -> Any:
        return self.env[name].full_tensor().detach()

    def loss(self) -> Any:
        """The loss of `loss_from_outputs`, from the outputs made whole (same on every rank)."""
        dt = self.dt
        whole = (dt.Replicate(),) * max(1, len(self.rounds))
        outs = {
            n: self.env[n].redistribute(self.mesh, whole).to_local() for n in self.graph.outputs
        }
        return loss_from_outputs(self.graph, outs)


def _contiguous_stride(shape: Sequence[int]) -> tuple[int, ...]:
    stride, acc = [], 1
    for size in reversed(shape):
        stride.append(acc)
        acc *= size
    return tuple(reversed(stride))


def _with_attrs(op: Op, **attrs: Any) -> Op:
    merged = dict(op.attrs)
    merged.update(attrs)
    return dataclasses.replace(op, attrs=tuple(merged.items()))


def _cast(values: Mapping[str, np.ndarray], dtype: str) -> dict[str, np.ndarray]:
    """Float arrays in `dtype` (integer ids and labels unchanged)."""
    return {
        k: v.astype(dtype) if np.issubdtype(v.dtype, np.floating) else v for k, v in values.items()
    }


def _single_process(
    graph: Graph,
    params: Mapping[str, np.ndarray],
    inputs: Mapping[str, np.ndarray],
    table: Mapping[str, Kernel],
    train: bool,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(every tensor, parameter gradients) of the single-process run."""
    torch = _require_torch()
    leaves = {n: torch.from_numpy(np.array(v)) for n, v in params.items()}
    if not train:
        with torch.no_grad():
            return execute(graph, leaves, inputs, table), {}
    leaves = {n: v.requires_grad_(True) for n, v in leaves.items()}
    env = execute(graph, leaves, inputs, table)
    loss = loss_from_outputs(graph, {n: env[n] for n in graph.outputs})
    loss.backward()
    grads = {n: (v.grad if v.grad is not None else torch.zeros_like(v)) for n, v in leaves.items()}
    return env, grads


def _run_one(plan: Plan, mesh: Any, seed: int, options: Mapping[str, Any]) -> dict[str, Any] | None:
    """Run one plan on this rank; rank 0 returns the report as a dict."""
    import torch
    import torch.distributed as dist

    train, dtype = bool(options["train"]), str(options["dtype"])
    rtol, atol = float(options["rtol"]), float(options["atol"])
    torch.set_default_dtype(getattr(torch, dtype))
    graph = plan.graph
    table = kernels()
    params, inputs = init_values(graph, seed)
    params, inputs = _cast(params, dtype), _cast(inputs, dtype)
    runner = _Runner(plan, mesh, table, train)
    dist.barrier()
    start = time.perf_counter()
    grad_mode = contextlib.nullcontext() if train else torch.no_grad()
    with grad_mode:
        runner.distribute({**params, **inputs})
        runner.run()
        if train:
            runner.loss().backward()
    seconds = time.perf_counter() - start
    with torch.no_grad():
        outs = {n: runner.full(n) for n in graph.outputs}
        acts: dict[str, Any] = {}
        if options["check_activations"]:
            for op in graph.ops:
                for t in op.outputs:
                    if t not in outs:
                        acts[t] = runner.full(t)
        grads: dict[str, Any] = {}
        if train:
            for name in params:
                g = runner.env[name].grad
                grads[name] = (
                    g.full_tensor().detach() if g is not None else torch.zeros(params[name].shape)
                )
    if dist.get_rank() != 0:
        return None
    env, ref_grads = _single_process(graph, params, inputs, table, train)
    outputs = tuple(_error(n, outs[n], env[n], rtol, atol) for n in graph.outputs)
    act_errors = [_error(n, acts[n], env[n], rtol, atol) for n in acts]
    bad = {e.name for e in (*outputs, *act_errors) if not e.ok}
    first = next((op.name for op in graph.ops if bad.intersection(op.outputs)), None)
    grad_errors = tuple(_error(n, grads[n], ref_grads[n], rtol, atol) for n in grads)
    everything = [*outputs, *act_errors, *grad_errors]
    max_abs, max_rel = _worst(everything)
    worst_act = max(act_errors, key=lambda e: (not e.ok, e.max_rel), default=None)
    report = DistReport(
        model=graph.name,
        method=plan.method,
        mesh=plan.mesh.text(),
        mesh_shape=tuple(r.q for r in plan.mesh.rounds),
        world_size=dist.get_world_size(),
        train=train,
        ok=all(e.ok for e in everything),
        dtype=dtype,
        rtol=rtol,
        atol=atol,
        outputs=outputs,
        max_abs_error=max_abs,
        max_rel_error=max_rel,
        activations_checked=len(act_errors),
        worst_activation=worst_act,
        first_mismatch=first,
        grads=grad_errors,
        redistributions=dict(runner.redistributions),
        seconds=seconds,
    )
    return report.to_dict()


def _worker(rank: int, world: int, port: int, job_path: str, out_path: str) -> None:
    """Entry point of each spawned process (module level, so "spawn" can import it)."""
    import warnings

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    for noisy in ("_redistribute", "_collective_utils"):  # "suboptimal", "no alltoall on CPU"
        logging.getLogger(f"torch.distributed.tensor.{noisy}").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch")
    with open(job_path) as f:
        job = json.load(f)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=float(job["timeout"])),
    )
    try:
        from torch.distributed.device_mesh import init_device_mesh

        shape = tuple(job["mesh_shape"]) or (1,)
        names = tuple(f"r{i}" for i in range(len(shape)))
        mesh = init_device_mesh("cpu", mesh_shape=shape, mesh_dim_names=names)
        reports = [
            _run_one(Plan.from_json(entry["plan"]), mesh, int(job["seed"]), entry)
            for entry in job["plans"]
        ]
        if rank == 0:
            tmp = out_path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(reports, f)
            os.replace(tmp, out_path)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Success: leave without interpreter finalization, which takes seconds per process with torch
    # loaded (the report is written, the process group destroyed). Failures raise above instead,
    # so torch.multiprocessing records their traceback for the parent.
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# -- the parent side -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _report_from_dict(d: dict[str, Any], wall: float) -> DistReport:
    def err(e: dict[str, Any] | None) -> TensorError | None:
        return None if e is None else TensorError(e["name"], e["max_abs"], e["max_rel"], e["ok"])

    return DistReport(
        model=d["model"],
        method=d["method"],
        mesh=d["mesh"],
        mesh_shape=tuple(d["mesh_shape"]),
        world_size=int(d["world_size"]),
        train=bool(d["train"]),
        ok=bool(d["ok"]),
        dtype=str(d["dtype"]),
        rtol=float(d["rtol"]),
        atol=float(d["atol"]),
        outputs=tuple(err(e) for e in d["outputs"]),  # type: ignore[misc]
        max_abs_error=float(d["max_abs_error"]),
        max_rel_error=float(d["max_rel_error"]),
        activations_checked=int(d["activations_checked"]),
        worst_activation=err(d["worst_activation"]),
        first_mismatch=d["first_mismatch"],
        grads=tuple(err(e) for e in d["grads"]),  # type: ignore[misc]
        redistributions=dict(d["redistributions"]),
        seconds=float(d["seconds"]),
        wall_seconds=wall,
    )


def _terminate(context: Any) -> None:
    for p in context.processes:
        if p.is_alive():
            p.terminate()
    for p in context.processes:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join(5)


def _per_plan(value: Any, count: int, what: str) -> list[Any]:
    if isinstance(value, (str, bool)) or value is None:
        return [value] * count
    values = list(value)
    if len(values) != count:
        raise BackendError(f"{what} has {len(values)} entries for {count} plans")
    return values


def run_distributed_many(
    plans: Sequence[Plan],
    world_size: int | None = None,
    seed: int = 0,
    train: bool | Sequence[bool] = False,
    timeout: float = DEFAULT_TIMEOUT,
    check_activations: bool = True,
    dtype: str | Sequence[str] = "float32",
    rtol: float | None = None,
    atol: float | None = None,
) -> list[DistReport]:
    """`run_distributed` for several plans in ONE set of processes (start-up is paid once).

    Every plan must have the same DeviceMesh shape (`mesh_shape`: q per round; meshes "4" and
    "2x2" both give (2, 2)). `train` and `dtype` are one value or one per plan; `timeout` covers
    the whole call. See `run_distributed`.
    """
    torch = _require_torch()
    if not plans:
        return []
    from shardplan.exporters.dtensor import mesh_shape

    shapes = {mesh_shape(p) for p in plans}
    if len(shapes) != 1:
        raise BackendError(
            f"run_distributed_many: plans need one DeviceMesh shape (q per round), got "
            f"{sorted(shapes)}; call it once per mesh shape"
        )
    (shape,) = shapes
    devices = plans[0].mesh.size
    if world_size is not None and world_size != devices:
        raise BackendError(
            f"world_size={world_size} but the plan's mesh {plans[0].mesh.text()} has {devices} "
            "devices; the runner starts one process per device (leave world_size unset)"
        )
    flags = [bool(t) for t in _per_plan(train, len(plans), "train")]
    dtypes = [str(d) for d in _per_plan(dtype, len(plans), "dtype")]
    for d in dtypes:
        if d not in TOLERANCES:
            raise BackendError(f"dtype {d!r} is not supported; use one of {sorted(TOLERANCES)}")
    table = kernels()
    for p in plans:
        check_kinds(p.graph, table)
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        raise BackendError("this torch build has no torch.distributed gloo backend")
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

    entries = []
    for p, t, d in zip(plans, flags, dtypes, strict=True):
        default_rtol, default_atol = TOLERANCES[d]
        entries.append(
            {
                "plan": p.to_dict(),
                "train": t,
                "dtype": d,
                "rtol": default_rtol if rtol is None else float(rtol),
                "atol": default_atol if atol is None else float(atol),
                "check_activations": bool(check_activations),
            }
        )
    job = {"plans": entries, "mesh_shape": list(shape), "seed": int(seed), "timeout": timeout}
    workdir = tempfile.mkdtemp(prefix="shardplan-torch-")
    job_path = os.path.join(workdir, "job.json")
    out_path = os.path.join(workdir, "reports.json")
    names = ", ".join(sorted({f"{p.graph.name}/{p.method}" for p in plans}))
    start = time.perf_counter()
    context = None
    try:
        with open(job_path, "w") as f:
            json.dump(job, f)
        context = mp.start_processes(
            _worker,
            args=(devices, _free_port(), job_path, out_path),
            nprocs=devices,
            join=False,
            start_method="spawn",
        )
        deadline = start + timeout
        while not context.join(timeout=max(0.05, min(deadline - time.perf_counter(), 1.0))):
            if time.perf_counter() >= deadline:
                raise BackendError(
                    f"torch.distributed run of {names} on {devices} processes did not finish "
                    f"within {timeout:.0f}s; its processes were terminated (raise timeout=...)"
                )
        with open(out_path) as f:
            raw = json.load(f)
    except ProcessRaisedException as e:
        lines = str(e).strip().splitlines()
        frames = "\n".join(lines[-6:-1])
        raise BackendError(
            f"torch.distributed run of {names} failed on rank {e.error_index}: "
            f"{lines[-1] if lines else e!r}\n{frames}"
        ) from None
    except ProcessExitedException as e:
        raise BackendError(
            f"torch.distributed run of {names}: rank {e.error_index} exited with code "
            f"{e.exit_code} (signal {e.signal_name or '-'})"
        ) from None
    except (OSError, ValueError) as e:
        raise BackendError(f"torch.distributed run of {names}: no report from rank 0 ({e})") from e
    finally:
        if context is not None:
            _terminate(context)
        shutil.rmtree(workdir, ignore_errors=True)
    wall = time.perf_counter() - start
    return [_report_from_dict(d, wall) for d in raw]


def run_distributed(
    plan: Plan,
    world_size: int | None = None,
    seed: int = 0,
    train: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    check_activations: bool = True,
    dtype: str = "float32",
    rtol: float | None = None,
    atol: float | None = None,
) -> DistReport:
    """Run `plan` on `plan.mesh.size` local gloo processes with DTensor; compare on rank 0.

    Args:
        world_size: must equal the plan's device count if given (one process per device).
        seed: values come from `init_values(graph, seed)`, built identically on every rank.
        train: also run backward of `loss_from_outputs` and compare every parameter gradient.
        timeout: seconds for the whole run (process start-up included, ~10-20 s on 2 cores) and
            for each collective; processes still alive then are terminated (BackendError).
        check_activations: compare every activation, not only the graph outputs (one gather
            per activation; `first_mismatch` names the first op whose output differs).
        dtype: "float32" (default) or "float64" (both sides; see the module docstring).
        rtol, atol: the tolerance; default `TOLERANCES[dtype]` (fp32: 1e-4, 1e-5).

    Returns:
        DistReport (`.ok`, errors, redistributions, `.text()`).

    Raises:
        UnsupportedOpError: an op kind has no torch kernel (before any process starts).
        BackendError: a rank failed (the tail of its traceback is in the message), timeout, bad
            world_size or dtype, or no gloo.
    """
    (report,) = run_distributed_many(
        [plan], world_size, seed, train, timeout, check_activations, dtype, rtol, atol
    )
    return report


def verify_torch(
    plan: Plan,
    world_size: int | None = None,
    seed: int = 0,
    train: bool = False,
    timeout: float = DEFAULT_TIMEOUT,
    check_activations: bool = True,
    dtype: str = "float32",
    strict: bool = False,
) -> DistReport:
    """The hook of `shardplan verify PLAN --engine torch`: `run_distributed` + the verdict.

    Print `report.text()` (or `json.dumps(report.to_dict())`) and exit non-zero unless
    `report.ok`. With `strict=True` a mismatch raises BackendError carrying the report's text.
    """
    report = run_distributed(
        plan, world_size, seed, train, timeout, check_activations, dtype, None, None
    )
    if strict and not report.ok:
        raise BackendError(report.text())
    return report


__all__ = [
    "ATOL",
    "DEFAULT_TIMEOUT",
    "RTOL",
    "TOLERANCES",
    "DistReport",
    "TensorError",
    "check_kinds",
    "einsum_letters",
    "execute",
    "forward",
    "index_bound",
    "init_values",
    "kernels",
    "loss_from_outputs",
    "run_distributed",
    "run_distributed_many",
    "verify_torch",
]
