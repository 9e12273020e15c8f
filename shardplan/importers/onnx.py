"""ONNX importer: a ModelProto (or a .onnx path) with static shapes -> `Graph`.

Shapes come from `onnx.shape_inference.infer_shapes(model, data_prop=True)`; every value must
have static dims (export with fixed input shapes, or fix them with
`onnx.tools.update_model_dims`). Floating initializers with more than one element become
PARAMETERs, the other initializers (shape vectors, indices, scalars) CONSTANTs; graph inputs
become INPUTs. Nodes are visited in the file's (topological) order and translated by the one
table `onnx_table()`, keyed by `(domain, op_type)` (the default domain is ""). Rules read the
model's opset where an op's signature changed (Softmax's axis, Reduce* axes as an input).

As in the torch importer, a node whose inputs are all static (initializer constants, `Shape` of a
tensor, `Constant`) is folded: it becomes a CONSTANT tensor where a translated op reads it, and
its value is computed with numpy when the rules need it (reshape targets, slice bounds, axes).
`Op.layer` is the node name's scope: `/bert/encoder/layer.0/attention/self/MatMul` ->
`bert.encoder.layer.0.attention.self`. Unsupported ops raise UnsupportedOpError, or with
`unknown="replicate"` become opaque ops listed in `ImportResult.replicated`. One pass: linear in
the number of nodes and edges.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from shardplan.errors import (
    ArgumentError,
    IRError,
    ShapeError,
    UnsupportedOpError,
)
from shardplan.importers._build import (
    Emitter,
    ImportResult,
    Lazy,
    TranslationTable,
    UnknownPolicy,
    check_policy,
    warn_replicated,
)
from shardplan.importers._onnx_ops import Key, Rule, onnx_table
from shardplan.ir.graph import Graph
from shardplan.ir.op import Role
from shardplan.lazy import require

# Ops whose results depend only on shapes or attributes: always static.
_CREATION = frozenset(
    {
        "Constant",
        "Shape",
        "Size",
        "ConstantOfShape",
        "Range",
        "EyeLike",
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
    }
)


def _onnx() -> Any:
    return require("onnx", extra="onnx", user="importing ONNX models")


def import_onnx(
    path_or_model: Any, *, unknown: UnknownPolicy = "error", name: str | None = None
) -> ImportResult:
    """Translate an ONNX model into a verified `Graph`.

    Args:
        path_or_model: a `.onnx` path or an `onnx.ModelProto`.
        unknown: "error" raises UnsupportedOpError on an op without a rule; "replicate" imports
            it as an opaque op (all loop dims FROZEN) and lists it in the result.
        name: the graph's name (default: the graph name in the file, or the file's stem).

    Returns:
        ImportResult: the graph, the replicated ops, the approximated ONNX ops.

    Raises:
        UnsupportedOpError: an op has no rule (with unknown="error"), naming the op and node.
        ShapeError: a value has a symbolic or unknown shape after shape inference.
        MissingDependencyError: onnx is not installed.
    """
    onnx = _onnx()
    policy = check_policy(unknown)
    if isinstance(path_or_model, (str, Path)):
        path = Path(path_or_model)
        if not path.is_file():
            raise ArgumentError(f"ONNX file {str(path)!r} does not exist (or is not a file)")
        try:
            model = onnx.load(str(path))
        except Exception as e:  # protobuf's DecodeError and friends: the file is not ONNX
            raise IRError(
                f"ONNX file {str(path)!r} is not a valid ONNX model ({type(e).__name__}: {e}); "
                "export it again with torch.onnx.export or onnx.save"
            ) from e
        default = path.stem
    else:
        model = path_or_model
        default = model.graph.name or "onnx_model"
    try:
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception as e:  # onnx's InferenceError / ValidationError: a malformed model
        raise IRError(f"ONNX shape inference failed ({type(e).__name__}: {e})") from e
    ctx = _Context(model, Emitter(name or default, policy), onnx_table())
    ctx.run()
    return ctx.emitter.build()


def from_onnx(
    path_or_model: Any, *, unknown: UnknownPolicy = "error", name: str | None = None
) -> Graph:
    """`import_onnx(...).graph`, warning (ReplicatedOpsWarning) if ops were replicated."""
    result = import_onnx(path_or_model, unknown=unknown, name=name)
    warn_replicated(result, "from_onnx")
    return result.graph


# -- the walk ------------------------------------------------------------------------------------
class _Context:
    """State of one import: ONNX value name -> graph value, known constant values, shapes."""

    def __init__(self, model: Any, emitter: Emitter, table: TranslationTable[Key, Rule]) -> None:
        self.onnx = _onnx()
        self.model, self.emitter, self.table = model, emitter, table
        self.opset = {(imp.domain or ""): imp.version for imp in model.opset_import}
        self.opset[""] = self.opset.get("ai.onnx", self.opset.get("", 1))
        self.types: dict[str, tuple[tuple[int, ...] | None, int]] = {}
        self.env: dict[str, Any] = {}
        self.values: dict[str, np.ndarray] = {}
        self.static: set[str] = set()

    def run(self) -> None:
        graph = self.model.graph
        for info in [*graph.value_info, *graph.input, *graph.output]:
            tensor_type = info.type.tensor_type
            dims = None
            if tensor_type.HasField("shape"):
                dims = tuple(
                    d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim
                )
            self.types[info.name] = (dims, tensor_type.elem_type)
        initialized = self._initializers()
        for info in graph.input:
            if info.name not in initialized:
                self.env[info.name] = self.emitter.tensor(
                    info.name, self.shape(info.name), self.dtype_bytes(info.name), Role.INPUT
                )
        for node in graph.node:
            self._node(node)

    def _initializers(self) -> set[str]:
        from onnx import numpy_helper

        graph, names = self.model.graph, set()
        for init in graph.initializer:
            names.add(init.name)
            shape = tuple(int(d) for d in init.dims)
            self.types[init.name] = (shape, init.data_type)
            numel = int(np.prod(shape)) if shape else 1
            floating = np.issubdtype(self._np_dtype(init.data_type), np.floating)
            if floating and numel > 1:
                self.env[init.name] = self.emitter.tensor(
                    init.name, shape, self.dtype_bytes(init.name), Role.PARAMETER
                )
                continue
            self.static.add(init.name)
            self.values[init.name] = numpy_helper.to_array(init)
            self.env[init.name] = self._constant(init.name)
        return names

    def _np_dtype(self, elem_type: int) -> Any:
        try:
            return self.onnx.helper.tensor_dtype_to_np_dtype(elem_type)
        except (KeyError, ValueError, TypeError):
            return np.dtype(np.float32)

    def _constant(self, name: str) -> Lazy:
        return Lazy(
            lambda: self.emitter.tensor(
                name, self.shape(name), self.dtype_bytes(name), Role.CONSTANT
            )
        )

    def _node(self, node: Any) -> None:
        domain = "" if node.domain in ("", "ai.onnx") else node.domain
        key = (domain, node.op_type)
        inputs = [i for i in node.input if i]
        if any(self.known_shape(o) is None for o in node.output if o):
            self._refine(node, domain)
        if node.op_type in _CREATION or all(i in self.static for i in inputs):
            folded = _fold(self, node)
            for i, out in enumerate(node.output):
                if not out:
                    continue
                self.static.add(out)
                if folded is not None and folded[i] is not None:
                    self.values[out] = folded[i]
                    dims = self.types.get(out, (None, 0))[0]
                    if dims is None or any(d < 1 for d in dims):  # trust the computed value
                        self.types[out] = (
                            tuple(folded[i].shape),
                            self.types.get(out, (None, self.onnx.TensorProto.FLOAT))[1],
                        )
                self.env[out] = self._constant(out)
            return
        try:
            rule = self.table.rule(
                key,
                lambda: difflib.get_close_matches(node.op_type, [t for _, t in self.table.keys()]),
            )
            results = rule(self, node)
        except UnsupportedOpError as e:
            if self.emitter.policy == "error":
                raise UnsupportedOpError(
                    f"ONNX op {node.op_type!r} (domain {domain or 'ai.onnx'!r}, node "
                    f"{node.name or node.output[0]!r}) cannot be imported: {e}. Add a row to "
                    "onnx_table() in shardplan/importers/onnx.py, or pass unknown='replicate' "
                    "to import it as an opaque op that is never cut"
                ) from e
            results = self._opaque(node)
        for out, value in zip(node.output, results, strict=False):
            if out:
                self.env[out] = value
                if isinstance(value, str) and self.known_shape(out) is None:
                    self.types[out] = (self.emitter.shape(value), self.types.get(out, (None, 1))[1])

    def _refine(self, node: Any, domain: str) -> None:
        """Re-run ONNX shape inference on one node from the (complete) shapes and constant
        values known here: global inference leaves dims unknown behind data-dependent shapes."""
        from onnx import numpy_helper

        helper = self.onnx.helper
        types, data = {}, {}
        for name in node.input:
            if not name:
                continue
            shape = self.known_shape(name)
            if shape is None:
                return
            types[name] = helper.make_tensor_type_proto(self.types[name][1], shape)
            if name in self.values:
                data[name] = numpy_helper.from_array(np.asarray(self.values[name]), name)
        try:
            schema = self.onnx.defs.get_schema(node.op_type, self.opset.get(domain, 1), domain)
            inferred = self.onnx.shape_inference.infer_node_outputs(
                schema, node, types, data, opset_imports=list(self.model.opset_import)
            )
        except (
            self.onnx.defs.SchemaError,
            self.onnx.shape_inference.InferenceError,
            RuntimeError,
            ValueError,
        ):  # no schema or no inference: shapes stay unknown
            return
        for name, type_proto in inferred.items():
            tensor_type = type_proto.tensor_type
            dims = tuple(
                d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim
            )
            if all(d >= 1 for d in dims):
                self.types[name] = (dims, tensor_type.elem_type)

    def _opaque(self, node: Any) -> list[Any]:
        inputs: list[str] = []
        for name in node.input:
            if name and name in self.env and self.tensor(name) not in inputs:
                inputs.append(self.tensor(name))
        outs = [o for o in node.output if o]
        names = self.emitter.opaque(
            inputs,
            [self.shape(o) for o in outs],
            [self.dtype_bytes(o) for o in outs],
            name=node.name or outs[0],
            source=node.op_type,
            layer=self.layer(node),
        )
        mapping = dict(zip(outs, names, strict=True))
        return [mapping.get(o) for o in node.output]

    # -- helpers for rules ------------------------------------------------------------------------
    def layer(self, node: Any) -> str:
        parts = [p for p in (node.name or "").split("/") if p]
        return ".".join(parts[:-1])

    def known_shape(self, name: str) -> tuple[int, ...] | None:
        dims = self.types.get(name, (None, 0))[0]
        return None if dims is None or any(d < 1 for d in dims) else dims

    def shape(self, name: str) -> tuple[int, ...]:
        dims, _ = self.types.get(name, (None, 0))
        if dims is None or any(d < 1 for d in dims):
            raise ShapeError(
                f"ONNX value {name!r} has no static shape after shape inference "
                f"(dims {dims}); export with fixed input shapes or fix them with "
                "onnx.tools.update_model_dims"
            )
        return dims

    def rank(self, name: str) -> int:
        return len(self.shape(name))

    def dtype_bytes(self, name: str) -> int:
        return int(self._np_dtype(self.types.get(name, (None, 1))[1]).itemsize)

    def value(self, name: str) -> np.ndarray | None:
        return self.values.get(name) if name else None

    def scalar(self, name: str) -> float | None:
        """The value of a one-element constant operand, else None."""
        v = self.value(name)
        return float(v.reshape(-1)[0]) if v is not None and v.size == 1 else None

    def tensor(self, name: str) -> str:
        """The graph tensor of an ONNX value (or an intermediate graph tensor a rule made)."""
        if name not in self.env and self.emitter.has(name):
            return name
        value = self.env.get(name)
        if isinstance(value, Lazy):
            value = value.make()
            self.env[name] = value
        if not isinstance(value, str):
            raise UnsupportedOpError(f"ONNX value {name!r} is not a tensor the importer knows")
        return value

    def role(self, name: str) -> Role | None:
        value = self.env.get(name)
        if isinstance(value, str):
            return self.emitter.role(value)
        return Role.CONSTANT if name in self.static else None

    def attr(self, node: Any, name: str, default: Any = None) -> Any:
        for a in node.attribute:
            if a.name == name:
                value = self.onnx.helper.get_attribute_value(a)
                return value.decode() if isinstance(value, bytes) else value
        return default

    def target(self, node: Any, out: int, part: str) -> dict[str, Any]:
        result = node.output[out]
        return {
            "name": f"{result}/{part}" if part else result,
            "layer": self.layer(node),
            "expect": None if part else self.known_shape(result),
            "dtype_bytes": self.dtype_bytes(result),
        }

    def emit(
        self,
        kind: str,
        inputs: Sequence[str],
        node: Any,
        *,
        out: int = 0,
        part: str = "",
        approx: bool = False,
        **attrs: Any,
    ) -> str:
        """Emit one catalogue op for result `out` of `node` (or an intermediate `part`)."""
        return self.emitter.op(
            kind,
            [self.tensor(t) for t in inputs],
            **self.target(node, out, part),
            approx=node.op_type if approx else None,
            source=node.op_type,
            **attrs,
        )

    def gather(
        self,
        node: Any,
        x: str,
        index: Sequence[str],
        axis: int,
        *,
        out: int = 0,
        part: str = "",
        frozen: bool = False,
        **attrs: Any,
    ) -> str:
        return self.emitter.gather(
            self.tensor(x),
            [self.tensor(t) for t in index],
            axis,
            **self.target(node, out, part),
            frozen=frozen,
            approx=node.op_type,
            source=node.op_type,
            **attrs,
        )

    def index_constant(self, node: Any, shape: tuple[int, ...], part: str) -> str:
        return self.emitter.tensor(f"{node.output[0]}/{part}", shape, 8, Role.CONSTANT)


def _axis(axis: int, rank: int) -> int:
    return int(axis) % rank if rank else 0


# -- folding of static values (numpy) --------------------------------------------------------------
def _fold(ctx: _Context, node: Any) -> list[np.ndarray | None] | None:
    """Values of a static node's results when numpy can compute them cheaply, else None."""
    op = node.op_type
    if op == "Constant":
        from onnx import numpy_helper

        for a in node.attribute:
            value = ctx.onnx.helper.get_attribute_value(a)
            if a.name == "value":
                return [numpy_helper.to_array(value)]
            if a.name in ("value_float", "value_int"):
                return [np.array(value)]
            if a.name in ("value_floats", "value_ints"):
                return [np.array(list(value))]
        return None
    if op in ("Shape", "Size"):
        shape = np.array(ctx.shape(node.input[0]), dtype=np.int64)
        if op == "Size":
            return [np.array(int(np.prod(shape)), dtype=np.int64)]
        return [shape[ctx.attr(node, "start", 0) : ctx.attr(node, "end", len(shape))]]
    ins = [ctx.value(i) if i else None for i in node.input]
    present = [v for v, i in zip(ins, node.input, strict=True) if i]
    if any(v is None for v in present):
        return None
    try:
        return _fold_numpy(ctx, node, op, ins)
    except (ValueError, IndexError, TypeError):  # an unusual case: keep the shape, not the value
        return None


_FOLD_UNARY = MappingProxyType(
    {
        "Neg": np.negative,
        "Abs": np.abs,
        "Sqrt": np.sqrt,
        "Exp": np.exp,
        "Log": np.log,
        "Not": np.logical_not,
        "Floor": np.floor,
        "Ceil": np.ceil,
    }
)
"""ONNX unary ops folded on constant values (`_fold_numpy`): one numpy function each."""
_FOLD_BINARY = MappingProxyType(
    {
        "Add": np.add,
        "Sub": np.subtract,
        "Mul": np.multiply,
        "Equal": np.equal,
        "Less": np.less,
        "Greater": np.greater,
        "LessOrEqual": np.less_equal,
        "GreaterOrEqual": np.greater_equal,
        "Max": np.maximum,
        "Min": np.minimum,
        "And": np.logical_and,
        "Or": np.logical_or,
        "Pow": np.power,
    }
)
"""ONNX binary ops folded on constant values, as `_FOLD_UNARY`."""


def _fold_numpy(ctx: _Context, node: Any, op: str, ins: list[Any]) -> list[Any] | None:
    if op in ("Identity", "Cast", "CastLike"):
        if op == "Identity":
            return [ins[0]]
        target = ctx._np_dtype(ctx.attr(node, "to")) if op == "Cast" else ins[1].dtype
        return [ins[0].astype(target)]
    if op == "Expand":
        shape = np.broadcast_shapes(ins[0].shape, tuple(int(d) for d in ins[1]))
        return [np.broadcast_to(ins[0], shape).copy()]
    if op == "Reshape":
        target = [int(d) for d in ins[1]]
        if not ctx.attr(node, "allowzero", 0):
            target = [ins[0].shape[i] if d == 0 else d for i, d in enumerate(target)]
        return [ins[0].reshape(target)]
    if op == "Flatten":
        axis = _axis(ctx.attr(node, "axis", 1), ins[0].ndim + 1)
        return [ins[0].reshape(int(np.prod(ins[0].shape[:axis])), -1)]
    if op in ("Unsqueeze", "Squeeze"):
        axes = ctx.attr(node, "axes")
        if axes is None and len(ins) > 1 and ins[1] is not None:
            axes = [int(a) for a in ins[1].reshape(-1)]
        if op == "Squeeze":
            return [np.squeeze(ins[0], axis=None if axes is None else tuple(axes))]
        rank = ins[0].ndim + len(axes)
        return [np.expand_dims(ins[0], tuple(sorted(_axis(a, rank) for a in axes)))]
    if op == "Gather":
        return [np.take(ins[0], ins[1], axis=ctx.attr(node, "axis", 0))]
    if op == "GatherElements":
        return [np.take_along_axis(ins[0], ins[1], axis=ctx.attr(node, "axis", 0))]
    if op in _FOLD_UNARY:
        return [_FOLD_UNARY[op](ins[0])]
    if op == "Tile":
        return [np.tile(ins[0], [int(r) for r in ins[1]])]
    if op == "Concat":
        return [np.concatenate([np.atleast_1d(v) for v in ins], axis=ctx.attr(node, "axis", 0))]
    if op == "Transpose":
        return [np.transpose(ins[0], ctx.attr(node, "perm"))]
    if op in _FOLD_BINARY:
        return [_FOLD_BINARY[op](ins[0], ins[1])]
    if op == "Div":
        integer = np.issubdtype(ins[0].dtype, np.integer)
        return [ins[0] // ins[1] if integer else ins[0] / ins[1]]
    if op == "Where":
        return [np.where(ins[0], ins[1], ins[2])]
    if op == "Range":
        return [np.arange(ins[0], ins[1], ins[2])]
    if op == "ConstantOfShape":
        fill = ctx.attr(node, "value")
        from onnx import numpy_helper

        value = numpy_helper.to_array(fill).reshape(-1)[0] if fill is not None else np.float32(0)
        return [np.full(tuple(int(d) for d in ins[0]), value)]
    if op == "Slice":
        data, starts, ends = ins[0], ins[1], ins[2]
        axes = ins[3] if len(ins) > 3 and ins[3] is not None else range(len(starts))
        steps = ins[4] if len(ins) > 4 and ins[4] is not None else [1] * len(starts)
        index = [slice(None)] * data.ndim
        for a, s, e, st in zip(axes, starts, ends, steps, strict=False):
            index[int(a)] = slice(int(s), int(e), int(st))
        return [data[tuple(index)]]
    return None
