"""What autograd keeps for the backward pass: each kept tensor's local bytes under a plan.

`kept_items(graph)` reads once which tensors the ops' backward reads
(`ir.traits.SAVED_FOR_BACKWARD`: an op's inputs but parameters and constants, its results, or a
one-byte mask per result element), each once (its first appearance in op order), and where its
layout comes from; `saved_bytes` then prices them under any plan. The items depend on the graph
alone, so a caller pricing many plans of one graph (the step search's families,
`cost.step.profile_stage`) reads them once.
O(ops + operands) to read, O(kept tensors) per plan.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from shardplan.cost.presets import CostOptions
from shardplan.cost.terms import round_numels
from shardplan.ir.graph import Graph
from shardplan.ir.op import Role
from shardplan.ir.traits import Saved, saved_for_backward
from shardplan.mesh import Round
from shardplan.sharding import Layout, Strategy, operand_layouts, resolved

OpLayouts = tuple[tuple[Layout, ...], tuple[Layout, ...]]
"""An op's (input layouts, resolved result layouts) under its strategy."""


@dataclass(frozen=True, slots=True)
class KeptItem:
    """One kept tensor: its key in `saved_bytes` (a mask's is `name:mask`), and where its layout
    comes from: its producer's result layout, or (`reader` >= 0, a graph input) the layout its
    first keeping reader reads it in (input `position`); `width` 1.0 for a mask's byte per
    element, None for the element width the options price."""

    key: str
    name: str
    reader: int = -1
    position: int = -1
    width: float | None = None


def kept_items(graph: Graph) -> tuple[KeptItem, ...]:
    """`graph`'s kept tensors in op order, each once (module docstring)."""
    items: dict[str, KeptItem] = {}
    for index, op in enumerate(graph.ops):
        rule = saved_for_backward(op.kind)
        if rule is Saved.INPUTS:
            for i, name in enumerate(op.inputs):
                role = graph.tensors[name].role
                # a constant (mask, RoPE table) is a buffer held once, not kept per micro-batch
                if role is not Role.PARAMETER and role is not Role.CONSTANT and name not in items:
                    items[name] = KeptItem(name, name, index, i)
            continue
        for name in op.outputs:
            if rule is Saved.OUTPUTS and name not in items:
                items[name] = KeptItem(name, name)
            elif rule is Saved.MASK and f"{name}:mask" not in items:
                items[f"{name}:mask"] = KeptItem(f"{name}:mask", name, width=1.0)
    return tuple(items.values())


def saved_bytes(
    graph: Graph,
    strategies: Mapping[str, Strategy],
    rounds: Sequence[Round],
    opts: CostOptions,
    layouts: Sequence[OpLayouts] | None = None,
    size: Callable[[str, Layout], float] | None = None,
    out_layout: Mapping[str, Layout] | None = None,
    items: Sequence[KeptItem] | None = None,
) -> dict[str, float]:
    """Local bytes of each tensor autograd keeps for the backward (module docstring), in the
    layout its producer leaves it (a graph input: its first keeping reader's). `layouts`: per
    op, its (input, resolved result) layouts when known (`OpPrice`); `size(tensor, layout)`: its
    local bytes at the options' width when memoised (`ScoreCache.local_bytes`); `out_layout`:
    the results' layouts of `layouts` when already read off; `items`: `kept_items(graph)` when
    kept."""
    if layouts is None:
        layouts = []
        for op in graph.ops:
            ins, outs = operand_layouts(op, tuple(strategies[op.name]))
            layouts.append((ins, tuple(resolved(lay) for lay in outs)))
    if out_layout is None:
        out_layout = output_layouts(graph, layouts)
    saved: dict[str, float] = {}
    for item in kept_items(graph) if items is None else items:
        name = item.name
        if item.reader < 0:
            layout = out_layout[name]
        else:  # a graph input has no producer: its reader's layout
            layout = out_layout.get(name) or layouts[item.reader][0][item.position]
        if item.width is None and size is not None:
            saved[item.key] = size(name, layout)
        else:
            t = graph.tensors[name]
            w = opts.element_bytes(t) if item.width is None else item.width
            saved[item.key] = round_numels(t.numel, layout, rounds)[-1] * w
    return saved


def output_layouts(graph: Graph, layouts: Sequence[OpLayouts]) -> dict[str, Layout]:
    """Each op result's resolved layout (`evaluate.output_layouts`) from the ops' layouts."""
    return {
        name: lay
        for op, (_, outs) in zip(graph.ops, layouts, strict=True)
        for name, lay in zip(op.outputs, outs, strict=True)
    }


__all__ = ["KeptItem", "OpLayouts", "kept_items", "output_layouts", "saved_bytes"]
