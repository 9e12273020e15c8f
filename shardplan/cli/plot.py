"""Pictures of plans (`plan --plot`, `compare --plot`); matplotlib is imported only here, lazily.

`plot_plan`: left, a strategy map — one row per heavy op (identical layers collapsed as in the
table), one column per round, each cell coloured by the kind of cut (batch, column, row, heads,
spatial, reduce, split, none); right, a stacked bar of the plan's cost (compute, intra-op forward
and backward, gradient sync, redistribution, halo). `plot_compare`: one stacked bar (compute +
communication) per method that produced a plan. The format follows the file suffix (png, svg,
pdf). O(ops * rounds) drawing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardplan.errors import ArgumentError, PlanError
from shardplan.lazy import require

COLOURS = {
    "batch": "#4e79a7",
    "column": "#f28e2b",
    "row": "#e15759",
    "heads": "#76b7b2",
    "spatial": "#59a14f",
    "reduce": "#edc948",
    "split": "#b07aa1",
    "none": "#e8e8e8",
}
MAX_ROWS = 60
"""At most this many rows in the strategy map (the costliest when there are more)."""


def _pyplot() -> Any:
    require("matplotlib", extra="plot", user="--plot").use("Agg")  # files only: no window
    return require("matplotlib.pyplot", extra="plot", user="--plot")


def check_suffix(path: str) -> None:
    if Path(path).suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ArgumentError(f"--plot {path!r}: name a .png, .svg or .pdf file")


def plot_plan(p: Any, path: str) -> None:
    """Strategy map and cost breakdown of plan `p`, written to `path`."""
    from shardplan.cli.render import collapse, cut_kind
    from shardplan.search.drec.flex import is_transparent

    check_suffix(path)
    plt = _pyplot()
    graph, mesh = p.graph, p.mesh
    idx = [i for i, op in enumerate(graph.ops) if not is_transparent(op)] or list(
        range(len(graph.ops))
    )
    rows = collapse(p, idx)
    if len(rows) > MAX_ROWS:
        costs = {c.name: c.total for c in p.cost.ops}
        keep = sorted(rows, key=lambda r: -costs[graph.ops[r.index].name])[:MAX_ROWS]
        rows = sorted(keep, key=lambda r: r.index)
    kinds = list(COLOURS)
    height = max(3.0, 0.22 * len(rows) + 1.5)
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, height), gridspec_kw={"width_ratios": [3, 1]})
    from matplotlib.colors import ListedColormap

    grid = [
        [
            kinds.index(cut_kind(graph, graph.ops[r.index], d))
            for d in p.strategies[graph.ops[r.index].name]
        ]
        for r in rows
    ]
    ax.imshow(
        grid,
        aspect="auto",
        cmap=ListedColormap(list(COLOURS.values())),
        vmin=0,
        vmax=len(kinds) - 1,
        interpolation="nearest",
    )
    labels = [f"{r.name} ×{r.count}" if r.count > 1 else r.name for r in rows]
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.set_xticks(
        range(len(mesh.rounds)),
        [f"r{x.index}\n{x.axis_name} q={x.q}" for x in mesh.rounds],
        fontsize=7,
    )
    for y, r in enumerate(rows):
        for x, d in enumerate(p.strategies[graph.ops[r.index].name]):
            if d is not None:
                ax.text(x, y, d, ha="center", va="center", fontsize=6)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    fig.legend(handles, kinds, loc="lower center", ncol=len(kinds), fontsize=7, frameon=False)
    ax.set_title(
        f"{graph.name} on mesh {mesh.text()} ({p.method}): cut per op and round", fontsize=9
    )
    c = p.cost
    scale, unit = (1e3, "ms") if c.units == "s" else (1.0, c.units)
    parts = [
        ("compute", c.compute),
        ("intra-op fwd", c.comm.intra_fwd),
        ("intra-op bwd", c.comm.intra_bwd),
        ("gradient sync", c.comm.grad_sync),
        ("redistribution", c.comm.redistribution_fwd + c.comm.redistribution_bwd),
        ("halo", c.comm.halo),
    ]
    bottom = 0.0
    for name, value in parts:
        bx.bar([0], [value * scale], bottom=[bottom], label=name)
        bottom += value * scale
    bx.set_xticks([0], ["plan"])
    bx.set_ylabel(f"predicted cost per step ({unit})")
    bx.set_title(f"total {c.total * scale:.3g} {unit}", fontsize=9)
    bx.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), frameon=False)
    fig.tight_layout(rect=(0, 0.6 / height, 1, 1))  # room for the legend below
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_compare(rows: list[dict[str, Any]], title: str, path: str) -> None:
    """One stacked bar (compute, communication) per method that produced a plan."""
    check_suffix(path)
    plt = _pyplot()
    ok = [r for r in rows if r["ok"]]
    if not ok:
        raise PlanError("--plot: no method produced a plan, nothing to draw")
    units = ok[0]["units"]
    scale, unit = (1e3, "ms") if units == "s" else (1.0, units)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(ok) + 2), 4))
    names = [r["method"] for r in ok]
    compute = [r["compute"] * scale for r in ok]
    comm = [r["communication"] * scale for r in ok]
    ax.bar(names, compute, label="compute", color="#4e79a7")
    ax.bar(names, comm, bottom=compute, label="communication", color="#f28e2b")
    for x, r in enumerate(ok):
        ax.text(
            x, (r["total"] * scale) * 1.01, f"{r['cost_over_best']:.2f}×", ha="center", fontsize=8
        )
    ax.set_ylabel(f"predicted cost per step ({unit})")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
