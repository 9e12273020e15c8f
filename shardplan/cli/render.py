"""How the CLI prints things: units, readable strategy names, the plan table and its summary.

Strategy names come from the op's signature (data), never from its kind or name:
  - a REDUCE loop dim is `row` when it indexes a parameter (Megatron's row-parallel: partial
    sums), else `reduce`; a WINDOW dim is `spatial`;
  - a PARALLEL dim that indexes a parameter is `column`; the leading dim of the first result is
    `batch`; another dim carried by both activation inputs of a parameter-free contraction
    (attention's batched matmuls) is `heads`; anything else is `split`.
Repeated layers are collapsed: an op name's first numeric component (`h.7.mlp.fc`,
`model.layers.7.self_attn.q_proj`) names its layer; consecutive layers whose ops have the same
relative names, kinds and strategies print once as `h.0–h.47 ×48`. O(ops) per table.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from shardplan import units
from shardplan.cost.zero import WHAT
from shardplan.hardware import DEFAULT_MACHINE
from shardplan.ir.dims import DimKind
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role
from shardplan.mesh import Mesh
from shardplan.sharding import Strategy

WIDTH = 100
"""Tables are laid out for this many columns when stdout is not a terminal."""


# -- units (one formatter for every number: shardplan.units) ------------------------------------
fmt_seconds, fmt_count, fmt_bytes = units.seconds, units.count, units.nbytes
fmt_params, fmt_cost, NOISE = units.params, units.cost, units.NOISE


def one_line(text: str, width: int = 60) -> str:
    """The first line of `text`, cut to `width` characters (full text goes to JSON)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


# -- readable strategies ------------------------------------------------------------------------
def cut_kind(graph: Graph, op: Op, dim: str | None) -> str:
    """The readable kind of cutting loop dim `dim` of `op` (see the module docstring)."""
    if dim is None:
        return "none"
    sig = op.signature
    kind = sig.loop_dim(dim).kind
    params = [i for i, t in enumerate(op.inputs) if graph.tensors[t].role is Role.PARAMETER]
    in_param = any(dim in group for i in params for group in sig.inputs[i])
    if kind is DimKind.REDUCE:
        return "row" if in_param else "reduce"
    if kind is DimKind.WINDOW:
        return "spatial"
    if in_param:
        return "column"
    if sig.outputs and sig.outputs[0] and sig.outputs[0][0] and sig.outputs[0][0][0] == dim:
        return "batch"
    acts = [i for i in range(len(op.inputs)) if i not in params]
    contraction = any(d.kind is DimKind.REDUCE for d in sig.loop_dims)
    if not params and contraction and len(acts) >= 2:
        if all(any(dim in g for g in sig.inputs[i]) for i in acts):
            return "heads"
    return "split"


def cut_label(graph: Graph, op: Op, dim: str | None) -> str:
    return "-" if dim is None else f"{cut_kind(graph, op, dim)}({dim})"


def strategy_text(graph: Graph, op: Op, strategy: Strategy, mesh: Mesh) -> str:
    """Per mesh axis (separated by ' | '), the cuts with their multiplicity:
    '- | batch(b)×4 column(n)×2'."""
    parts = []
    for axis in range(len(mesh.shape)):
        ways: dict[str | None, int] = {}
        for rnd, dim in zip(mesh.rounds, strategy, strict=True):
            if rnd.mesh_axis == axis:
                ways[dim] = ways.get(dim, 1) * rnd.q
        cuts = [f"{cut_label(graph, op, d)}×{w}" for d, w in ways.items() if d is not None]
        parts.append(" ".join(cuts) or "-")
    return " | ".join(parts)


def axis_link(mesh: Mesh, axis: int) -> str:
    """The link an axis's collectives run over: 'intra-node 300 GB/s', 'inter-node 25 GB/s', or
    'link 10 GB/s' for a bandwidth the machine preset does not name."""
    machine, bw = mesh.hardware, mesh.bandwidth_bytes_per_s[axis]
    if bw == machine.intra_node_bytes_per_s and bw != machine.inter_node_bytes_per_s:
        return f"intra-node {units.bandwidth(bw)}"
    if bw == machine.inter_node_bytes_per_s and bw != machine.intra_node_bytes_per_s:
        return f"inter-node {units.bandwidth(bw)}"
    return f"link {units.bandwidth(bw)}"


def axis_summary(p: Any) -> list[str]:
    """What the plan is, per mesh axis, with the axis's link: 'gpu axis (8, intra-node 300 GB/s):
    batch ×4 · column ×2'. Each round is named by the cut kind that carries most of the heavy
    ops' FLOPs in it; a size-1 axis is 'unused (size 1)'."""
    from shardplan.search.drec.flex import is_transparent

    graph, mesh = p.graph, p.mesh
    heavy = [op for op in graph.ops if not is_transparent(op)] or list(graph.ops)
    lines = []
    for axis, name in enumerate(mesh.names):
        if mesh.shape[axis] == 1:
            lines.append(f"{name} axis (1): unused (size 1)")
            continue
        ways: dict[str, int] = {}
        for r, rnd in enumerate(mesh.rounds):
            if rnd.mesh_axis != axis:
                continue
            weight: dict[str, float] = {}
            for op in heavy:
                kind = cut_kind(graph, op, p.strategies[op.name][r])
                weight[kind] = weight.get(kind, 0.0) + max(op.flops, 1.0)
            top = max(weight, key=lambda k: (weight[k], k == "none"))
            ways[top] = ways.get(top, 1) * rnd.q
        text = " · ".join(
            "replicated (unused)" + (f" ×{w}" if len(ways) > 1 else "")
            if k == "none"
            else f"{k} ×{w}"
            for k, w in ways.items()
        )
        lines.append(f"{name} axis ({mesh.shape[axis]}, {axis_link(mesh, axis)}): {text}")
    return lines


# -- collapsed layers ---------------------------------------------------------------------------
_LAYER = re.compile(r"^(.*?[._/-])(\d+)([._/-].*)$")


@dataclass(frozen=True, slots=True)
class Row:
    """One printed row: an op, or an op standing for the same op of `count` collapsed layers."""

    name: str
    index: int
    count: int = 1
    layers: str = ""
    first: int = 0


def _layer_key(name: str) -> tuple[str, int, str] | None:
    m = _LAYER.match(name)
    return (m.group(1), int(m.group(2)), m.group(3)) if m else None


def collapse(p: Any, indices: Sequence[int]) -> list[Row]:
    """Rows for the ops `indices` (graph order) with runs of identical consecutive layers folded."""
    ops = p.graph.ops
    blocks: list[tuple[tuple[str, int] | None, list[int]]] = []
    for i in indices:
        key = _layer_key(ops[i].name)
        layer = (key[0], key[1]) if key else None
        if blocks and layer is not None and blocks[-1][0] == layer:
            blocks[-1][1].append(i)
        else:
            blocks.append((layer, [i]))

    def shape(block: tuple[tuple[str, int] | None, list[int]]) -> tuple[Any, ...] | None:
        if block[0] is None:
            return None
        return tuple(
            (_layer_key(ops[i].name)[2], ops[i].kind, tuple(p.strategies[ops[i].name]))  # type: ignore[index]
            for i in block[1]
        )

    rows: list[Row] = []
    k = 0
    while k < len(blocks):
        layer, members = blocks[k]
        run = 1
        sig = shape(blocks[k])
        while sig is not None and k + run < len(blocks):
            nxt = blocks[k + run]
            if nxt[0] is None or nxt[0][0] != layer[0] or nxt[0][1] != layer[1] + run:  # type: ignore[index]
                break
            if shape(nxt) != sig:
                break
            run += 1
        if run == 1:
            rows.extend(Row(ops[i].name, i) for i in members)
        else:
            prefix, first = layer  # type: ignore[misc]
            span = f"{prefix}{first}–{first + run - 1}"
            for i in members:
                suffix = _layer_key(ops[i].name)[2]  # type: ignore[index]
                rows.append(Row(f"{prefix}*{suffix}", i, run, span, first))
        k += run
    return rows


# -- the plan ------------------------------------------------------------------------------------
def make_console() -> Console:
    """Terminal: its own width; file or pipe: `WIDTH` columns, no colour codes."""
    import sys

    return Console() if sys.stdout.isatty() else Console(width=WIDTH, no_color=True)


def plan_title(p: Any) -> str:
    return f"{p.graph.name} on mesh {p.mesh.text()} ({' x '.join(p.mesh.names)}), method {p.method}"


def op_table(p: Any, which: str = "heavy", top: int = 0) -> tuple[Table | None, str]:
    """The per-op table and a caption saying what it shows."""
    from shardplan.search.drec.flex import is_transparent

    graph, mesh = p.graph, p.mesh
    costs = {c.name: c for c in p.cost.ops}
    units = p.cost.units
    if which == "none":
        return None, ""
    if top:
        order = sorted(range(len(graph.ops)), key=lambda i: -costs[graph.ops[i].name].total)
        rows = [Row(graph.ops[i].name, i) for i in order[:top]]
        caption = f"the {len(rows)} costliest of {len(graph.ops)} ops"
    else:
        idx = [i for i, op in enumerate(graph.ops) if which == "all" or not is_transparent(op)]
        rows = collapse(p, idx) if which == "heavy" else [Row(graph.ops[i].name, i) for i in idx]
        caption = (
            f"{len(idx)} heavy ops of {len(graph.ops)}; layout-transparent ops follow their "
            "neighbours (--ops all lists every op, --top N the costliest)"
            if which == "heavy"
            else f"all {len(idx)} ops"
        )
        if any(r.count > 1 for r in rows):
            caption += "; `*` rows stand for identical layers, costs summed over them"
    axes = " | ".join(mesh.names)
    table = Table(
        title=plan_title(p), title_justify="left", caption=caption, caption_justify="left"
    )
    table.add_column("op", overflow="fold", min_width=18)
    table.add_column(f"strategy ({axes})", overflow="fold", min_width=16)
    table.add_column("out", overflow="fold")
    table.add_column("compute", justify="right", no_wrap=True)
    table.add_column("comm", justify="right", no_wrap=True)
    table.add_column("act", justify="right", no_wrap=True)
    last_span = None
    for row in rows:
        op = graph.ops[row.index]
        if row.count > 1:
            members = _members(graph, row)
        else:
            members = [op.name]
        comp = sum(costs[n].compute for n in members)
        comm = sum(costs[n].intra + costs[n].redistribution for n in members)
        act = sum(costs[n].activation_bytes for n in members)
        if row.layers and row.layers != last_span:
            table.add_row(f"[bold]{escape(row.layers)} ×{row.count}[/]", "(same strategy)")
        last_span = row.layers
        out = " ".join(_layout_short(p, op))
        table.add_row(
            escape(display_name(row.name)),
            strategy_text(graph, op, p.strategies[op.name], mesh),
            out,
            fmt_cost(comp, units),
            fmt_cost(comm, units),
            fmt_bytes(act),
        )
    return table, caption


def display_name(name: str) -> str:
    """ONNX scope names as module paths: '/h.0/mlp/Gemm_output_0' -> 'h.0.mlp.Gemm_output_0'."""
    return name.lstrip("/").replace("/", ".") if name.startswith("/") else name


def _members(graph: Graph, row: Row) -> list[str]:
    """The op names a collapsed row stands for."""
    prefix, rest = row.name.split("*", 1)
    names = [f"{prefix}{k}{rest}" for k in range(row.first, row.first + row.count)]
    return [n for n in names if n in graph.op_index]


def _layout_short(p: Any, op: Op) -> list[str]:
    """Each output's layout per round, axes separated by '|': 'R R|S0 S0 S2' (S: split on that
    tensor dim, R: replicated, P: partial sums)."""
    from shardplan.sharding import PARTIAL, REPLICATED, operand_layout

    out = []
    for i in range(len(op.outputs)):
        layout = operand_layout(op, p.strategies[op.name], i, True)
        text = ""
        for r, (rnd, s) in enumerate(zip(p.mesh.rounds, layout, strict=True)):
            if r:
                text += "|" if rnd.mesh_axis != p.mesh.rounds[r - 1].mesh_axis else " "
            text += "R" if s == REPLICATED else "P" if s == PARTIAL else f"S{s}"
        out.append(text)
    return out


def summary_table(p: Any, baseline: Any = None) -> Table:
    """Cost split, memory, search time, status and notes; `baseline`: a plan to show deltas to."""
    c = p.cost
    u = c.units
    t = Table(title="summary", show_header=False, title_justify="left")
    t.add_column("item", no_wrap=True)
    t.add_column("value", overflow="fold")
    total = f"{fmt_cost(c.total, u)} per step"

    def part(value: float) -> str:  # a share of the total: float noise against it prints 0
        return fmt_cost(value, u, c.total)

    if baseline is not None:
        delta = c.total - baseline.cost.total
        total += f" ({'+' if delta >= 0 else '-'}{part(abs(delta))} vs unforced)"
    t.add_row("total cost", total)
    t.add_row("  compute", part(c.compute))
    cm = c.comm
    t.add_row(
        "  communication",
        f"{part(cm.total)}: intra-op fwd {part(cm.intra_fwd)}, "
        f"bwd {part(cm.intra_bwd)}, gradient sync {part(cm.grad_sync)}, "
        f"redistribution {part(cm.redistribution_fwd + cm.redistribution_bwd)}, "
        f"halo {part(cm.halo)}",
    )
    t.add_row(
        "memory / device",
        f"{fmt_bytes(c.memory_per_device)} (params+grads+optimizer "
        f"{fmt_bytes(c.param_memory)}, activations {fmt_bytes(c.activation_memory)})",
    )
    if p.options.zero:
        t.add_row("ZeRO", f"stage {p.options.zero}: {WHAT[p.options.zero]}")
    if p.mesh.machine != DEFAULT_MACHINE:  # the default's links already head the plan
        t.add_row("machine", machine_line(p.mesh))
    hbm = p.mesh.hardware.memory_bytes
    budget = p.problem.budget if p.problem is not None else p.mesh.memory_bytes
    if budget is None and c.memory_per_device > hbm:
        t.add_row(
            "warning",
            f"needs more than the {p.mesh.machine}'s {fmt_bytes(hbm)} per device; pass "
            "--memory to make the search fit it (or fail saying by how much)",
        )
    t.add_row("search time", fmt_seconds(p.search_seconds))
    t.add_row("status", escape(one_line(p.status, 80)))
    for note in p.notes:
        t.add_row("note", escape(note))
    return t


def machine_line(mesh: Any) -> str:
    """The machine a plan is priced for, with each mesh axis's link: 'a100 (8 per node,
    80 GB): node 25 GB/s, gpu 300 GB/s'."""
    hw = mesh.hardware
    links = ", ".join(
        f"{name} {units.bandwidth(bw)}"
        for name, bw in zip(mesh.names, mesh.bandwidth_bytes_per_s, strict=True)
    )
    return f"{hw.name} ({hw.devices_per_node} per node, {fmt_bytes(hw.memory_bytes)}): {links}"


def print_plan(
    console: Console, p: Any, which: str = "heavy", top: int = 0, baseline: Any = None
) -> None:
    """Axis summary, then the op table, then the summary."""
    for line in axis_summary(p):
        console.print(escape(line), highlight=False)
    table, _ = op_table(p, which, top)
    if table is not None:
        console.print(table)
    console.print(summary_table(p, baseline))


def warn_split(p: Any, prefix: str = "", state_sharded: bool = False) -> None:
    """The plan's `split_warning` (nothing split, unused axes, no sharded parameter unless
    `state_sharded`) as one 'warning:' line on stderr, so a pipe of the plan still shows it."""
    from shardplan.search.api import split_warning

    message = split_warning(p, state_sharded)
    if message:
        err = Console(stderr=True)
        if not err.is_terminal:  # a pipe or file: 100 columns, like the tables
            err = Console(stderr=True, width=WIDTH, no_color=True)
        err.print(f"warning: {prefix}{escape(message)}", highlight=False)


def batch_warning(p: Any) -> str | None:
    """Warn when the batch (leading dim of the first graph input) does not divide the devices."""
    import math

    inputs = [t for t in p.graph.tensors.values() if t.role is Role.INPUT and t.shape]
    if not inputs:
        return None
    batch, devices = inputs[0].shape[0], p.mesh.size
    if batch % devices == 0:
        return None
    return (
        f"batch {batch} ({inputs[0].name}) does not divide over {devices} devices: data "
        f"parallelism can use at most {math.gcd(batch, devices)} of them; pick a batch that is a "
        f"multiple of {devices} to use every device"
    )
