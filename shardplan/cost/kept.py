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
    comes from: result `output` of op `producer` (-1: a graph input); an input kept by its reader
    (`reader` >= 0) falls back to the layout its first keeping reader reads it in (input
    `position`) when it has no producer; `width` 1.0 for a mask's byte per element, None for the
    element width the options price."""

    key: str
    name: str
    producer: int = -1
    output: int = -1
    reader: int = -1
    position: int = -1
    width: float | None = None


def made_at(graph: Graph, name: str) -> tuple[int, int]:
    """(producing op's index, result position) of tensor `name`; (-1, -1) for a graph input."""
    index = graph.producer.get(name, -1)
    return (index, graph.ops[index].outputs.index(name)) if index >= 0 else (-1, -1)


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
                    items[name] = KeptItem(name, name, *made_at(graph, name), index, i)
            continue
        for k, name in enumerate(op.outputs):
            if rule is Saved.OUTPUTS and name not in items:
                items[name] = KeptItem(name, name, index, k)
            elif rule is Saved.MASK and f"{name}:mask" not in items:
                items[f"{name}:mask"] = KeptItem(f"{name}:mask", name, index, k, width=1.0)
    return tuple(items.values())


def saved_bytes(
    graph: Graph,
    strategies: Mapping[str, Strategy],
    rounds: Sequence[Round],
    opts: CostOptions,
    layouts: Sequence[OpLayouts] | None = None,
    size: Callable[[str, Layout], float] | None = None,
    items: Sequence[KeptItem] | None = None,
) -> dict[str, float]:
    """Local bytes of each tensor autograd keeps for the backward (module docstring), in the
    layout its producer leaves it (a graph input: its first keeping reader's). `layouts`: per
    op, its (input, resolved result) layouts when known (`OpPrice`); `size(tensor, layout)`: its
    local bytes at the options' width when memoised (`ScoreCache.local_bytes`); `items`:
    `kept_items(graph)` when kept."""
    if layouts is None:
        layouts = []
        for op in graph.ops:
            ins, outs = operand_layouts(op, tuple(strategies[op.name]))
            layouts.append((ins, tuple(resolved(lay) for lay in outs)))
    saved: dict[str, float] = {}
    for item in kept_items(graph) if items is None else items:
        name = item.name
        made = layouts[item.producer][1][item.output] if item.producer >= 0 else None
        if item.reader < 0:
            layout = made
        else:  # a graph input has no producer: its reader's layout
            layout = made or layouts[item.reader][0][item.position]
        if item.width is None and size is not None:
            saved[item.key] = size(name, layout)
        else:
            t = graph.tensors[name]
            w = opts.element_bytes(t) if item.width is None else item.width
            saved[item.key] = round_numels(t.numel, layout, rounds)[-1] * w
    return saved


__all__ = ["KeptItem", "OpLayouts", "kept_items", "made_at", "saved_bytes"]
