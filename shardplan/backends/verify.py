"""Verify a plan on JAX/XLA: same numerics as the unsharded program, and the collectives XLA
actually inserts compared with the ones the cost model predicts.

`verify_plan(plan)` runs the graph twice on the same deterministic parameters and inputs:
unsharded (jit on one device) and sharded (jit on `jax_mesh(plan.mesh)`, parameters and inputs
placed by the plan's layouts through `in_shardings`, every operator output constrained to the
layout its producer leaves it in, and in training every parameter gradient constrained to its
parameter's layout). It compares the outputs (training: also the loss and every gradient), then
parses the collectives of the compiled sharded program and converts each to the cost model's
convention, "bytes one device sends with ring algorithms":

    all-reduce          2 (g-1)/g * B      B = the reduced buffer
    all-gather            (g-1)/g * B      B = the gathered result
    reduce-scatter        (g-1)   * B      B = the scattered result (one device's piece)
    all-to-all            (g-1)/g * B      B = one device's buffer
    collective-permute             B       B = the buffer a sending device sends

where g is the replica-group size. Measured bytes are compared with the prediction per
collective kind (`CostBreakdown.comm`) and per operator (a collective belongs to the shardplan
operator named in its HLO `op_name` metadata: every operator runs in `jax.named_scope(op.name)`).
Every per-operator difference above 10% gets a cause from `CAUSES` (the model limitations
documented in docs/verification.md), found by rules that read the HLO and the plan; a difference
no rule explains is reported with cause "unexplained".

Numerics: a tensor passes when max|sharded - unsharded| <= rtol * max|unsharded| + atol
(defaults rtol 1e-4, atol 1e-6 for float32); `max_error` is the largest
max|sharded - unsharded| / max(max|unsharded|, atol / rtol) over the checked tensors.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from shardplan.cost.presets import CostOptions, get_preset
from shardplan.cost.terms import CommTerms
from shardplan.errors import BackendError
from shardplan.ir.graph import Graph
from shardplan.ir.op import Role
from shardplan.plan import Plan

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-6
TOLERANCE = 0.10
"""Measured and predicted bytes of one kind (or one operator) agree within +-10%."""
MIN_BYTES = 64.0
"""Per-operator differences below this many bytes per device are not listed (scalars)."""

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
PREDICTED_FIELD = {
    "all-reduce": "all_reduce_bytes",
    "all-gather": "all_gather_bytes",
    "reduce-scatter": None,
    "all-to-all": "all_to_all_bytes",
    "collective-permute": "halo_bytes",
}
"""HLO collective kind -> the CommTerms field that predicts it (reduce-scatter is not modelled:
the cost model charges an all-reduce or an all-gather where XLA may reduce-scatter)."""

UNEXPLAINED = "unexplained"


def sent_bytes(kind: str, buffer_bytes: float, group_size: int) -> float:
    """Bytes one device sends for one collective (ring algorithms), from its HLO buffer size."""
    g = max(int(group_size), 1)
    if kind == "all-reduce":
        return 2.0 * (g - 1) / g * buffer_bytes
    if kind in ("all-gather", "all-to-all"):
        return (g - 1) / g * buffer_bytes
    if kind == "reduce-scatter":
        return (g - 1) * float(buffer_bytes)
    if kind == "collective-permute":
        return float(buffer_bytes)
    raise BackendError(f"unknown collective kind {kind!r}; expected one of {KINDS}")


# -- measured collectives ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MeasuredCollective:
    """One collective of the compiled program (one element of a combined tuple collective).

    Attributes:
        kind: all-reduce | all-gather | reduce-scatter | all-to-all | collective-permute.
        sent_bytes: bytes one device sends (see the module docstring).
        buffer_bytes: the HLO buffer size B the formula starts from.
        group_size: devices per replica group (collective-permute: sending devices).
        ops: shardplan operators named in the `op_name` metadata (first = innermost scope).
        backward: the metadata says it belongs to the backward pass (`transpose(...)`).
        op_name: the metadata op_name.
        instruction: the HLO instruction (`all-reduce.3`, or `all-reduce.3[2]` for element 2).
        shape: the element's HLO shape, e.g. `f32[8,16]`.
    """

    kind: str
    sent_bytes: float
    buffer_bytes: int
    group_size: int
    ops: tuple[str, ...]
    backward: bool
    op_name: str
    instruction: str
    shape: str

    @property
    def op(self) -> str:
        return self.ops[0] if self.ops else ""


_DTYPE_BYTES = {
    "pred": 1,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([^\]]*)\]")
_DEFINITION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.+?)\s+([a-z][\w\-]*)\((.*)$")
_GTE = re.compile(r"get-tuple-element\(%?([\w.\-]+)\),\s*index=(\d+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TUPLE_KINDS = ("all-reduce", "reduce-scatter", "all-to-all")


def _arrays(shape_text: str) -> list[tuple[str, int]]:
    """[(`f32[8,16]`, bytes), ...] of the arrays in an HLO shape (tuples give several)."""
    out = []
    for dtype, dims in _ARRAY.findall(shape_text):
        if dtype not in _DTYPE_BYTES:
            continue
        n = 1
        for d in dims.split(","):
            d = d.strip().lstrip("<=")
            if d:
                n *= int(d)
        out.append((f"{dtype}[{dims}]", n * _DTYPE_BYTES[dtype]))
    return out


class _OpNames:
    """Finds the shardplan operators an HLO `op_name` names (scopes are operator names)."""

    def __init__(self, graph: Graph) -> None:
        self.names = set(graph.op_index)
        self._cache: dict[str, tuple[str, ...]] = {}

    def __call__(self, op_name: str) -> tuple[str, ...]:
        hit = self._cache.get(op_name)
        if hit is None:
            found = [t for t in re.split(r"[/():]", op_name) if t in self.names]
            if not found and "/" in "".join(self.names):  # operator names that contain '/'
                found = [n for n in self.names if n in op_name]
            hit = tuple(dict.fromkeys(found))
            self._cache[op_name] = hit
        return hit


def measure(hlo_text: str, graph: Graph) -> list[MeasuredCollective]:
    """Every collective of compiled HLO, one entry per element of combined (tuple) collectives,
    in the "bytes one device sends" convention and attributed to shardplan operators."""
    from shardplan.backends import jax as jb

    collectives = jb.parse_collectives(hlo_text)
    wanted = {c.instruction for c in collectives}
    shapes: dict[str, str] = {}
    operands: dict[str, list[str]] = {}
    names_of: dict[str, str] = {}
    elements: dict[str, dict[int, str]] = defaultdict(dict)
    for line in hlo_text.splitlines():
        m = _DEFINITION.match(line)
        if not m:
            continue
        name, shape, opcode, rest = m.groups()
        op_name = _OP_NAME.search(line)
        if op_name:
            names_of[name] = op_name.group(1)
        if name in wanted:
            shapes[name] = shape
            operands[name] = re.findall(r"%([\w.\-]+)", rest.split("),")[0])
        if opcode == "get-tuple-element" and op_name:
            g = _GTE.search(line)
            if g and g.group(1) in wanted:
                elements[g.group(1)][int(g.group(2))] = op_name.group(1)
    find = _OpNames(graph)
    out: list[MeasuredCollective] = []
    for c in collectives:
        arrays = _arrays(shapes.get(c.instruction, ""))
        if c.kind in _TUPLE_KINDS and len(arrays) > 1:
            parts = []
            for i, (shape, nbytes) in enumerate(arrays):
                args = operands.get(c.instruction, [])
                name = (
                    elements[c.instruction].get(i)
                    or (names_of.get(args[i], "") if i < len(args) else "")
                    or c.op_name
                )
                parts.append((f"{c.instruction}[{i}]", shape, nbytes, name))
        else:
            shape = arrays[-1][0] if arrays else ""
            parts = [(c.instruction, shape, c.bytes_per_device, c.op_name)]
        for instruction, shape, nbytes, name in parts:
            ops = find(name)
            out.append(
                MeasuredCollective(
                    c.kind,
                    sent_bytes(c.kind, nbytes, c.group_size),
                    int(nbytes),
                    c.group_size,
                    ops,
                    _is_backward(name, ops),
                    name,
                    instruction,
                    shape,
                )
            )
    return out


def computed_sizes(hlo_text: str, graph: Graph) -> dict[str, int]:
    """Per operator, the largest array (elements per device) its forward instructions produce.

    Compiled SPMD HLO has per-device shapes, so an operator whose forward instructions produce
    its output's global size was computed whole (replicated) by XLA, whatever the plan says.
    """
    find = _OpNames(graph)
    sizes: dict[str, int] = defaultdict(int)
    for line in hlo_text.splitlines():
        m = _DEFINITION.match(line)
        name = _OP_NAME.search(line) if m else None
        if not m or not name or "transpose(" in name.group(1):
            continue
        ops = find(name.group(1))
        if not ops:
            continue
        arrays = _arrays(m.group(2))
        if arrays:
            biggest = max(_numel(_dims(a)[1]) for a, _ in arrays)
            sizes[ops[0]] = max(sizes[ops[0]], biggest)
    return dict(sizes)


def _is_backward(op_name: str, ops: Sequence[str]) -> bool:
    if not ops:
        return "transpose(" in op_name
    at = op_name.find(ops[0])
    return "transpose(" in op_name[:at] if at >= 0 else "transpose(" in op_name


# -- predicted communication ---------------------------------------------------------------------


def byte_options(plan: Plan, train: bool) -> CostOptions:
    """The plan's cost options for `train`, counting bytes (a symbolic preset counts none)."""
    opts = plan.options
    if opts.preset.symbolic:
        opts = replace(opts, preset=get_preset("shardplan"))
    return replace(opts, train=train)


@dataclass(frozen=True, slots=True)
class EdgePrediction:
    """One incoming edge of an operator whose layouts differ: tensor, layouts, its terms."""

    tensor: str
    position: int
    src: tuple[int, ...]
    dst: tuple[int, ...]
    terms: CommTerms
    gather_shortfall: float = 0.0
    """Bytes the model's backward gradient gather of this replicated -> split edge misses
    against a ring all-gather of the whole gradient (see `gradient_gather_shortfall`)."""


@dataclass(frozen=True, slots=True)
class OpPrediction:
    """Predicted communication of one operator: its own cut (intra, with the gradient-sharing
    credit), its incoming edges, and the credit itself (all-reduce bytes saved by sharing)."""

    intra: CommTerms
    edges: tuple[EdgePrediction, ...]
    shared_credit_bytes: float = 0.0

    @property
    def total(self) -> CommTerms:
        total = self.intra
        for e in self.edges:
            total = total + e.terms
        return total


def predict_by_op(plan: Plan, options: CostOptions) -> dict[str, OpPrediction]:
    """Per operator, the terms the evaluator sums (the loop of `evaluate_strategies`)."""
    from shardplan.cost.evaluate import (
        edge_terms,
        op_intra,
        param_homes,
        previous_consumer,
        share_credit,
        unary_terms,
    )
    from shardplan.sharding import operand_layout, resolved

    graph, mesh, strategies = plan.graph, plan.mesh, plan.strategies
    homes = param_homes(graph, strategies, plan.param_layouts)
    out_layout = {
        name: resolved(operand_layout(op, strategies[op.name], i, True))
        for op in graph.ops
        for i, name in enumerate(op.outputs)
    }
    result: dict[str, OpPrediction] = {}
    for index, op in enumerate(graph.ops):
        strategy = strategies[op.name]
        intra, _ = unary_terms(graph, op, strategy, mesh, options)
        full = op_intra(graph, op, strategy, mesh.rounds, options)
        edges = []
        for i, name in enumerate(op.inputs):
            prev = previous_consumer(graph, name, index, i)
            if prev is not None:
                p_op = graph.ops[prev[0]]
                intra = intra + share_credit(
                    graph,
                    name,
                    (p_op, prev[1], strategies[p_op.name]),
                    (op, i, strategy),
                    mesh,
                    options,
                )
            src = out_layout.get(name) or homes.get(name)
            if src is None:
                continue
            dst = operand_layout(op, strategy, i)
            if src != dst:
                terms = edge_terms(graph, name, src, dst, mesh.rounds, options)
                short = gradient_gather_shortfall(graph, name, src, dst, mesh, terms, options)
                edges.append(EdgePrediction(name, i, tuple(src), tuple(dst), terms, short))
        credit = full.all_reduce_bytes - intra.all_reduce_bytes
        result[op.name] = OpPrediction(intra, tuple(edges), max(credit, 0.0))
    return result


def gradient_gather_shortfall(
    graph: Graph,
    tensor: str,
    src: Sequence[int],
    dst: Sequence[int],
    mesh: Any,
    terms: CommTerms,
    options: CostOptions,
) -> float:
    """Ring all-gather bytes of the backward gradient gather of a replicated -> split edge
    minus what the model charges, when the edge splits in several rounds.

    Only edges whose every other round keeps the same layout qualify: the producer needs the
    whole gradient (its local size L), the consumer holds L/Q (Q = product of the rounds that
    slice), so a ring all-gather sends (1 - 1/Q) L per device. The model charges, per round,
    (q-1)/q of the consumer's local size shrunk by the later rounds too (3L/8 instead of 7L/8
    for three rounds of q=2): a cost-model bug reported with verify's findings.
    """
    from shardplan.sharding import REPLICATED

    if not options.train or tensor not in graph.requires_grad:
        return 0.0
    rounds = mesh.rounds
    slicing = [
        r for r, (s, d) in enumerate(zip(src, dst, strict=True)) if s == REPLICATED and d >= 0
    ]
    if len(slicing) < 2 or any(
        s != d for r, (s, d) in enumerate(zip(src, dst, strict=True)) if r not in slicing
    ):
        return 0.0
    t = graph.tensors[tensor]
    local = t.nbytes / _numel(rounds[r].q for r, s in enumerate(src) if s >= 0)
    q = _numel(rounds[r].q for r in slicing)
    return max((1 - 1 / q) * local - terms.all_gather_bytes, 0.0)


def kind_bytes(terms: CommTerms, kind: str) -> float:
    fld = PREDICTED_FIELD[kind]
    return float(getattr(terms, fld)) if fld else 0.0


# -- causes of differences -----------------------------------------------------------------------

CAUSES: Mapping[str, str] = {
    "norm-statistics": (
        "XLA computes a normalisation (layer/RMS norm, softmax, cross-entropy, batch norm) with "
        "its normalised axis - for batch norm, the batch - split and all-reduces per-row "
        "statistics (max, sum, mean, variance) or gathers the norm's small parameter gradients; "
        "the cost model charges nothing for them (batch norm: unmodelled by design)"
    ),
    "split-normalised-axis": (
        "the plan all-gathers the input of a softmax/norm/cross-entropy that arrives split on "
        "its FROZEN axis; XLA computes it split instead (statistics all-reduced), so the "
        "predicted all-gather does not happen"
    ),
    "shared-gradient": (
        "a tensor read by several operators in the same layout (tied embedding, q/k/v reading "
        "one activation): the model sums the gradient contributions locally and all-reduces "
        "once; XLA all-reduces every contribution (one tuple all-reduce, same bytes)"
    ),
    "gradient-in-steps": (
        "a gradient reduced toward a parameter stored split (FSDP/ZeRO) is all-reduced in "
        "several steps over sub-groups, each of the full buffer (the CPU backend has no "
        "reduce-scatter: all-reduce + dynamic-slice): sum 2(g_i-1)/g_i B instead of the ring "
        "2(G-1)/G B"
    ),
    "weight-regather": (
        "in the backward pass XLA all-gathers (part of) a parameter again - FSDP does not keep "
        "the gathered weight, or XLA prefers gathering the weight to reducing an activation "
        "gradient - which the model does not charge"
    ),
    "sharded-parameter-compute": (
        "XLA computes an operator on a parameter stored split (FSDP/ZeRO) without gathering it "
        "(e.g. a masked lookup on a sharded embedding table whose result is all-reduced), "
        "instead of the all-gather of the parameter the model charges"
    ),
    "round-order": (
        "adding a split of a tensor dim in an earlier round to a split in a later round is not "
        "a local slice (a PartitionSpec orders a dim's mesh axes outermost first): XLA moves "
        "blocks with a collective-permute where the model charges nothing (forward) or an "
        "all-gather (backward)"
    ),
    "input-resharding": (
        "a graph input or constant (token ids, a routing mask) is read by an operator in "
        "another layout than it was placed in; the model assumes inputs arrive where each "
        "consumer reads them"
    ),
    "all-gather-for-all-to-all": (
        "XLA implements a split-to-split redistribution, modelled as an all-to-all, with an "
        "all-gather and a dynamic-slice (or replicates the tensor: 'involuntary full "
        "rematerialization')"
    ),
    "merged-partial-sums": (
        "XLA adds partial sums of several operators before one all-reduce (two vocab-parallel "
        "embeddings feeding an add), or adds a split gradient into another reader's partial "
        "gradient before its all-reduce, where the model reduces each / gathers the split one"
    ),
    "contract-split-input": (
        "an input arrives split on a dim the operator contracts; the plan all-gathers it, XLA "
        "contracts the local parts and all-reduces the partial result (more bytes when the "
        "result is larger than the input)"
    ),
    "partial-gradient-slice": (
        "a gradient all-reduce followed by a slice to the producer's split layout: XLA "
        "all-reduces only the slice the producer keeps, the model the whole local gradient"
    ),
    "xla-partitioning": (
        "XLA's SPMD partitioner implements the operator's cut with other collectives than the "
        "plan's (only the layouts of the operator's inputs and output are constrained, not its "
        "inside): e.g. a conv/matmul cut along two loop dims, or it gathers an input and "
        "computes redundantly instead of reducing a partial result"
    ),
    "xla-replicated-compute": (
        "XLA all-gathers an activation the plan keeps split and computes the operator on the "
        "whole tensor (its per-device result in the compiled HLO has the global shape), so the "
        "partial sums, gradient all-reduces and redistributions the plan implies vanish"
    ),
    "moved-to-neighbour": (
        "the same collective is attributed by the HLO metadata to a neighbouring operator "
        "(a redistribution placed at the producer, a gradient gather at the previous "
        "operator's sharding constraint); not a volume difference"
    ),
    "gradient-gather-volume": (
        "cost-model bug: the backward gradient all-gather of a replicated -> split edge that "
        "slices in several rounds is charged (q-1)/q of the consumer's shrinking local size per "
        "round (3L/8 for 2x2x2) instead of a ring all-gather of the whole gradient (7L/8); XLA "
        "gathers the whole gradient"
    ),
    "outside-graph": (
        "collectives whose metadata names no operator of the graph: the scalar objective the "
        "backend adds (sum of the outputs) or XLA-internal code"
    ),
}
"""Known causes of measured != predicted, each a documented model limitation
(docs/verification.md explains each with an HLO excerpt)."""

NORM_KINDS = ("layer_norm", "rms_norm", "batch_norm", "softmax", "cross_entropy")


@dataclass(frozen=True, slots=True)
class Difference:
    """One operator and collective kind where measured and predicted bytes disagree > 10%.

    `op` is "" for collectives the metadata does not attribute to an operator. `causes` are
    keys of CAUSES, or contain "unexplained" when rules could not account for
    `unexplained_bytes` of the difference.
    """

    op: str
    kind: str
    predicted: float
    measured: float
    causes: tuple[str, ...]
    detail: str = ""
    unexplained_bytes: float = 0.0

    @property
    def explained(self) -> bool:
        return UNEXPLAINED not in self.causes


@dataclass
class _Delta:
    op: str
    kind: str
    predicted: float
    measured: float
    remaining: float
    causes: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)

    @property
    def sign(self) -> int:
        return 1 if self.measured > self.predicted else -1

    def take(self, amount: float, cause: str, detail: str = "") -> float:
        amount = min(max(amount, 0.0), self.remaining)
        if amount <= 0:
            return 0.0
        self.remaining -= amount
        if cause not in self.causes:
            self.causes.append(cause)
        if detail:
            self.details.append(detail)
        return amount

    def done(self) -> bool:
        return self.remaining <= max(TOLERANCE * max(self.predicted, self.measured), MIN_BYTES)


def _significant(p: float, m: float) -> bool:
    return abs(m - p) > max(TOLERANCE * max(p, m), MIN_BYTES)


def _dims(shape: str) -> tuple[str, tuple[int, ...]]:
    m = _ARRAY.search(shape)
    if not m:
        return "", ()
    return m.group(1), tuple(int(d) for d in m.group(2).split(",") if d.strip())


def _numel(shape: Iterable[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


class _Explainer:
    """Rules that attribute each per-operator difference to a cause (see CAUSES)."""

    def __init__(
        self,
        plan: Plan,
        pred: Mapping[str, OpPrediction],
        measured: Sequence[MeasuredCollective],
        sizes: Mapping[str, int] | None = None,
    ) -> None:
        self.plan, self.graph, self.pred = plan, plan.graph, pred
        self.sizes = dict(sizes or {})
        self.elems: dict[tuple[str, str], list[MeasuredCollective]] = defaultdict(list)
        for m in measured:
            self.elems[(m.op, m.kind)].append(m)
        self.merged: dict[str, float] = defaultdict(float)
        for m in measured:
            for other in m.ops[1:]:
                self.merged[other] += m.sent_bytes
        self._adj: dict[str, set[str]] | None = None
        self.used_shortfall: dict[tuple[str, str, int], float] = defaultdict(float)

    # -- graph helpers --------------------------------------------------------------------------
    def neighbours(self, op: str, hops: int) -> list[str]:
        """Operators within `hops` edges of `op`, nearest first (not `op` itself)."""
        if self._adj is None:
            adj: dict[str, set[str]] = defaultdict(set)
            g = self.graph
            for o in g.ops:
                for t in o.inputs:
                    p = g.producer.get(t)
                    if p is not None:
                        adj[o.name].add(g.ops[p].name)
                        adj[g.ops[p].name].add(o.name)
            self._adj = adj
        seen, frontier, order = {op}, [op], []
        for _ in range(hops):
            nxt = []
            for x in frontier:
                for y in sorted(self._adj.get(x, ())):
                    if y not in seen:
                        seen.add(y)
                        nxt.append(y)
                        order.append(y)
            frontier = nxt
        return order

    def params_of(self, op: str) -> list[str]:
        return [t for t in self.graph.op(op).inputs if self.graph.tensors[t].role is Role.PARAMETER]

    # -- excess rules ---------------------------------------------------------------------------
    def statistics(self, d: _Delta) -> None:
        if not d.op or d.kind not in ("all-reduce", "all-gather"):
            return
        op = self.graph.op(d.op)
        if op.kind not in NORM_KINDS:
            return
        x = self.graph.tensors[op.inputs[0]].shape
        if op.kind == "batch_norm":
            per_row = x[1] if len(x) > 1 else 1
        else:
            frozen = _numel(dm.extent for dm in op.signature.loop_dims if dm.kind.name == "FROZEN")
            per_row = _numel(x) // max(frozen, 1)
        small = [m for m in self.elems[(d.op, d.kind)] if _numel(_dims(m.shape)[1]) <= per_row]
        d.take(
            sum(m.sent_bytes for m in small),
            "norm-statistics",
            f"{len(small)} statistic-sized collectives",
        )

    def shared_gradient(self, d: _Delta) -> None:
        if d.kind != "all-reduce" or not d.op:
            return
        credit = self.pred[d.op].shared_credit_bytes
        bwd = sum(m.sent_bytes for m in self.elems[(d.op, d.kind)] if m.backward)
        if credit > 0 and bwd > 0:
            d.take(
                min(credit, bwd),
                "shared-gradient",
                f"model credits {credit:.0f} B of gradient all-reduce to an earlier reader",
            )

    def gradient_steps(self, d: _Delta) -> None:
        if d.kind != "all-reduce" or not d.op:
            return
        by_shape: dict[str, list[MeasuredCollective]] = defaultdict(list)
        for m in self.elems[(d.op, d.kind)]:
            if m.backward:
                by_shape[m.shape].append(m)
        extra = 0.0
        for ms in by_shape.values():
            if len(ms) < 2 or len({m.group_size for m in ms}) < 2:
                continue
            group = _numel(m.group_size for m in ms)
            extra += sum(m.sent_bytes for m in ms) - sent_bytes(
                "all-reduce", ms[0].buffer_bytes, group
            )
        if extra > 0:
            d.take(
                extra,
                "gradient-in-steps",
                f"{extra:.0f} B above one ring all-reduce of the same buffers",
            )

    def gradient_steps_gather(self, d: _Delta) -> None:
        """An all-gather closing a stepwise all-reduce of an activation gradient (`add_any`)."""
        if d.kind != "all-gather" or not d.op:
            return
        op = self.graph.op(d.op)
        shapes = {self.graph.tensors[t].shape for t in op.inputs}
        ms = [
            m
            for m in self.elems[(d.op, d.kind)]
            if m.backward and "add_any" in m.op_name and _dims(m.shape)[1] in shapes
        ]
        stepped = any(
            len(
                {
                    m.group_size
                    for m in self.elems[(self.graph.ops[i].name, "all-reduce")]
                    if m.backward
                }
            )
            > 1
            for t in op.inputs
            for i, _ in self.graph.consumers.get(t, ())
        )
        if ms and stepped:
            d.take(
                sum(m.sent_bytes for m in ms),
                "gradient-in-steps",
                "all-gather after sub-group all-reduces of an activation gradient",
            )

    def _param_shaped(self, op: str, shape: str) -> bool:
        """Is `shape` (a piece of) a parameter of `op` rather than one of its activations?"""
        _, dims = _dims(shape)
        o = self.graph.op(op)
        if any(
            self.graph.tensors[t].shape == dims
            for t in (*o.inputs, *o.outputs)
            if self.graph.tensors[t].role is not Role.PARAMETER
        ):
            return False
        for p in self.params_of(op):
            ps = self.graph.tensors[p].shape
            if len(ps) == len(dims) and all(
                a and b % a == 0 for a, b in zip(dims, ps, strict=True)
            ):
                return True
        return False

    def weight_regather(self, d: _Delta) -> None:
        if d.kind != "all-gather" or not d.op:
            return
        ms = [
            m
            for m in self.elems[(d.op, d.kind)]
            if m.backward and self._param_shaped(d.op, m.shape)
        ]
        d.take(
            sum(m.sent_bytes for m in ms),
            "weight-regather",
            f"{len(ms)} parameter gather(s) in the backward pass",
        )

    def _round_permuted(self, op: str) -> bool:
        for name in (op, *self.neighbours(op, 1)):
            for e in self.pred[name].edges:
                src = {d: {r for r, s in enumerate(e.src) if s == d} for d in set(e.src) if d >= 0}
                dst = {d: {r for r, s in enumerate(e.dst) if s == d} for d in set(e.dst) if d >= 0}
                if any(d in dst and src[d] != dst[d] for d in src):
                    return True
        return False

    def round_order(self, d: _Delta, late: bool = False) -> None:
        """collective-permute (early) or backward all-gather (late, after neighbour moves) next
        to an edge that splits the same tensor dim in other rounds."""
        if not d.op or d.kind != ("all-gather" if late else "collective-permute"):
            return
        if self._round_permuted(d.op):
            ms = self.elems[(d.op, d.kind)]
            if d.kind == "collective-permute":
                d.take(sum(m.sent_bytes for m in ms), "round-order")
            else:
                d.take(
                    sum(m.sent_bytes for m in ms if m.backward),
                    "round-order",
                    "gradient gathered across permuted rounds",
                )

    def input_resharding(self, d: _Delta) -> None:
        if not d.op:
            return
        ms = self.elems[(d.op, d.kind)]
        ints = [m for m in ms if _dims(m.shape)[0][:1] in ("s", "u")]
        d.take(
            sum(m.sent_bytes for m in ints), "input-resharding", "integer index buffers exchanged"
        )
        if d.done():
            return
        op = self.graph.op(d.op)
        placed = self.plan.input_layouts()
        from shardplan.sharding import operand_layout

        for i, t in enumerate(op.inputs):
            tensor = self.graph.tensors[t]
            if tensor.role not in (Role.INPUT, Role.CONSTANT) or t not in placed:
                continue
            if placed[t] == operand_layout(op, self.plan.strategies[op.name], i):
                continue
            same = [
                m
                for m in ms
                if len(_dims(m.shape)[1]) == len(tensor.shape)
                and all(
                    a and b % a == 0 for a, b in zip(_dims(m.shape)[1], tensor.shape, strict=True)
                )
            ]
            d.take(
                sum(m.sent_bytes for m in same),
                "input-resharding",
                f"input {t!r} placed as {placed[t]} is read in another layout",
            )

    def _a2a_tensors(self, op_name: str) -> list[tuple[int, ...]]:
        """Shapes of tensors an all-to-all edge at `op_name` or at a reader of its outputs moves."""
        op = self.graph.op(op_name)
        names = [op_name] + [
            self.graph.ops[i].name for t in op.outputs for i, _ in self.graph.consumers.get(t, ())
        ]
        return [
            self.graph.tensors[e.tensor].shape
            for n in names
            for e in self.pred[n].edges
            if e.terms.all_to_all_bytes > 0
        ]

    def a2a_as_gather(self, d: _Delta) -> None:
        if not d.op:
            return
        shapes = self._a2a_tensors(d.op)
        if not shapes:
            return

        def piece(m: MeasuredCollective) -> bool:
            dims = _dims(m.shape)[1]
            return any(
                len(dims) == len(s) and all(a and b % a == 0 for a, b in zip(dims, s, strict=True))
                for s in shapes
            )

        if d.kind == "all-gather" and d.sign > 0:
            d.take(
                sum(m.sent_bytes for m in self.elems[(d.op, d.kind)] if piece(m)),
                "all-gather-for-all-to-all",
            )
        if d.kind == "all-to-all" and d.sign < 0:
            if any(piece(m) for m in self.elems[(d.op, "all-gather")]):
                d.take(d.remaining, "all-gather-for-all-to-all")

    def gather_shortfall(self, d: _Delta) -> None:
        if d.kind != "all-gather" or not d.op:
            return
        budget = sum(m.sent_bytes for m in self.elems[(d.op, d.kind)] if m.backward)
        op = self.graph.op(d.op)
        candidates = [(d.op, e) for e in self.pred[d.op].edges]
        # a gradient is gathered at its producer's constraint or where readers add it up
        for t in (*op.outputs, *op.inputs):
            for index, _ in self.graph.consumers.get(t, ()):
                consumer = self.graph.ops[index].name
                candidates += [(consumer, e) for e in self.pred[consumer].edges if e.tensor == t]
        for name, e in dict.fromkeys(candidates):
            key = (name, e.tensor, e.position)
            left = min(e.gather_shortfall - self.used_shortfall[key], budget)
            if left > 0:
                budget -= left
                got = d.take(
                    left, "gradient-gather-volume", f"gradient of {e.tensor!r} gathered whole"
                )
                self.used_shortfall[key] += got
            if d.done():
                return

    def contract_split_input(self, d: _Delta) -> None:
        if d.kind != "all-reduce" or not d.op:
            return
        op = self.graph.op(d.op)
        split_reduced = False
        for e in self.pred[d.op].edges:
            dims = op.signature.inputs[e.position]
            for s_, t_ in zip(e.src, e.dst, strict=True):
                if (
                    0 <= s_ < len(dims)
                    and t_ != s_
                    and dims[s_]
                    and op.signature.loop_dim(dims[s_][0]).kind.name == "REDUCE"
                ):
                    split_reduced = True
        if split_reduced:
            fwd = sum(m.sent_bytes for m in self.elems[(d.op, d.kind)] if not m.backward)
            d.take(fwd, "contract-split-input", "partial products all-reduced")

    # -- deficit rules --------------------------------------------------------------------------
    def split_normalised_axis(self, d: _Delta) -> None:
        """The input arrives split on the FROZEN (normalised) axis: XLA normalises it in that
        layout (statistics all-reduced) and reshards the result, not the input."""
        if not d.op:
            return
        op = self.graph.op(d.op)
        if op.kind not in NORM_KINDS or op.kind == "batch_norm":
            return
        amount = 0.0
        for e in self.pred[d.op].edges:
            dims = op.signature.inputs[e.position]
            for s in e.src:
                if (
                    0 <= s < len(dims)
                    and dims[s]
                    and op.signature.loop_dim(dims[s][0]).kind.name == "FROZEN"
                ):
                    amount += kind_bytes(e.terms, d.kind) if d.sign < 0 else float("inf")
                    break
        if d.sign > 0 and d.kind in ("all-gather", "all-to-all", "collective-permute"):
            amount = min(amount, sum(m.sent_bytes for m in self.elems[(d.op, d.kind)]))
        elif d.sign > 0:
            return
        d.take(amount, "split-normalised-axis", "normalised in the arriving split layout")

    def merged_partial_sums(self, d: _Delta) -> None:
        if not d.op:
            return
        if d.kind == "all-reduce" and self.merged.get(d.op):
            d.take(
                d.remaining,
                "merged-partial-sums",
                "reduced together with another operator's partial sums",
            )
        if d.kind != "all-gather" or not self.plan.options.train:
            return
        from shardplan.cost.terms import reduces

        for e in self.pred[d.op].edges:  # a split gradient added into another's partial sum
            if not any(s < 0 <= t for s, t in zip(e.src, e.dst, strict=True)):
                continue
            if self._gathered_whole(e.tensor):
                continue
            for index, pos in self.graph.consumers.get(e.tensor, ()):
                other = self.graph.ops[index]
                strat = self.plan.strategies[other.name]
                if other.name != d.op and any(
                    reduces(other, c, other.signature.inputs[pos], False, True, True) for c in strat
                ):
                    d.take(
                        e.terms.all_gather_bytes,
                        "merged-partial-sums",
                        f"gradient of {e.tensor!r} folded into {other.name!r}'s reduction",
                    )
                    break

    def _gathered_whole(self, tensor: str) -> bool:
        """Is a backward all-gather of `tensor`'s full shape measured at its producer/readers?"""
        shape = self.graph.tensors[tensor].shape
        ops = [self.graph.ops[i].name for i, _ in self.graph.consumers.get(tensor, ())]
        if tensor in self.graph.producer:
            ops.append(self.graph.ops[self.graph.producer[tensor]].name)
        return any(
            m.backward and _dims(m.shape)[1] == tuple(shape)
            for o in ops
            for m in self.elems[(o, "all-gather")]
        )

    def partial_gradient_slice(self, d: _Delta) -> None:
        if d.kind != "all-reduce" or not d.op:
            return
        from shardplan.sharding import local_shape

        rounds = self.plan.mesh.rounds
        sizes = set()
        for e in self.pred[d.op].edges:
            sliced = [
                r for r, (s, t) in enumerate(zip(e.src, e.dst, strict=True)) if s >= 0 and t < 0
            ]
            if sliced:
                full = _numel(local_shape(self.graph.tensors[e.tensor].shape, e.dst, rounds))
                sizes.add(full // _numel(rounds[r].q for r in sliced))
        ms = [
            m
            for m in self.elems[(d.op, d.kind)]
            if m.backward and _numel(_dims(m.shape)[1]) in sizes
        ]
        if ms:
            d.take(
                d.remaining,
                "partial-gradient-slice",
                "only the producer's slice of the gradient is all-reduced",
            )

    # -- deficit rules ----

    def replicated_compute(self, d: _Delta) -> None:
        """A deficit at an operator XLA computed whole (its per-device result is global)."""
        if not d.op:
            return
        from shardplan.sharding import local_shape, operand_layout

        op = self.graph.op(d.op)
        out = self.graph.tensors[op.outputs[0]]
        layout = operand_layout(op, self.plan.strategies[d.op], 0, True)
        planned = _numel(local_shape(out.shape, layout, self.plan.mesh.rounds))
        if planned < out.numel and self.sizes.get(d.op, 0) >= out.numel:
            d.take(
                d.remaining,
                "xla-replicated-compute",
                f"computed on the whole {out.shape} instead of a {planned}-element part",
            )

    # -- the whole pass -------------------------------------------------------------------------
    def run(
        self,
        keys: Sequence[tuple[str, str]],
        predicted: Mapping[tuple[str, str], float],
        measured: Mapping[tuple[str, str], float],
    ) -> list[_Delta]:
        deltas = []
        for key in keys:
            p, m = predicted.get(key, 0.0), measured.get(key, 0.0)
            if _significant(p, m):
                deltas.append(_Delta(key[0], key[1], p, m, abs(m - p)))
        for d in deltas:
            if not d.op:
                d.take(d.remaining, "outside-graph")
                continue
            rules = (
                (
                    self.statistics,
                    self.shared_gradient,
                    self.gradient_steps,
                    self.weight_regather,
                    self.round_order,
                    self.input_resharding,
                    self.gather_shortfall,
                    self.contract_split_input,
                    self.split_normalised_axis,
                )
                if d.sign > 0
                else (
                    self.split_normalised_axis,
                    self.merged_partial_sums,
                    self.partial_gradient_slice,
                    self.replicated_compute,
                )
            )
            for rule in rules:
                if d.done():
                    break
                rule(d)
        by_op: dict[str, list[_Delta]] = defaultdict(list)
        for d in deltas:
            by_op[d.op].append(d)
        self._sharded_parameters(by_op)
        self._neighbour_moves(deltas)
        for d in deltas:  # rules that are weaker evidence than a neighbour's prediction
            if not d.done():
                self.a2a_as_gather(d)
            if d.sign > 0 and not d.done():
                self.gradient_steps_gather(d)
            if d.sign > 0 and not d.done():
                self.round_order(d, late=True)
        self._partitioning(by_op)
        return deltas

    def _sharded_parameters(self, by_op: Mapping[str, list[_Delta]]) -> None:
        from shardplan.sharding import operand_layout

        for op_name, ds in by_op.items():
            if not op_name or not any(
                d.kind == "all-gather" and d.sign < 0 and not d.done() for d in ds
            ):
                continue
            op = self.graph.op(op_name)
            stored = [
                t
                for i, t in enumerate(op.inputs)
                if t in self.plan.param_layouts
                and tuple(self.plan.param_layouts[t])
                != operand_layout(op, self.plan.strategies[op_name], i)
            ]
            if stored:
                for d in ds:
                    if not d.done():
                        d.take(
                            d.remaining, "sharded-parameter-compute", f"{stored[0]!r} stays split"
                        )

    def _neighbour_moves(self, deltas: Sequence[_Delta]) -> None:
        """Pair an excess with a deficit of the same kind at a neighbour (nearest first)."""
        open_ = {(d.op, d.kind): d for d in deltas if d.op}
        for hops in (1, 2):
            for d in deltas:
                if d.sign < 0 or d.done() or not d.op:
                    continue
                near = self.neighbours(d.op, hops)
                if hops > 1:
                    near = [n for n in near if n not in set(self.neighbours(d.op, hops - 1))]
                for other in near:
                    o = open_.get((other, d.kind))
                    if o is None or o.sign > 0 or o.done():
                        continue
                    amount = min(d.remaining, o.remaining)
                    d.take(amount, "moved-to-neighbour", f"predicted at {other!r}")
                    o.take(amount, "moved-to-neighbour", f"measured at {d.op!r}")
                    if d.done():
                        break

    def _partitioning(self, by_op: Mapping[str, list[_Delta]]) -> None:
        for op_name, ds in by_op.items():
            if not op_name:
                continue
            open_ = [d for d in ds if not d.done()]
            if not open_:
                continue
            strategy = self.plan.strategies[op_name]
            multi = len({c for c in strategy if c is not None}) >= 2
            mixed = any(d.sign > 0 for d in ds) and any(d.sign < 0 for d in ds)
            forward = any(
                not m.backward for d in open_ if d.sign > 0 for m in self.elems[(op_name, d.kind)]
            )
            replicated = all(c is None for c in strategy) and forward
            if multi or mixed or replicated:
                why = (
                    f"cut {tuple(strategy)} along several loop dims"
                    if multi
                    else "other collective kinds than predicted at this operator"
                    if mixed
                    else "XLA partitioned an operator the plan replicates"
                )
                for d in open_:
                    d.take(d.remaining, "xla-partitioning", why)


# -- comparison ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KindComparison:
    """Predicted vs measured bytes per device of one collective kind.

    `causes` lists the causes of the per-operator differences of this kind; `unexplained_bytes`
    sums what no rule accounted for.
    """

    kind: str
    predicted: float
    measured: float
    count: int
    causes: tuple[str, ...] = ()
    unexplained_bytes: float = 0.0

    @property
    def ratio(self) -> float:
        """measured / predicted (1.0 when both are 0, inf when only measured is)."""
        if self.predicted == 0:
            return 1.0 if self.measured == 0 else float("inf")
        return self.measured / self.predicted

    @property
    def within(self) -> bool:
        """Within +-10% (or both below MIN_BYTES)."""
        return abs(self.measured - self.predicted) <= max(
            TOLERANCE * max(self.predicted, self.measured), MIN_BYTES
        )

    @property
    def explained(self) -> bool:
        """Within tolerance, or every significant part of the difference has a known cause."""
        if self.within:
            return True
        return bool(self.causes) and self.unexplained_bytes <= max(
            TOLERANCE * max(self.predicted, self.measured), MIN_BYTES
        )


@dataclass(frozen=True, slots=True)
class Comparison:
    """Measured collectives of a compiled plan compared with the prediction."""

    kinds: tuple[KindComparison, ...]
    differences: tuple[Difference, ...]
    collectives: tuple[MeasuredCollective, ...]
    predicted_total: float
    measured_total: float

    def kind(self, kind: str) -> KindComparison:
        for k in self.kinds:
            if k.kind == kind:
                return k
        raise KeyError(kind)


def compare(plan: Plan, hlo_text: str, train: bool) -> Comparison:
    """Compare the collectives of compiled HLO with `plan`'s predicted bytes (see module doc)."""
    measured = measure(hlo_text, plan.graph)
    pred = predict_by_op(plan, byte_options(plan, train))
    p_bytes: dict[tuple[str, str], float] = defaultdict(float)
    m_bytes: dict[tuple[str, str], float] = defaultdict(float)
    for name, op_pred in pred.items():
        total = op_pred.total
        for kind in KINDS:
            b = kind_bytes(total, kind)
            if b:
                p_bytes[(name, kind)] += b
    for m in measured:
        m_bytes[(m.op, m.kind)] += m.sent_bytes
    order = {name: i for i, name in enumerate(plan.graph.op_index)}
    keys = sorted(
        set(p_bytes) | set(m_bytes), key=lambda k: (order.get(k[0], len(order)), KINDS.index(k[1]))
    )
    deltas = _Explainer(plan, pred, measured, computed_sizes(hlo_text, plan.graph)).run(
        keys, p_bytes, m_bytes
    )
    differences = tuple(
        Difference(
            d.op,
            d.kind,
            d.predicted,
            d.measured,
            tuple(d.causes) + ((UNEXPLAINED,) if not d.done() else ()),
            "; ".join(d.details),
            d.remaining if not d.done() else 0.0,
        )
        for d in deltas
    )
    kinds = []
    for kind in KINDS:
        p = sum(v for (_, k), v in p_bytes.items() if k == kind)
        m = sum(v for (_, k), v in m_bytes.items() if k == kind)
        count = sum(1 for c in measured if c.kind == kind)
        mine = [d for d in differences if d.kind == kind]
        causes = tuple(dict.fromkeys(c for d in mine for c in d.causes if c != UNEXPLAINED))
        unexplained = sum(d.unexplained_bytes for d in mine)
        covered = sum(d.measured - d.predicted for d in mine)
        residual = abs((m - p) - covered)  # differences too small to list, added up
        if residual > max(TOLERANCE * max(p, m), MIN_BYTES):
            unexplained += residual
        kinds.append(KindComparison(kind, p, m, count, causes, unexplained))
    return Comparison(
        tuple(kinds),
        differences,
        tuple(measured),
        sum(k.predicted for k in kinds),
        sum(k.measured for k in kinds),
    )


# -- running -------------------------------------------------------------------------------------


def plan_layouts(plan: Plan) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(parameter homes, input/constant layouts, activation layouts) of `plan`."""
    layouts = plan.tensor_layouts()
    params = {t.name for t in plan.graph.parameters}
    return (
        {k: v for k, v in layouts.items() if k in params},
        plan.input_layouts(),
        {k: v for k, v in layouts.items() if k not in params},
    )


def compile_sharded(
    plan: Plan,
    train: bool,
    params: Mapping[str, Any] | None = None,
    inputs: Mapping[str, Any] | None = None,
) -> tuple[Any, Any, Any, str]:
    """(compiled executable, params, inputs, HLO text) of the plan's sharded program: parameters
    and inputs placed by the plan's layouts, every operator output constrained (training: every
    parameter gradient too). Without params/inputs it compiles from shapes alone."""
    from shardplan.backends import jax as jb

    p_lay, i_lay, a_lay = plan_layouts(plan)
    fn, p, x = jb._jitted(plan.graph, plan.mesh, p_lay, i_lay, a_lay, params, inputs, train)
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


def _reference(plan: Plan, train: bool, params: Any, inputs: Any) -> Any:
    jax = _jax()
    from shardplan.backends import jax as jb

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
    from shardplan.backends import jax as jb

    return jb._require_jax()


def _flatten_results(result: Any, train: bool) -> dict[str, Any]:
    if not train:
        return {f"output {k}": v for k, v in result.items()}
    outs, loss, grads = result
    flat = {f"output {k}": v for k, v in outs.items()}
    flat["loss"] = loss
    flat.update({f"grad {k}": v for k, v in grads.items()})
    return flat


KINK_KINDS = ("relu",)
"""Operators whose derivative jumps at 0: a float32-noise sign flip of one input element
changes the gradient by a finite amount."""


def relu_sign_flips(plan: Plan, params: Mapping[str, Any], inputs: Mapping[str, Any]) -> int:
    """Elements feeding a ReLU whose sign differs between the sharded and the unsharded forward
    pass while they lie within float32 noise of zero (|x| <= 1e-4 max|x| of that tensor).

    One such flip changes the ReLU's derivative from 0 to 1 for that element; after a batch norm
    over few elements this moves the gradients of the layers below by O(1/elements per channel),
    far beyond any floating-point tolerance although both programs are correct.
    """
    jax = _jax()
    from shardplan.backends import jax as jb

    graph = plan.graph
    probes = sorted({op.inputs[0] for op in graph.ops if op.kind in KINK_KINDS})
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


# -- the report ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What `verify_plan` found. `ok` is the numerics verdict; `explained` says whether every
    communication difference beyond +-10% has a documented cause."""

    model: str
    mesh: str
    method: str
    train: bool
    numerics_ok: bool
    max_error: float
    worst_tensor: str
    rtol: float
    atol: float
    tensors: tuple[TensorError, ...]
    kinds: tuple[KindComparison, ...]
    differences: tuple[Difference, ...]
    collectives: tuple[MeasuredCollective, ...]
    predicted_total: float
    measured_total: float
    compile_seconds: float = 0.0
    relu_sign_flips: int | None = None
    """When gradients fail but outputs and loss pass: ReLU inputs within float32 noise of 0 whose
    sign differs between the two programs (see `relu_sign_flips`); None when not examined."""

    @property
    def ok(self) -> bool:
        return self.numerics_ok

    @property
    def numerics_note(self) -> str:
        """Why numerics failed, when a known cause was found ("" otherwise)."""
        if self.numerics_ok or not self.relu_sign_flips:
            return ""
        return (
            f"{self.relu_sign_flips} ReLU input(s) within float32 noise of 0 flip sign between "
            "the sharded and the unsharded forward pass (outputs and loss agree): the gradients "
            "below them differ by a finite amount although both programs are correct"
        )

    @property
    def forward_ok(self) -> bool:
        """Outputs and loss within tolerance (gradients may still differ)."""
        return all(t.ok for t in self.tensors if not t.name.startswith("grad "))

    @property
    def explained(self) -> bool:
        return all(k.explained for k in self.kinds)

    @property
    def tolerance(self) -> str:
        return (
            f"max|sharded - unsharded| <= {self.rtol:g} * max|unsharded| + {self.atol:g} "
            "per tensor (float32)"
        )

    def kind(self, kind: str) -> KindComparison:
        for k in self.kinds:
            if k.kind == kind:
                return k
        raise KeyError(kind)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "mesh": self.mesh,
            "method": self.method,
            "train": self.train,
            "numerics": {
                "ok": self.numerics_ok,
                "max_error": self.max_error,
                "worst_tensor": self.worst_tensor,
                "tolerance": self.tolerance,
                "tensors_checked": len(self.tensors),
                "failures": [t.name for t in self.tensors if not t.ok],
                "relu_sign_flips": self.relu_sign_flips,
                "note": self.numerics_note,
            },
            "communication": {
                "convention": "bytes one device sends (ring algorithms)",
                "predicted_total": self.predicted_total,
                "measured_total": self.measured_total,
                "explained": self.explained,
                "kinds": [
                    {
                        "kind": k.kind,
                        "predicted": k.predicted,
                        "measured": k.measured,
                        "ratio": _json_ratio(k.ratio),
                        "count": k.count,
                        "within_10pct": k.within,
                        "causes": list(k.causes),
                        "unexplained_bytes": k.unexplained_bytes,
                    }
                    for k in self.kinds
                ],
                "differences": [
                    {
                        "op": d.op,
                        "kind": d.kind,
                        "predicted": d.predicted,
                        "measured": d.measured,
                        "causes": list(d.causes),
                        "detail": d.detail,
                        "unexplained_bytes": d.unexplained_bytes,
                    }
                    for d in self.differences
                ],
            },
            "causes": {c: CAUSES[c] for c in self.causes_seen()},
            "compile_seconds": self.compile_seconds,
        }

    def causes_seen(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c for d in self.differences for c in d.causes if c in CAUSES))

    def text(self) -> str:
        """A plain-text summary (the CLI prints a rich table instead)."""
        mode = "training step" if self.train else "forward"
        lines = [
            f"{self.model} on mesh {self.mesh}, {self.method} plan, {mode}",
            f"numerics: {'OK' if self.numerics_ok else 'FAIL'} - max error {self.max_error:.3g} "
            f"({self.worst_tensor}); {len(self.tensors)} tensors, {self.tolerance}"
            + (f"; {self.numerics_note}" if self.numerics_note else ""),
            "communication (bytes sent per device): kind, predicted, measured, ratio",
        ]
        for k in self.kinds:
            if k.predicted or k.measured:
                flag = "" if k.within else "  <- " + (", ".join(k.causes) or "unexplained")
                lines.append(
                    f"  {k.kind:18s} {k.predicted:12.0f} {k.measured:12.0f} "
                    f"{_ratio_text(k.ratio):>7s}{flag}"
                )
        return "\n".join(lines)


def _json_ratio(r: float) -> float | None:
    return None if r == float("inf") else r


def _ratio_text(r: float) -> str:
    return "inf" if r == float("inf") else f"{r:.3f}"


def verify_plan(
    plan: Plan,
    train: bool = True,
    seed: int = 0,
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    check_numerics: bool = True,
) -> VerifyReport:
    """Run `plan` sharded on JAX and unsharded on the same values; compare numerics and bytes.

    Args:
        plan: any Plan (D-Rec, an expert plan, one loaded with Plan.from_json).
        train: verify a training step (loss and every gradient) rather than the forward pass.
        seed: seed of `init_params` / `make_inputs`.
        rtol, atol: tolerance per tensor: max|sharded - unsharded| <= rtol*max|unsharded| + atol.
        check_numerics: False only compiles and compares communication (no execution).

    Raises:
        MissingDependencyError: jax is not installed.
        BackendError: the mesh needs more devices than JAX has, or JAX failed.
        UnsupportedOpError: an operator kind has no JAX kernel.
    """
    import time

    from shardplan.backends import jax as jb

    jb.jax_mesh(plan.mesh)  # BackendError early when there are too few devices
    graph = plan.graph
    params = jb.init_params(graph, seed) if check_numerics else None
    inputs = jb.make_inputs(graph, seed) if check_numerics else None
    start = time.perf_counter()
    compiled, p, x, hlo = compile_sharded(plan, train, params, inputs)
    compile_seconds = time.perf_counter() - start
    errors: list[TensorError] = []
    if check_numerics:
        try:
            got = _flatten_results(compiled(p, x), train)
            want = _flatten_results(_reference(plan, train, params, inputs), train)
        except (ValueError, TypeError, RuntimeError) as e:
            raise BackendError(
                f"JAX failed to run the {plan.method} plan of {graph.name!r} on "
                f"mesh {plan.mesh.text()}: {e}"
            ) from e
        errors = [
            tensor_error(name, got.get(name), value, rtol, atol) for name, value in want.items()
        ]
    worst = max(errors, key=lambda t: t.relative_error, default=None)
    flips = None
    forward_ok = all(t.ok for t in errors if not t.name.startswith("grad "))
    if check_numerics and train and forward_ok and not all(t.ok for t in errors):
        flips = relu_sign_flips(plan, params, inputs)
    cmp = compare(plan, hlo, train)
    return VerifyReport(
        model=graph.name,
        mesh=plan.mesh.text(),
        method=plan.method,
        train=train,
        numerics_ok=all(t.ok for t in errors),
        max_error=worst.relative_error if worst else 0.0,
        worst_tensor=worst.name if worst else "",
        rtol=rtol,
        atol=atol,
        tensors=tuple(errors),
        kinds=cmp.kinds,
        differences=cmp.differences,
        collectives=cmp.collectives,
        predicted_total=cmp.predicted_total,
        measured_total=cmp.measured_total,
        compile_seconds=compile_seconds,
        relu_sign_flips=flips,
    )


__all__ = [
    "CAUSES",
    "DEFAULT_ATOL",
    "DEFAULT_RTOL",
    "KINDS",
    "Comparison",
    "Difference",
    "KindComparison",
    "MeasuredCollective",
    "OpPrediction",
    "TensorError",
    "VerifyReport",
    "compare",
    "measure",
    "predict_by_op",
    "sent_bytes",
    "verify_plan",
]
