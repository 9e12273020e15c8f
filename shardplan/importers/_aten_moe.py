"""Grouped experts (transformers >= 5, `experts_implementation="grouped_mm"`) -> MoE catalogue ops.

transformers runs a layer's experts as: sort the (token, choice) pairs by expert id, gather the
tokens, `histc` + `cumsum` for per-expert offsets, `grouped_mm` (the custom op
`transformers::grouped_mm_fallback`, or `aten._grouped_mm`) with the stacked [experts, out, in]
gate/up weight, a gate activation, a second `grouped_mm` with the down weight, a scale by the
routing weights, an `index_put` inverse permutation and a sum over the k choices. Translated node
by node this loses the expert dim (the sorted token dim mixes tokens and experts), so the whole
experts module is recognised as one block and emitted as the catalogue's MoE forms
(`shardplan.ir.catalogue_moe`): routing from the router's top-k ids, dispatch into
[experts, groups, capacity, hidden], one `expert_matmul` per projection on the stored weights,
the activation, and the weighted combine. Groups are the sequences of the batch when the block's
tokens come from a [batch, seq, hidden] view (else one group); capacity is
ceil(tokens per group * k / experts) (capacity factor 1: transformers drops no token, so a
plan's expert loads are the balanced ones), which the import notes.

A block is found in one pass over the nodes, O(|nodes|): the module (from `nn_module_stack`) of a
grouped_mm node, its nodes, the tensors it reads from outside (tokens [T, H]; the top-k ids and
weights [T, k]) and its one result read outside. A module that does not fit this shape is left
to the node-by-node rules (and their unknown-op policy).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from shardplan.ir.op import Role

if TYPE_CHECKING:
    from torch.fx import Node

    from shardplan.importers.torch import _Context

GROUPED_MM = frozenset({"transformers.grouped_mm_fallback.default", "aten._grouped_mm.default"})
_ACTIVATIONS = {"aten.gelu.default": "gelu", "aten.relu.default": "relu"}  # else silu


@dataclass(frozen=True)
class ExpertBlock:
    """One grouped-experts module: what it reads and how to emit it (at its result node)."""

    path: str
    result: Node
    tokens: Node
    ids: Node
    weights: Node
    projections: tuple[tuple[Node, bool], ...]  # (stored weight, stored as [e, out, in])
    gated: bool
    activation: str
    groups: int

    def translate(self, ctx: _Context, node: Node) -> Any:
        """The block's result at its result node; None for its other nodes (never read)."""
        return self.emit(ctx) if node is self.result else None

    def emit(self, ctx: _Context) -> str:
        tokens, hidden = ctx.shape(self.tokens)
        k = ctx.shape(self.ids)[1]
        experts = ctx.shape(self.projections[0][0])[0]
        g, t = self.groups, tokens // self.groups
        capacity = max(1, math.ceil(t * k / experts))
        route = {"experts": experts, "capacity": capacity}
        node = self.result

        def op(kind: str, inputs: list[Any], part: str, **attrs: Any) -> str:
            return ctx.emit(kind, inputs, node, part=part, **attrs)

        x = op("reshape", [self.tokens], "tokens", shape=(g, t, hidden))
        ids = op("reshape", [self.ids], "ids", shape=(g, t, k))
        weights = op("reshape", [self.weights], "weights", shape=(g, t, k))
        slots = op("moe_slots", [ids], "slots", **route)
        routes = op("moe_route", [ids], "routes", **route)
        h = ctx.emit(
            "moe_dispatch", [x, slots], node, part="dispatch", approx=True
        )  # counted: capacity factor 1, see the module doc
        (w_up, up_t), (w_down, down_t) = self.projections
        h = op("expert_matmul", [h, w_up], "up", transpose_b=up_t)
        if self.gated:  # [gate; up] halves of the last dim, as transformers' _apply_gate
            half = ctx.shape(w_up)[1 if up_t else 2] // 2
            parts = op("reshape", [h], "halves", shape=(experts, g, capacity, 2, half))
            gate = ctx.emitter.gather(
                parts,
                [ctx.index_constant(node, (), "gate_index")],
                3,
                **ctx.target(node, "gate", None),
                position=0,
                source=str(node.target),
            )
            up = ctx.emitter.gather(
                parts,
                [ctx.index_constant(node, (), "up_index")],
                3,
                **ctx.target(node, "up_half", None),
                position=1,
                source=str(node.target),
            )
            h = op("mul", [op(self.activation, [gate], "act"), up], "glu")
        else:
            h = op(self.activation, [h], "act")
        h = op("expert_matmul", [h, w_down], "down", transpose_b=down_t)
        out = op("moe_combine", [h, routes, weights], "combine")
        ctx.emitter.notes.append(
            f"experts {self.path}: {experts} experts, top-{k}, {g} group(s) of {t} tokens, "
            f"capacity {capacity} per expert and group (factor 1)"
        )
        return ctx.emit("reshape", [out], node, shape=ctx.shape(node))


def _path(node: Node) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    return str(list(stack.values())[-1][0]) if stack else ""


def _inside(node: Node, path: str) -> bool:
    p = _path(node)
    return p == path or p.startswith(path + ".")


def _weight(ctx: _Context, arg: Node) -> tuple[Node, bool] | None:
    """The stored weight a grouped_mm reads: a placeholder, or a [0, 2, 1] permute of one."""
    if arg.op == "placeholder":
        return arg, False
    if str(arg.target) == "aten.permute.default" and list(arg.args[1]) == [0, 2, 1]:
        src = arg.args[0]
        if src.op == "placeholder":
            return src, True
    return None


def _block(ctx: _Context, first: Node) -> ExpertBlock | None:
    path = _path(first)
    if not path:
        return None
    nodes = [n for n in ctx.ep.graph.nodes if n.op == "call_function" and _inside(n, path)]
    members = set(nodes)
    results = [n for n in nodes if any(u not in members for u in n.users)]
    reads = {a for n in nodes for a in n.all_input_nodes if a not in members}
    mms = [n for n in nodes if str(n.target) in GROUPED_MM]
    if len(results) != 1 or len(mms) != 2:
        return None
    params = [
        a
        for a in reads
        if a.op == "placeholder"
        and isinstance(ctx.env.get(a), str)
        and ctx.emitter.role(ctx.env[a]) is Role.PARAMETER
    ]
    projections = [_weight(ctx, mm.args[1]) for mm in mms]
    if any(p is None for p in projections) or {p[0] for p in projections} != set(params):
        return None
    gathered = mms[0].args[0]
    if str(gathered.target) != "aten.index.Tensor" or gathered.args[0] not in reads:
        return None
    tokens = gathered.args[0]
    routing = [a for a in reads if a is not tokens and a not in params]
    ints = [a for a in routing if not a.meta["val"].dtype.is_floating_point]
    floats = [a for a in routing if a.meta["val"].dtype.is_floating_point]
    if len(ints) != 1 or len(floats) != 1 or len(ctx.shape(tokens)) != 2:
        return None
    ids, weights = ints[0], floats[0]
    if ctx.shape(ids) != ctx.shape(weights) or ctx.shape(ids)[0] != ctx.shape(tokens)[0]:
        return None
    if ctx.shape(results[0]) != ctx.shape(tokens):
        return None
    kinds = {str(n.target) for n in nodes}
    gated = any("split" in k or "chunk" in k for k in kinds)
    activation = next((v for k, v in _ACTIVATIONS.items() if k in kinds), "silu")
    return ExpertBlock(
        path,
        results[0],
        tokens,
        ids,
        weights,
        tuple(p for p in projections if p is not None),
        gated,
        activation,
        _groups(ctx, tokens),
    )


def _groups(ctx: _Context, tokens: Node) -> int:
    """Sequences of the batch when the tokens are a [T, H] view of [batch, seq, H]."""
    node = tokens
    for _ in range(4):  # a few views back (the MoE block's and the router's flattening)
        if (
            str(node.target)
            not in ("aten.view.default", "aten.reshape.default", "aten._unsafe_view.default")
            or not node.args
        ):
            break
        node = node.args[0]
        shape = ctx.shape(node)
        if len(shape) == 3:
            return shape[0]
    return 1


def expert_blocks(ctx: _Context) -> dict[Node, ExpertBlock]:
    """Every node of every recognised grouped-experts module -> its block."""
    out: dict[Node, ExpertBlock] = {}
    for node in ctx.ep.graph.nodes:
        if node.op != "call_function" or str(node.target) not in GROUPED_MM or node in out:
            continue
        block = _block(ctx, node)
        if block is None:
            continue
        for n in ctx.ep.graph.nodes:
            if n.op == "call_function" and _inside(n, block.path):
                out[n] = block
    return out
