"""Import a plain JAX function as a shardplan Graph.

    graph = from_jaxpr(fn, params, x, labels)      # fn(params, x, labels)
    p = shardplan.plan(graph, "8")
    sharded_fn = apply_plan(fn, p)                  # shardplan.engines.jaxpr: runs fn under p
    loss = sharded_fn(params, x, labels)

Conventions:
- The FIRST argument of `fn` is the parameters pytree: its leaves become PARAMETER tensors named
  by their pytree paths (`{"layers": [{"w": ...}]}` -> `layers.0.w`). The other arguments are
  INPUT tensors named by `fn`'s parameter names (`x`, `labels`; pytree arguments get dotted
  paths, e.g. `batch.ids`; `arg1`, `arg2`, ... for `*args`). Leaves no operator reads are left out.
- Literals and closed-over arrays become CONSTANT tensors; an equation whose operands are all
  constants (iota, a broadcast literal, a mask computed from them) is folded into a constant.
- Operators are named `<scope>.<primitive><n>` where `<scope>` is the `jax.named_scope` stack
  (dots instead of slashes), so `with jax.named_scope("block0"):` groups a layer.

Translation: ONE table, `RULES`, keyed by JAX primitive name. Sub-jaxprs of `jit`/`pjit`,
`closed_call`, `core_call`, `custom_jvp_call`, `custom_vjp_call`(`_jaxpr`), `remat`/`checkpoint`
are translated recursively (inlined). The forms:

- dot_general -> `linear` (x @ W.T), `matmul` (x @ W), `bmm` (leading batch dims), else
  `einsum` built from the dimension numbers.
- conv_general_dilated -> `conv2d` (2-D, no dilation, symmetric padding, one group); other
  dimension orders (NHWC, HWIO) get `transpose` ops around it.
- add sub mul div max min tanh exp logistic neg sqrt rsqrt convert_element_type -> `add sub mul
  div maximum minimum tanh exp sigmoid neg sqrt rsqrt cast` (exact).
- integer_pow (y=2), square -> `mul(x, x)` (exact); other exponents: unary form (approximate).
- other elementwise (log, erf, abs, select_n, comparisons, ...) -> elementwise form (approximate).
- reduce_sum, reduce_max -> `reduce_sum`, `reduce_max`; reduce_min, argmax, argmin,
  reduce_prod/and/or -> the same forms (approximate).
- reshape, squeeze, expand_dims -> `reshape`; transpose -> `transpose`; concatenate -> `concat`.
- broadcast_in_dim -> `reshape` (when it inserts size-1 dims), then `add` with a zeros CONSTANT
  spanning only the broadcast dims.
- gather (the embedding lookup `table[ids]`) -> `reshape` of the ids + `embedding`.
- sharding_constraint, stop_gradient, copy, optimization_barrier, ... -> no operator: the result
  is its operand.

"Approximate" forms keep shapes and the kind of every dim (parallel, reduced) but not the exact
function: the kind is a generic `identity`/`add`/`reduce_sum`/`reduce_max` with an attribute
`primitive` naming the JAX primitive, so the planner sees the right sharding structure. They are
counted in `ImportedJaxpr.approximated`. `broadcast_in_dim` is represented exactly (x + 0 with
the broadcast dims carried by a small zeros constant) but costs one elementwise pass of FLOPs
that XLA fuses away; the cost model therefore sees the broadcast as a (cheap) operator.

Unknown primitives raise UnsupportedOpError naming the primitive; with `unknown="replicate"`
they become opaque operators (every loop dim FROZEN: never cut, neighbours pay any
redistribution) and a ReplicatedOpsWarning lists them.

jax is imported inside the functions; without it they raise MissingDependencyError.
"""

from __future__ import annotations

import contextlib
import inspect
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from shardplan.errors import (
    IRError,
    ShapeError,
    UnsupportedOpError,
)
from shardplan.importers._jaxpr_rules import (
    INLINE,
    RULES,
    _numel,
    _static_shape,
    is_dropped,
    opaque_signature,
    sub_jaxpr,
)
from shardplan.ir.graph import Graph, GraphBuilder
from shardplan.ir.op import Op, Role, Tensor
from shardplan.ir.traits import OPAQUE_KIND
from shardplan.lazy import require


def require_jax() -> Any:
    return require("jax", "jax.extend.core", extra="jax", user="the jaxpr importer")


# -- the translator ------------------------------------------------------------------------------


@dataclass
class ImportedJaxpr:
    """What `import_jaxpr` returns: the graph plus what the import could not translate exactly.

    Attributes:
        graph: the verified Graph.
        tensor_of: jaxpr variable -> graph tensor name (every variable of the jaxpr and of the
            inlined sub-jaxprs that has a tensor; used by `shardplan.engines.jaxpr.apply_plan`).
        replicated: opaque operators (unknown primitives with unknown="replicate").
        approximated: primitive -> number of equations given an approximate form.
        out_tree: the pytree structure of `fn`'s results.
    """

    graph: Graph
    tensor_of: dict[Any, str] = field(repr=False)
    replicated: tuple[str, ...] = ()
    approximated: dict[str, int] = field(default_factory=dict)
    out_tree: Any = None
    closed_jaxpr: Any = field(default=None, repr=False)


class _Translator:
    def __init__(self, name: str, unknown: str) -> None:
        if unknown not in ("error", "replicate"):
            raise ValueError(f"unknown={unknown!r}; use 'error' or 'replicate'")
        self.b = GraphBuilder(name)
        self.unknown = unknown
        self.env: dict[Any, str] = {}
        self.constants: set[str] = set()
        self.counts: Counter[str] = Counter()
        self.replicated: list[str] = []
        self.approximated: Counter[str] = Counter()
        self.scope = ""
        self._current: Any = None

    # -- tensors --------------------------------------------------------------------------------
    @staticmethod
    def dtype_bytes(var: Any) -> int:
        return max(int(getattr(var.aval.dtype, "itemsize", 4)), 1)

    def shape(self, tensor: str) -> tuple[int, ...]:
        return self.b.shape(tensor)

    def _unique(self, base: str) -> str:
        self.counts[base] += 1
        return f"{base}{self.counts[base]}"

    def add(self, name: str, var: Any, role: Role) -> str:
        shape = _static_shape(var.aval.shape, name)
        self.b.add_tensor(Tensor(name, shape, self.dtype_bytes(var), role))
        if role is Role.CONSTANT:
            self.constants.add(name)
        return name

    def constant(self, shape: Sequence[int], dtype_bytes: int, base: str) -> str:
        name = self._unique(base)
        self.b.add_tensor(Tensor(name, tuple(shape), dtype_bytes, Role.CONSTANT))
        self.constants.add(name)
        return name

    def read(self, atom: Any) -> str:
        jax = require_jax()
        if isinstance(atom, jax.extend.core.Literal):
            return self.add(self._unique("literal"), atom, Role.CONSTANT)
        if atom not in self.env:
            raise ShapeError(f"jaxpr variable {atom} is used before it is defined")
        return self.env[atom]

    # -- ops ------------------------------------------------------------------------------------
    def op_name(self, base: str) -> str:
        return self._unique(f"{self.scope}{base}")

    def emit(
        self, kind: str, ins: Sequence[str], var: Any, approx: str | None = None, **attrs: Any
    ) -> str:
        """Add a catalogue op; check its result shape against the jaxpr variable `var`."""
        name = self.op_name(self._current.primitive.name)
        dtype = self.dtype_bytes(var) if var is not None else self.b.dtype_bytes
        parts = [p for p in self.scope.split(".") if p]
        with contextlib.ExitStack() as stack:  # the builder's scope sets the op's layer
            for part in parts:
                stack.enter_context(self.b.scope(part))
            out = self.b.apply(
                kind, *ins, name=name[len(self.scope) :], out_dtype_bytes=dtype, **attrs
            )
        if var is not None:
            want = tuple(int(s) for s in var.aval.shape)
            if self.shape(out) != want:
                raise ShapeError(
                    f"jaxpr equation {self._current.primitive.name} became {kind} {name!r} of "
                    f"shape {self.shape(out)} but JAX says {want}; the translation rule is wrong"
                )
        if approx:
            self.approximated[approx] += 1
        return out

    def unsupported(self, eqn: Any, ins: list[str], what: str | None = None) -> list[str]:
        prim = eqn.primitive.name
        if self.unknown == "error":
            hint = "" if what is None else f" ({what})"
            raise UnsupportedOpError(
                f"JAX primitive {prim!r}{hint} has no shardplan translation; map it in "
                "shardplan.importers.jaxpr.RULES or import with unknown='replicate' to keep "
                "it as an opaque, never-cut operator"
            )
        name = self.op_name(prim)
        outs = [name] if len(eqn.outvars) == 1 else [f"{name}:{i}" for i in range(len(eqn.outvars))]
        for out, var in zip(outs, eqn.outvars, strict=True):
            self.b.add_tensor(
                Tensor(
                    out, _static_shape(var.aval.shape, out), self.dtype_bytes(var), Role.ACTIVATION
                )
            )
        signature = opaque_signature([self.shape(t) for t in ins], [self.shape(o) for o in outs])
        flops = float(sum(_numel(self.shape(o)) for o in outs))
        self.b.add_op(
            Op(
                name,
                OPAQUE_KIND,
                signature,
                tuple(ins),
                tuple(outs),
                flops,
                (("primitive", prim),),
                self.scope.rstrip("."),
            )
        )
        self.replicated.append(f"{name} ({prim})")
        return outs

    # -- equations ------------------------------------------------------------------------------
    def run(self, jaxpr: Any, consts: Sequence[Any], ins: Sequence[str]) -> None:
        for var, value in zip(jaxpr.constvars, consts, strict=True):
            self.env[var] = self.add(self._unique("const"), var, Role.CONSTANT)
            del value
        for var, name in zip(jaxpr.invars, ins, strict=True):
            if name is not None:
                self.env[var] = name
        for eqn in jaxpr.eqns:
            self.equation(eqn)

    def equation(self, eqn: Any) -> None:
        jax = require_jax()
        prim = eqn.primitive.name
        literal = jax.extend.core.Literal
        operands = [a for a in eqn.invars if not isinstance(a, literal)]
        if all(self.env.get(a) in self.constants for a in operands):
            for var in eqn.outvars:  # only constants in: fold into a constant
                if not is_dropped(var):
                    self.env[var] = self.add(self._unique("const"), var, Role.CONSTANT)
            return
        sub = sub_jaxpr(eqn) if prim in INLINE else None
        if sub is not None:
            jaxpr, consts = sub
            ins = [self.read(a) for a in eqn.invars]
            saved = self.scope
            self.scope = self._scope_of(eqn)
            self.run(jaxpr, consts, ins[len(ins) - len(jaxpr.invars) :])
            self.scope = saved
            for outer, inner in zip(eqn.outvars, jaxpr.outvars, strict=True):
                if not is_dropped(outer):
                    self.env[outer] = (
                        self.read(inner)
                        if not isinstance(inner, literal)
                        else (self.add(self._unique("literal"), inner, Role.CONSTANT))
                    )
            return
        ins = [self.read(a) for a in eqn.invars]
        self._current = eqn
        saved = self.scope
        self.scope = self._scope_of(eqn)
        try:
            rule = RULES.get(prim)
            outs = rule(self, eqn, ins) if rule is not None else self.unsupported(eqn, ins)
        finally:
            self.scope = saved
        for var, name in zip(eqn.outvars, outs, strict=True):
            if not is_dropped(var):
                self.env[var] = name

    def _scope_of(self, eqn: Any) -> str:
        stack = str(getattr(eqn.source_info, "name_stack", "") or "")
        parts = [re.sub(r"[^A-Za-z0-9_]+", "_", p).strip("_") for p in stack.split("/")]
        parts = [p for p in parts if p]
        return "".join(f"{p}." for p in parts) if parts else self.scope


# -- argument naming -----------------------------------------------------------------------------


def _path_name(path: Sequence[Any]) -> str:
    parts = []
    for key in path:
        for attr in ("key", "idx", "name"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(re.sub(r"[^A-Za-z0-9_]+", "", str(key)))
    return ".".join(p for p in parts if p)


def _arg_names(fn: Callable[..., Any], count: int) -> list[str]:
    names: list[str] = []
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    for p in params:
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
    return [names[i] if i < len(names) else f"arg{i}" for i in range(count)]


def leaf_names(fn: Callable[..., Any], args: Sequence[Any]) -> list[list[str]]:
    jax = require_jax()
    arg_names = _arg_names(fn, len(args))
    out = []
    for i, arg in enumerate(args):
        leaves = jax.tree_util.tree_flatten_with_path(arg)[0]
        names = []
        for path, _ in leaves:
            sub = _path_name(path)
            if i == 0:
                names.append(sub or "params")
            else:
                names.append(f"{arg_names[i]}.{sub}" if sub else arg_names[i])
        out.append(names)
    return out


# -- public API ----------------------------------------------------------------------------------


def import_jaxpr(
    fn: Callable[..., Any], *example_args: Any, name: str | None = None, unknown: str = "error"
) -> ImportedJaxpr:
    """Trace `fn(*example_args)` with `jax.make_jaxpr` and translate it (see the module doc).

    The first argument is the parameters pytree. Raises UnsupportedOpError for a primitive
    without a rule (unless `unknown="replicate"`), ShapeError for symbolic or zero-size shapes.
    """
    jax = require_jax()
    if not example_args:
        raise IRError("from_jaxpr needs example arguments: fn(params, *inputs)")
    closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*example_args)
    graph_name = name or getattr(fn, "__name__", "jaxpr")
    t = _Translator(graph_name, unknown)
    names = [n for group in leaf_names(fn, example_args) for n in group]
    roles = [Role.PARAMETER] * len(jax.tree_util.tree_leaves(example_args[0]))
    roles += [Role.INPUT] * (len(names) - len(roles))
    used = _used_invars(closed.jaxpr)
    seen: set[str] = set()
    ins: list[str | None] = []
    for var, n, role in zip(closed.jaxpr.invars, names, roles, strict=True):
        if var not in used:
            ins.append(None)
            continue
        if n in seen:
            raise IRError(f"two arguments of {graph_name!r} are both named {n!r}")
        seen.add(n)
        ins.append(t.add(n, var, role))
    t.run(closed.jaxpr, closed.consts, ins)
    graph = t.b.build()
    result = ImportedJaxpr(
        graph,
        dict(t.env),
        tuple(t.replicated),
        dict(t.approximated),
        jax.tree_util.tree_structure(out_shape),
        closed,
    )
    from shardplan.importers._build import warn_replicated

    warn_replicated(t.replicated, "from_jaxpr", "equation(s)", "", stacklevel=4)
    return result


def _used_invars(jaxpr: Any) -> set[Any]:
    jax = require_jax()
    literal = jax.extend.core.Literal
    used: set[Any] = set()
    for eqn in jaxpr.eqns:
        used.update(a for a in eqn.invars if not isinstance(a, literal))
    used.update(a for a in jaxpr.outvars if not isinstance(a, literal))
    return used


def from_jaxpr(
    fn: Callable[..., Any], *example_args: Any, name: str | None = None, unknown: str = "error"
) -> Graph:
    """The Graph of `fn(params, *inputs)` traced on `example_args` (see `import_jaxpr`)."""
    return import_jaxpr(fn, *example_args, name=name, unknown=unknown).graph
