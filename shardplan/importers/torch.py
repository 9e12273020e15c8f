"""torch.export importer: an `nn.Module` (or an `ExportedProgram`) in core ATen -> `Graph`.

    ep = torch.export.export(module, args, kwargs).run_decompositions()

Placeholders become graph tensors from `ep.graph_signature`: parameters -> PARAMETER (tied
parameters, which share storage, once), buffers and lifted constants -> CONSTANT, user inputs ->
INPUT; shapes and dtypes come from `node.meta["val"]`. Each `call_function` node is translated by
the one table `aten_table()`, keyed by `str(OpOverload)`, into one or more catalogue ops named
after the FX node (`addmm_3`, `addmm_3/mm`), with `Op.layer` set from `nn_module_stack`.

Two mechanisms keep the graph small and honest without special cases in the rules:
- constant folding: a node whose value does not depend on a user input or a parameter (masks,
  position ids, rotary tables, everything computed from buffers and `arange`) is not translated;
  it becomes a CONSTANT tensor where a translated op reads it;
- views that do not move data (`clone`, `alias`, same-shape `view`/`expand`, same-dtype
  `_to_copy`, eval-mode dropout) alias their input; a 2-D transpose stays pending so that
  `mm(x, t(W))` becomes `linear(x, W)` on the stored [out, in] weight.

An op without a row raises `UnsupportedOpError` naming it and its module, or, with
`unknown="replicate"`, becomes an opaque op that is never cut (see `ImportResult.replicated`).
The whole import is one pass over the nodes: O(|nodes| + |edges|) after export.
"""

from __future__ import annotations

import difflib
import operator
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from shardplan.errors import (
    ShapeError,
    UnsupportedOpError,
)
from shardplan.importers._aten import Rule, aten_table
from shardplan.importers._aten_views import _is_node
from shardplan.importers._build import (
    Emitter,
    ImportResult,
    Lazy,
    TranslationTable,
    UnknownPolicy,
    check_policy,
    warn_replicated,
)
from shardplan.importers._torch_export import (
    _CREATION,
    _SKIP,
    _decompositions,
    _export,
    _live,
    _needs_decomposition,
)
from shardplan.ir.graph import Graph
from shardplan.ir.op import Role
from shardplan.lazy import require

if TYPE_CHECKING:
    from torch.fx import Node


def _torch() -> Any:
    return require("torch", extra="torch", user="importing PyTorch models")


def import_torch(
    module: Any,
    example_args: Sequence[Any] = (),
    example_kwargs: dict[str, Any] | None = None,
    *,
    unknown: UnknownPolicy = "error",
    name: str | None = None,
) -> ImportResult:
    """Export `module` with torch.export, decompose to core ATen and translate it.

    Args:
        module: an `nn.Module`, or an `ExportedProgram` (then the example inputs are unused).
        example_args, example_kwargs: inputs of the forward pass; their shapes are baked in.
        unknown: "error" raises UnsupportedOpError on an ATen op without a rule; "replicate"
            imports it as an opaque op (all loop dims FROZEN) and lists it in the result.
        name: the graph's name (default: the module's class name).

    Returns:
        ImportResult: the verified graph, the replicated ops, the approximated ATen ops.

    Raises:
        UnsupportedOpError: an op has no rule (with unknown="error"); the message names the ATen
            op, the FX node and the module path.
        MissingDependencyError: torch is not installed.
    """
    torch = _torch()
    policy = check_policy(unknown)
    program, default = _export(torch, module, example_args, example_kwargs)
    return _translate(torch, program, name or default, policy)


def _translate(
    torch: Any, program: Any, name: str, policy: UnknownPolicy, decompose: bool | None = None
) -> ImportResult:
    """The ImportResult of `program` (see `_walk`)."""
    return _walk(torch, program, name, policy, decompose)[1].emitter.build()


def _walk(
    torch: Any, program: Any, name: str, policy: UnknownPolicy, decompose: bool | None = None
) -> tuple[Any, _Context]:
    """Translate an exported program: (the program translated, the walk's context). The one
    path of both `import_torch` (planning) and `trace_torch` (running), so a plan made by
    `from_torch` is for the graph `parallelize` runs. The program is decomposed to core ATen
    first only when some op needs it (`decompose=None`): the decomposition re-traces the whole
    program and takes most of an import's time, while export's own IR is usually covered by the
    table already. The direct try is strict: any op it cannot translate (a rule refusing a
    shape) sends the whole program through the decomposition, where `policy` applies."""
    table = aten_table()
    if decompose is None and not _needs_decomposition(program, table):
        try:
            ctx = _Context(program, Emitter(name, "error"), table)
            ctx.live = _live(program)  # what the decomposition's dead-code pass would keep
            ctx.run()
            return program, ctx
        except UnsupportedOpError:
            pass
    ep = program
    if decompose is not False:
        ep = program.run_decompositions(_decompositions(torch, program))
    ctx = _Context(ep, Emitter(name, policy), table)
    ctx.run()
    return ep, ctx


def from_torch(
    module: Any,
    example_args: Sequence[Any] = (),
    example_kwargs: dict[str, Any] | None = None,
    *,
    unknown: UnknownPolicy = "error",
    name: str | None = None,
) -> Graph:
    """`import_torch(...).graph`, warning (ReplicatedOpsWarning) if ops were replicated.

    Example:
        >>> graph = from_torch(model, (input_ids,))          # doctest: +SKIP
        >>> graph.num_params == sum(p.numel() for p in model.parameters())  # doctest: +SKIP
        True
    """
    result = import_torch(module, example_args, example_kwargs, unknown=unknown, name=name)
    warn_replicated(result, "from_torch")
    return result.graph


# -- the walk -------------------------------------------------------------------------------------
class _Context:
    """State of one import: node -> value, static (folded) nodes, the emitter."""

    def __init__(self, ep: Any, emitter: Emitter, table: TranslationTable[str, Rule]) -> None:
        self.torch = _torch()
        self.ep, self.emitter, self.table = ep, emitter, table
        self.live: set[Node] | None = None  # when set, only these call nodes are translated
        self.env: dict[Node, Any] = {}
        self.static: set[Node] = set()
        self.experts: dict[Node, Any] = {}  # node -> its grouped-experts block
        self.names: dict[Node, str] = {}
        self.name_counts: dict[tuple[str, str], int] = {}

    # -- placeholders ---------------------------------------------------------------------------
    def _placeholders(self) -> None:
        from torch.export.graph_signature import InputKind

        specs = {
            s.arg.name: s for s in self.ep.graph_signature.input_specs if hasattr(s.arg, "name")
        }
        state = {**self.ep.state_dict, **self.ep.constants}
        seen: dict[int, str] = {}
        for node in self.ep.graph.nodes:
            if node.op != "placeholder":
                continue
            spec = specs.get(node.name)
            val = node.meta.get("val")
            kind = spec.kind if spec is not None else InputKind.USER_INPUT
            if kind is InputKind.PARAMETER:
                tensor = state.get(spec.target)
                key = id(tensor) if tensor is not None else id(node)
                if key not in seen:  # tied parameters share one tensor object: count it once
                    seen[key] = self.emitter.tensor(
                        spec.target, tuple(val.shape), val.dtype.itemsize, Role.PARAMETER
                    )
                self.env[node] = seen[key]
            elif kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
                self.static.add(node)
                self.env[node] = self._constant(node, str(spec.target))
            elif kind is InputKind.USER_INPUT and self._is_tensor(val):
                self.env[node] = self.emitter.tensor(
                    node.name, tuple(val.shape), val.dtype.itemsize, Role.INPUT
                )
            else:  # tokens, custom objects, non-tensor user inputs: values, not tensors
                self.static.add(node)
                self.env[node] = val

    def _is_tensor(self, val: Any) -> bool:
        return isinstance(val, self.torch.Tensor)

    def _constant(self, node: Node, name: str | None = None) -> Lazy:
        val = node.meta["val"]
        return Lazy(
            lambda: self.emitter.tensor(
                name or node.name, tuple(val.shape), val.dtype.itemsize, Role.CONSTANT
            )
        )

    # -- nodes ------------------------------------------------------------------------------------
    def run(self) -> None:
        from shardplan.importers._aten_moe import expert_blocks

        self._placeholders()
        self.experts = expert_blocks(self)
        for node in self.ep.graph.nodes:
            if node.op == "get_attr":
                self.static.add(node)
                self.env[node] = None
            elif node.op == "call_function" and (self.live is None or node in self.live):
                self._call(node)

    def _call(self, node: Node) -> None:
        key = str(node.target)
        val = node.meta.get("val")
        parents = node.all_input_nodes
        if self.experts.get(node) is not None:  # a grouped-experts block (see _aten_moe)
            self.env[node] = self.experts[node].translate(self, node)
            return
        source = getattr(node.args[0], "target", None) if node.args else None
        token = node.target is operator.getitem and str(source) == "with_effects"
        if self._is_tensor(val) and val.numel() == 0 and not token:  # nothing to compute or cut
            self.emitter.notes.append(
                f"zero-size value {node.name} {tuple(val.shape)} ({key}) dropped"
            )  # fold it (a sum of it is 0) or skip it
            self.static.add(node)
            self.env[node] = None
            return
        if node.target is operator.getitem:
            source, index = node.args
            if source in self.static:
                self.static.add(node)
                self.env[node] = self._constant(node) if self._is_tensor(val) else val
            else:
                self.env[node] = self.env[source][index]
            return
        if key in _SKIP or (val is None and not node.users):
            return
        if key == "with_effects" and str(node.args[1]) in _SKIP:
            # with_effects(token, op, *args) threads a side effect through a token; around a
            # check (linalg's error check after lu_factor, inv_ex...) it computes nothing
            self.static.add(node)
            self.env[node] = val
            return
        if key in _CREATION or all(p in self.static for p in parents):
            self.static.add(node)
            self.env[node] = self._constant(node) if self._is_tensor(val) else val
            return
        try:
            rule = self.table.rule(key, lambda: _similar(self.table.keys(), key))
            self.env[node] = rule(self, node)
        except UnsupportedOpError as e:
            if self.emitter.policy == "error":
                path, module_type = self.module(node)
                raise UnsupportedOpError(
                    f"ATen op {key!r} (node {node.name!r}) in module {path or '<root>'!r} "
                    f"({module_type}) cannot be imported: {e}. Add a row to aten_table() in "
                    "shardplan/importers/torch.py, or pass unknown='replicate' to import it as "
                    "an opaque op that is never cut"
                ) from e
            self.env[node] = self._opaque(node)

    def _opaque(self, node: Node) -> Any:
        """An op the table cannot translate (unknown="replicate"): one opaque op reading every
        tensor operand the import knows (not effect tokens, not dropped zero-size values) and
        writing every non-empty tensor result (each replicated; a zero-size or non-tensor result
        maps to None)."""
        inputs: list[str] = []
        for parent in node.all_input_nodes:
            if isinstance(self.env.get(parent), (str, Lazy)):
                tensor = self.tensor(parent)
                if tensor not in inputs:
                    inputs.append(tensor)
        val = node.meta.get("val")
        flat = list(val) if isinstance(val, (tuple, list)) else [val]
        for i, v in enumerate(flat):
            if self._is_tensor(v) and v.numel() == 0:
                self.emitter.notes.append(
                    f"zero-size result {i} {tuple(v.shape)} of {node.name} ({node.target}) dropped"
                )
                flat[i] = None
        tensors = [v for v in flat if self._is_tensor(v)]
        if not tensors:
            raise UnsupportedOpError(
                f"ATen op {str(node.target)!r} (node {node.name!r}) has no tensor result to "
                "import as an opaque op; it cannot be replicated. Add a row to aten_table() "
                "(shardplan/importers/_aten.py) or leave the op out of the exported forward"
            )
        path, _ = self.module(node)
        outs = self.emitter.opaque(
            inputs,
            [tuple(v.shape) for v in tensors],
            [v.dtype.itemsize for v in tensors],
            name=self.op_name(node),
            source=str(node.target),
            layer=self.layer(node),
            module=path,
        )
        it = iter(outs)
        mapped = [next(it) if self._is_tensor(v) else None for v in flat]
        return mapped if isinstance(val, (tuple, list)) else mapped[0]

    # -- helpers for rules ------------------------------------------------------------------------
    def module(self, node: Node) -> tuple[str, str]:
        stack = node.meta.get("nn_module_stack") or {}
        if not stack:
            return "", "root"
        path, module_type = list(stack.values())[-1]
        return str(path), getattr(module_type, "__name__", str(module_type)).split(".")[-1]

    def layer(self, node: Node) -> str:
        return self.module(node)[0]

    def op_name(self, node: Node) -> str:
        """`<module path>.<aten name>` (`h.0.mlp.fc.addmm`), numbered within the module when it
        has several: names read like the model's code and repeat from one layer to the next."""
        name = self.names.get(node)
        if name is None:
            path = self.layer(node)
            base = re.sub(r"_\d+$", "", node.name)
            count = self.name_counts.get((path, base), 0)
            self.name_counts[(path, base)] = count + 1
            local = base if count == 0 else f"{base}_{count}"
            name = self.names[node] = f"{path}.{local}" if path else node.name
        return name

    def value(self, arg: Any) -> Any:
        return self.env[arg] if _is_node(arg) else arg

    def tensor(self, arg: Any) -> str:
        """The graph tensor of a node, materializing folded constants and pending transposes."""
        value = self.env.get(arg) if _is_node(arg) else None
        if isinstance(value, Lazy):
            value = value.make()
            self.env[arg] = value
        if not isinstance(value, str):
            raise UnsupportedOpError(f"operand {arg!r} is not a tensor the importer knows")
        return value

    def shape(self, arg: Any, index: int | None = None) -> tuple[int, ...]:
        val = arg.meta["val"]
        if index is not None:
            val = val[index]
        return tuple(int(s) for s in val.shape)

    def dtype_bytes(self, node: Node, index: int = 0) -> int:
        val = node.meta["val"]
        if isinstance(val, (tuple, list)):
            val = val[index]
        return int(val.dtype.itemsize)

    def used(self, node: Node) -> set[int]:
        """Indices of a multi-result node that some getitem reads."""
        return {u.args[1] for u in node.users if u.target is operator.getitem}

    def target(self, node: Node, part: str, index: int | None) -> dict[str, Any]:
        """Result name, layer, checked shape and bytes of one op emitted for `node`.

        The result is `node.name`, `node.name:index` (result `index` of a multi-result node) or
        `node.name/part` (an intermediate op, whose shape only the catalogue checks).
        """
        multi = isinstance(node.meta.get("val"), (tuple, list))
        base = self.op_name(node)
        if part:
            name, expect = f"{base}/{part}", None
        elif multi:
            if index is None:
                raise ShapeError(f"node {node.name!r} has several results; say which one")
            name, expect = f"{base}:{index}", self.shape(node, index)
        else:
            name, expect = base, self.shape(node)
        return {
            "name": name,
            "layer": self.layer(node),
            "expect": expect,
            "dtype_bytes": self.dtype_bytes(node, index or 0),
        }

    def emit(
        self,
        kind: str,
        inputs: Sequence[Any],
        node: Node,
        *,
        part: str = "",
        index: int | None = None,
        approx: bool = False,
        **attrs: Any,
    ) -> str:
        """Emit one catalogue op for `node` (see `target` for its result)."""
        target = self.target(node, part, index)
        return self.emitter.op(
            kind,
            [t if isinstance(t, str) else self.tensor(t) for t in inputs],
            **target,
            approx=str(node.target) if approx else None,
            source=str(node.target),
            **attrs,
        )

    def gather(
        self,
        node: Node,
        x: Any,
        index: Sequence[Any],
        axis: int,
        *,
        part: str = "",
        result: int | None = None,
        frozen: bool = False,
        **attrs: Any,
    ) -> str:
        """Emit the gather-like einsum form (see `_build`) of `x[.., index, ..]` at `axis`."""
        return self.emitter.gather(
            x if isinstance(x, str) else self.tensor(x),  # a str: an earlier part of this node
            [t if isinstance(t, str) else self.tensor(t) for t in index],
            axis,
            **self.target(node, part, result),
            frozen=frozen,
            approx=str(node.target),
            source=str(node.target),
            **attrs,
        )

    def index_constant(self, node: Node, shape: tuple[int, ...], part: str = "index") -> str:
        """An int64 CONSTANT holding the positions a slice, select or topk reads."""
        return self.emitter.tensor(f"{node.name}/{part}", shape, 8, Role.CONSTANT)

    def per_result(self, node: Node, make: Callable[[int | None], str]) -> Any:
        """`make(i)` for each result some getitem reads (None for the others), or `make(None)`."""
        val = node.meta.get("val")
        if not isinstance(val, (tuple, list)):
            return make(None)
        used = self.used(node)
        return [make(i) if i in used else None for i in range(len(val))]


def _similar(keys: Sequence[str], key: str) -> list[str]:
    """Rows whose op name (`aten.<name>.<overload>`) is close to `key`'s."""

    def base(k: str) -> str:
        parts = k.split(".")
        return parts[1] if len(parts) == 3 else k

    by_base: dict[str, list[str]] = {}
    for k in keys:
        by_base.setdefault(base(k), []).append(k)
    close = difflib.get_close_matches(base(key), list(by_base), n=3)
    return [k for c in close for k in by_base[c]][:5]


# -- tracing for engines that run the user's own program ----------------------------------------
CHECK_OPS = _SKIP
"""ATen ops of an export that only check (shapes, asserts) and have no tensor result."""


class TorchTrace:
    """What `shardplan.torch.parallelize` needs of an import: the program it runs (the one the
    import translated), the imported result, and FX node name -> the graph tensor(s) it is.

    `values[node]` is a tensor name, a tuple of names (None where a result is not a tensor) for a
    multi-result node, or absent for folded, skipped and pending (transposed) nodes.
    """

    __slots__ = ("program", "result", "values")

    def __init__(self, program: Any, result: ImportResult, values: dict[str, Any]) -> None:
        self.program, self.result, self.values = program, result, values


def trace_torch(
    module: Any,
    example_args: Sequence[Any] = (),
    example_kwargs: dict[str, Any] | None = None,
    *,
    unknown: UnknownPolicy = "error",
    name: str | None = None,
) -> TorchTrace:
    """`import_torch`, also returning the ExportedProgram it translated (export's own IR, or its
    core-ATen decomposition when some op needs it: the same choice as `import_torch`, so the
    graph is `from_torch`'s) and the FX node -> graph tensor map."""
    torch = _torch()
    policy = check_policy(unknown)
    program, default = _export(torch, module, example_args, example_kwargs)
    ep, ctx = _walk(torch, program, name or default, policy)
    result = ctx.emitter.build()
    values: dict[str, Any] = {}
    for node, value in ctx.env.items():
        if node in ctx.static:
            continue
        if isinstance(value, str):
            values[node.name] = value
        elif isinstance(value, (list, tuple)):
            values[node.name] = tuple(v if isinstance(v, str) else None for v in value)
    return TorchTrace(ep, result, values)
