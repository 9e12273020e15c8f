"""Shared machinery of the framework importers: translation tables, the graph emitter, the result.

Every importer walks a framework graph once and turns each framework op into catalogue ops through
one `TranslationTable` keyed by the framework's canonical op identity (`str(OpOverload)` for
torch.export, `(domain, op_type)` for ONNX). It emits through an `Emitter`, which derives each op's
signature from the catalogue, checks the result shape against the framework's own shape, and keeps
the two lists a user needs to trust the import: ops replicated as opaque (never cut) and framework
ops whose catalogue form is an approximation (right shapes and dim kinds, not the exact function).

Forms used for what the catalogue does not name (all `einsum` rows, FLOPs = result size):
- gather-like (slice, select, split, index, gather, topk): `a0 c a2, i0 i1 -> a0 i0 i1 a2`. The
  indexed axis `c` is REDUCE(sum): a device holding part of `c` looks up the indices it owns and
  writes zeros elsewhere, and the partial results add up (the catalogue's embedding rule). For
  selections that need the whole axis (topk) `c` is FROZEN. The index operand is a real tensor
  (index, gather) or a small int64 constant (slice: the selected positions).
- broadcast (expand): `a0 u1 a2, n1 -> a0 n1 a2` with a CONSTANT ones tensor `n1`; the size-1 dim
  `u1` is a REDUCE of extent 1. This one is exact: the einsum computes the broadcast.
- opaque (unknown ops with `unknown="replicate"`): every loop dim FROZEN, one per result dim and
  one per operand dim, so the op can never be cut and its neighbours pay any redistribution;
  its FLOPs are one per result element (a guess: the importer cannot know the kernel).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

from shardplan import units
from shardplan.errors import IRError, ShapeError, ShardplanError, UnsupportedOpError
from shardplan.ir.catalogue import op_form
from shardplan.ir.dims import DimKind, LoopDim
from shardplan.ir.graph import Graph, GraphBuilder
from shardplan.ir.op import Op, Role, Tensor
from shardplan.ir.signature import Signature
from shardplan.ir.traits import OPAQUE_KIND

K = TypeVar("K")
V = TypeVar("V")
Shape = tuple[int, ...]
UnknownPolicy = Literal["error", "replicate"]


@dataclass(slots=True)
class Lazy:
    """A value not yet in the graph: a folded constant, or a pending 2-D transpose (`transpose_of`
    names the untransposed tensor, so a matmul can read it as a linear weight)."""

    make: Callable[[], str]
    transpose_of: str | None = None


class ReplicatedOpsWarning(UserWarning):
    """An import replaced framework ops it cannot translate by opaque, never-cut operators."""


class TranslationTable(Generic[K, V]):
    """A named registry of translation rules: duplicate keys and failed lookups are errors."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._entries: dict[K, V] = {}

    def register(self, *keys: K) -> Callable[[V], V]:
        def add(value: V) -> V:
            for key in keys:
                if key in self._entries:
                    raise IRError(f"{self.name}: {key!r} is registered twice")
                self._entries[key] = value
            return value

        return add

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def keys(self) -> tuple[K, ...]:
        return tuple(self._entries)

    def get(self, key: K) -> V | None:
        return self._entries.get(key)

    def rule(self, key: K, similar: Callable[[], Sequence[object]]) -> V:
        """The entry of `key`; UnsupportedOpError naming the table, the key and the keys
        `similar()` suggests (called only on a miss) when there is none."""
        value = self._entries.get(key)
        if value is None:
            close = similar()
            raise UnsupportedOpError(
                f"{self.name}: no rule for {key!r}" + (f"; similar: {close}" if close else "")
            )
        return value


@dataclass(frozen=True, slots=True)
class ReplicatedOp:
    """A framework op imported as an opaque, replicated operator."""

    op: str
    source: str
    module: str = ""
    results: tuple[str, ...] = ()  # its result tensors, each replicated on every device

    def __str__(self) -> str:
        where = f" in {self.module!r}" if self.module else ""
        several = f": {len(self.results)} results {', '.join(self.results)}"
        return f"{self.op} ({self.source}{where}){several if len(self.results) > 1 else ''}"


@dataclass(frozen=True, slots=True)
class ImportResult:
    """An imported graph plus what the import could not translate exactly.

    Attributes:
        graph: the verified graph.
        replicated: framework ops imported as opaque operators (never cut), in graph order.
        approximated: framework op -> how many of its nodes map to a catalogue form that keeps
            shapes and dim kinds but not the exact function (see each importer's table).
        notes: what the import dropped or assumed, one line each (zero-size values dropped,
            grouped experts read with a capacity).
    """

    graph: Graph
    replicated: tuple[ReplicatedOp, ...] = ()
    approximated: Mapping[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def report(self) -> str:
        g = self.graph
        lines = [
            f"{g.name}: {len(g.ops)} ops, {units.params(g.num_params)} parameters, "
            f"{units.flops(g.flops)}"
        ]
        if self.replicated:
            lines.append(f"replicated (opaque, never cut): {len(self.replicated)}")
            lines += [f"  {r}" for r in self.replicated]
        if self.approximated:
            lines.append("approximated (shapes exact, function approximate):")
            lines += [f"  {k}: {n}" for k, n in sorted(self.approximated.items())]
        if self.notes:
            lines.append("notes:")
            lines += [f"  {n}" for n in self.notes]
        return "\n".join(lines)


def warn_replicated(
    result: ImportResult | Sequence[Any],
    importer: str,
    what: str = "op(s)",
    hint: str = "; call the import_* function for the full report",
    stacklevel: int = 3,
) -> None:
    """ReplicatedOpsWarning naming the first ten opaque ops of `result` (or of a list), if any."""
    replicated = result.replicated if isinstance(result, ImportResult) else result
    if replicated:
        import warnings

        names = ", ".join(str(r) for r in replicated[:10])
        more = "" if len(replicated) <= 10 else f" and {len(replicated) - 10} more"
        warnings.warn(
            f"{importer}: {len(replicated)} {what} imported as opaque replicated operators "
            f"(never cut): {names}{more}{hint}",
            ReplicatedOpsWarning,
            stacklevel=stacklevel,  # 3: the caller of from_torch / from_onnx
        )


def check_policy(unknown: str) -> UnknownPolicy:
    if unknown not in ("error", "replicate"):
        raise ShardplanError(
            f"unknown={unknown!r} is not an unknown-op policy; use 'error' "
            "(raise UnsupportedOpError) or 'replicate' (opaque, never-cut op)"
        )
    return unknown  # type: ignore[return-value]


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def opaque_signature(in_shapes: Sequence[Shape], out_shapes: Sequence[Shape]) -> Signature:
    """All loop dims FROZEN: one per result dim, one per operand dim (never cut)."""
    dims: list[LoopDim] = []
    groups: list[tuple[tuple[str, ...], ...]] = []
    for prefix, shapes in (("o", out_shapes), ("i", in_shapes)):
        for t, shape in enumerate(shapes):
            names = [f"{prefix}{t}_{j}" for j in range(len(shape))]
            dims += [
                LoopDim(n, max(int(e), 1), DimKind.FROZEN)
                for n, e in zip(names, shape, strict=True)
            ]
            groups.append(tuple((n,) for n in names))
    n_out = len(out_shapes)
    return Signature(tuple(dims), tuple(groups[n_out:]), tuple(groups[:n_out]))


class Emitter:
    """Adds tensors and catalogue ops to a `GraphBuilder`, checking each result shape."""

    def __init__(self, name: str, policy: UnknownPolicy) -> None:
        self.builder = GraphBuilder(name)
        self._cse: dict[tuple[Any, ...], str] = {}
        self.policy = policy
        self._roles: dict[str, Role] = {}
        self.replicated: list[ReplicatedOp] = []
        self.approximated: Counter[str] = Counter()
        self.notes: list[str] = []

    # -- tensors ------------------------------------------------------------------------------
    def shape(self, tensor: str) -> Shape:
        return self.builder.shape(tensor)

    def has(self, tensor: str) -> bool:
        return tensor in self._roles

    def role(self, tensor: str) -> Role:
        return self._roles[tensor]

    def tensor(self, name: str, shape: Sequence[int], dtype_bytes: int, role: Role) -> str:
        """Add a graph input, parameter or constant (idempotent for constants)."""
        if role is Role.CONSTANT and self.has(name):
            return name
        return self._add(Tensor(name, _shape(shape, name), dtype_bytes, role))

    def _add(self, tensor: Tensor) -> str:
        self._roles[tensor.name] = tensor.role
        return self.builder.add_tensor(tensor)

    # -- ops ----------------------------------------------------------------------------------
    def op(
        self,
        kind: str,
        inputs: Sequence[str],
        *,
        name: str,
        layer: str = "",
        dtype_bytes: int = 4,
        expect: Sequence[int] | None = None,
        flops: float | None = None,
        approx: str | None = None,
        **attrs: Any,
    ) -> str:
        """Add one catalogue op; its result tensor is named `name`.

        Args:
            expect: the framework's result shape; a mismatch is a translation bug (ShapeError).
            flops: overrides the catalogue's count (gather/broadcast forms cost one copy).
            approx: the framework op this form approximates (counted in the import report).
        """
        # common subexpressions (e.g. one view of a tensor taken once per q/k/v projection) are
        # emitted once, so consumers share the tensor — and its gradient all-reduce
        key = (kind, tuple(inputs), repr(sorted(attrs.items())), dtype_bytes, flops)
        if key in self._cse:
            return self._cse[key]
        shapes = [self.shape(t) for t in inputs]
        try:
            form = op_form(kind, shapes, attrs)
        except IRError as e:
            raise type(e)(f"op {name!r} ({kind} of {shapes}): {e}") from e
        (out_shape,) = form.output_shapes
        if expect is not None and tuple(out_shape) != tuple(int(s) for s in expect):
            raise ShapeError(
                f"op {name!r} ({kind}): the catalogue gives shape {out_shape} but the "
                f"framework says {tuple(expect)}; the translation rule is wrong"
            )
        self._add(Tensor(name, out_shape, dtype_bytes, Role.ACTIVATION))
        self.builder.add_op(
            Op(
                name,
                kind,
                form.signature,
                tuple(inputs),
                (name,),
                form.flops if flops is None else float(flops),
                tuple(attrs.items()),
                layer,
            )
        )
        if approx:
            self.approximated[approx] += 1
        self._cse[key] = name
        return name

    def opaque(
        self,
        inputs: Sequence[str],
        out_shapes: Sequence[Sequence[int]],
        out_dtype_bytes: Sequence[int],
        *,
        name: str,
        source: str,
        layer: str = "",
        module: str = "",
    ) -> list[str]:
        """Add an opaque op (all loop dims FROZEN) and record it as replicated."""
        outs = [name] if len(out_shapes) == 1 else [f"{name}:{i}" for i in range(len(out_shapes))]
        shapes = [_shape(s, name) for s in out_shapes]
        for out, shape, nbytes in zip(outs, shapes, out_dtype_bytes, strict=True):
            self._add(Tensor(out, shape, nbytes, Role.ACTIVATION))
        signature = opaque_signature([self.shape(t) for t in inputs], shapes)
        self.builder.add_op(
            Op(
                name,
                OPAQUE_KIND,
                signature,
                tuple(inputs),
                tuple(outs),
                float(sum(_numel(s) for s in shapes)),
                (("source", source),),
                layer,
            )
        )
        self.replicated.append(ReplicatedOp(name, source, module or layer, tuple(outs)))
        return outs

    # -- einsum forms ---------------------------------------------------------------------------
    def gather(
        self,
        x: str,
        index: Sequence[str],
        axis: int,
        *,
        name: str,
        layer: str = "",
        dtype_bytes: int = 4,
        expect: Sequence[int] | None = None,
        frozen: bool = False,
        approx: str | None = None,
        **attrs: Any,
    ) -> str:
        """`x[..., index, ...]` along `axis` with one or more (broadcast) index tensors.

        The index tensors' dims (right-aligned) replace `x`'s dim `axis`; several index tensors
        index consecutive axes from `axis` on (torch advanced indexing with adjacent indices).
        """
        shape = self.shape(x)
        idx_shapes = [self.shape(t) for t in index]
        rank = max((len(s) for s in idx_shapes), default=0)
        out_idx = [1] * rank
        for s in idx_shapes:
            for j, size in enumerate(s):
                k = rank - len(s) + j
                out_idx[k] = max(out_idx[k], size)
        x_names = [f"a{j}" for j in range(len(shape))]
        indexed = list(range(axis, axis + len(index)))
        for j in indexed:
            x_names[j] = f"c{j}"
        idx_names = [f"i{k}" for k in range(rank)]
        operands = [" ".join(x_names)]
        for t, s in enumerate(idx_shapes):
            names = []
            for j, size in enumerate(s):
                k = rank - len(s) + j
                names.append(idx_names[k] if size == out_idx[k] else f"u{t}_{k}")
            operands.append(" ".join(names))
        out_names = x_names[:axis] + idx_names + x_names[axis + len(index) :]
        spec = f"{', '.join(operands)} -> {' '.join(out_names)}"
        frozen_dims = tuple(x_names[j] for j in indexed) if frozen else ()
        out_numel = _numel(shape[:axis]) * _numel(out_idx) * _numel(shape[axis + len(index) :])
        return self.op(
            "einsum",
            [x, *index],
            name=name,
            layer=layer,
            dtype_bytes=dtype_bytes,
            expect=expect,
            flops=out_numel,
            approx=approx,
            spec=spec,
            frozen=frozen_dims,
            **attrs,
        )

    def gather_elements(
        self,
        x: str,
        index: str,
        axis: int,
        *,
        name: str,
        layer: str = "",
        dtype_bytes: int = 4,
        expect: Sequence[int] | None = None,
        approx: str | None = None,
        **attrs: Any,
    ) -> str:
        """`out[.., j, ..] = x[.., index[.., j, ..], ..]` along `axis` (torch.gather)."""
        xs, ids = self.shape(x), self.shape(index)
        if len(xs) != len(ids):
            raise ShapeError(f"op {name!r}: gather needs equal ranks, got {xs} and {ids}")
        x_names, i_names = [], []
        for j, (a, b) in enumerate(zip(xs, ids, strict=True)):
            if j != axis and a == b:
                x_names.append(f"a{j}")
                i_names.append(f"a{j}")
            else:  # the gathered axis, or a dim the index covers only partly
                x_names.append(f"c{j}")
                i_names.append(f"i{j}")
        spec = f"{' '.join(x_names)}, {' '.join(i_names)} -> {' '.join(i_names)}"
        return self.op(
            "einsum",
            [x, index],
            name=name,
            layer=layer,
            dtype_bytes=dtype_bytes,
            expect=ids if expect is None else expect,
            flops=_numel(ids),
            approx=approx,
            spec=spec,
            **attrs,
        )

    def broadcast(
        self,
        x: str,
        shape: Sequence[int],
        *,
        name: str,
        layer: str = "",
        dtype_bytes: int = 4,
        expect: Sequence[int] | None = None,
        **attrs: Any,
    ) -> str:
        """Exact broadcast of `x` to `shape` as an einsum with a CONSTANT ones tensor."""
        src = self.shape(x)
        shape = tuple(shape)
        lead = len(shape) - len(src)
        if lead < 0:
            raise ShapeError(f"op {name!r}: cannot broadcast {src} to {tuple(shape)}")
        x_names, ones_names, ones_shape, out_names = [], [], [], []
        for j, size in enumerate(shape):
            if j < lead:
                out_names.append(f"n{j}")
                ones_names.append(f"n{j}")
                ones_shape.append(size)
                continue
            s = src[j - lead]
            if s == size:
                x_names.append(f"a{j}")
                out_names.append(f"a{j}")
            elif s == 1:
                x_names.append(f"u{j}")
                out_names.append(f"n{j}")
                ones_names.append(f"n{j}")
                ones_shape.append(size)
            else:
                raise ShapeError(f"op {name!r}: cannot broadcast {src} to {tuple(shape)}")
        ones = self.tensor(f"{name}/ones", ones_shape, dtype_bytes, Role.CONSTANT)
        spec = f"{' '.join(x_names)}, {' '.join(ones_names)} -> {' '.join(out_names)}"
        return self.op(
            "einsum",
            [x, ones],
            name=name,
            layer=layer,
            dtype_bytes=dtype_bytes,
            expect=shape if expect is None else expect,
            flops=_numel(shape),
            spec=spec,
            **attrs,
        )

    def build(self) -> ImportResult:
        graph = self.builder.build()
        return ImportResult(
            graph, tuple(self.replicated), dict(self.approximated), tuple(self.notes)
        )


def conv(
    ctx: Any,
    node: Any,
    x: Any,
    w: Any,
    bias: Any,
    stride: tuple[int, int],
    padding: tuple[int, int],
    groups: int,
) -> str:
    """A 2-D convolution of both importers: conv2d (+ bias_add on axis 1); a 1-D one (3-D `x`)
    as a conv2d over a height-1 image (exact: reshape in, conv2d, bias, reshape out; its stride
    and padding are the last of the pairs). `ctx` is the importer's context (`emit`, `shape`,
    `emitter`);
    groups > 1 is a grouped (depthwise when groups == channels) convolution."""
    grouped = {"groups": groups} if groups != 1 else {}
    if len(ctx.shape(x)) == 4:
        part = "conv" if bias is not None else ""
        y = ctx.emit("conv2d", [x, w], node, part=part, stride=stride, padding=padding, **grouped)
        return y if bias is None else ctx.emit("bias_add", [y, bias], node, axis=1)
    (n, c, length), (o, cg, k) = ctx.shape(x), ctx.shape(w)
    x2 = ctx.emit("reshape", [x], node, part="x2d", shape=(n, c, 1, length))
    w2 = ctx.emit("reshape", [w], node, part="w2d", shape=(o, cg, 1, k))
    y = ctx.emit(
        "conv2d",
        [x2, w2],
        node,
        part="conv",
        stride=(1, stride[1]),
        padding=(0, padding[1]),
        **grouped,
    )
    if bias is not None:
        y = ctx.emit("bias_add", [y, bias], node, part="bias", axis=1)
    n, o, _, length = ctx.emitter.shape(y)
    return ctx.emit("reshape", [y], node, shape=(n, o, length))


def _shape(shape: Sequence[Any], name: str) -> Shape:
    out = []
    for s in shape:
        if not isinstance(s, int):
            try:
                s = int(s)
            except (TypeError, ValueError, RuntimeError) as e:  # symbolic: needs static shapes
                raise ShapeError(
                    f"tensor {name!r} has a symbolic size {s!r}; import with "
                    "static example inputs (no dynamic shapes)"
                ) from e
        out.append(s)
    if any(s < 1 for s in out):
        raise ShapeError(
            f"tensor {name!r} has shape {tuple(out)}; zero-size tensors cannot be planned"
        )
    return tuple(out)
