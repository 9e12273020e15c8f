"""Search time of D-Rec, the exact ILP and the DP baseline, side by side, plus the expert plans.

(a) against graph size: GPT with 1, 2, 4, ..., 96 layers at a small hidden size (256, 4 heads,
    seq 256, batch 8, vocab 1024) on mesh 8;
(b) against devices: a 2-layer GPT of the same shape (batch 64) on flat meshes of 2 .. 1024
    devices;
(c) the real GPT-2 xl (zoo "gpt2-xl" at its defaults: 48 layers, hidden 1600, batch 8, seq 1024)
    on mesh 2x8, every method once with the ILP and DP under `--xl-time-limit`; then the ILP and
    DP on the same model cut to 1, 2, 4 layers (quick: 1, 2), to show where they stop finishing.
    A run the limit cut short gives a lower bound on the time ratio (>= limit / D-Rec's time).
Every method runs through `shardplan.plan` (the API a user calls); times are the plans'
`search_seconds` (D-Rec, experts) or wall time (ILP, DP, including their cost tables). The ILP and
the DP get a time limit; when one fails or times out at some size it is not run on larger ones,
and the report says where and why. Ratios are method time / D-Rec time on the same problem.

Run: python benchmarks/speed.py [--quick] [--time-limit S] [--xl-time-limit S] [--name STEM]
Writes benchmarks/results/speed.{json,md} (and speed.png when matplotlib is installed).
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import (  # noqa: E402
    RESULTS,
    loglog_slope,
    pyplot,
    run_info,
    save_figure,
    table,
    write,
)

from shardplan import zoo  # noqa: E402
from shardplan.errors import ShardplanError  # noqa: E402
from shardplan.mesh import parse_mesh  # noqa: E402
from shardplan.search import plan  # noqa: E402

METHODS = ("drec", "ilp", "dp", "data-parallel", "megatron", "fsdp")
EXACT = ("ilp", "dp")
SHAPE = {"hidden": 256, "heads": 4, "seq": 256, "vocab": 1024, "max_positions": 256}
XL_MODEL, XL_MESH = "gpt2-xl", "2x8"
XL_LADDER = {"full": (1, 2, 4), "quick": (1, 2)}
"""Layer counts at which the ILP and DP also run on GPT-2 xl's width, batch and sequence."""


def run(graph: Any, mesh: Any, method: str, time_limit: float) -> dict[str, Any]:
    extra = {"time_limit": time_limit} if method in EXACT else {}
    start = time.perf_counter()
    try:
        p = plan(graph, mesh, method, **extra)
    except ShardplanError as e:
        text = str(e)
        status = text if "did not finish" in text else f"error: {type(e).__name__}: {text}"
        return {"ok": False, "seconds": time.perf_counter() - start, "status": status}
    wall = time.perf_counter() - start
    seconds = wall if method in EXACT else p.search_seconds
    return {
        "ok": True,
        "seconds": seconds,
        "status": p.status,
        "cost": p.cost.total,
        "notes": list(p.notes),
    }


def sweep(
    label: str,
    cases: list[tuple[Any, Any, dict[str, Any]]],
    time_limit: float,
    methods: tuple[str, ...] = METHODS,
) -> list[dict[str, Any]]:
    """Run `methods` (D-Rec first) on every case; an exact method that failed is skipped
    afterwards."""
    failed_at: dict[str, str] = {}
    rows = []
    for graph, mesh, info in cases:
        row: dict[str, Any] = {**info, "ops": len(graph.ops), "rounds": len(mesh.rounds)}
        for method in methods:
            if method in failed_at:
                row[method] = {
                    "ok": False,
                    "seconds": None,
                    "status": f"skipped (failed at {failed_at[method]})",
                }
                continue
            row[method] = run(graph, mesh, method, time_limit)
            if stopped(row[method]):
                failed_at[method] = f"{label}={info[label]}"
        drec_s = row["drec"]["seconds"]
        for method in methods:
            r = row[method]
            r["over_drec"] = r["seconds"] / drec_s if r["ok"] and drec_s else None
            if r["ok"] and row["drec"]["ok"]:
                r["cost_over_drec"] = r["cost"] / row["drec"]["cost"]
        rows.append(row)
        print(
            f"{label}={info[label]}: "
            + ", ".join(
                f"{m} {row[m]['seconds']:.3g}s" if row[m]["ok"] else f"{m} -" for m in methods
            ),
            flush=True,
        )
    return rows


def cell(r: dict[str, Any]) -> str:
    if r["ok"]:
        text = f"{r['seconds']:.3g} s (x{r['over_drec']:.3g})"
        return text if r["status"] in ("ok", "optimal") else f"{text}, {r['status']}"
    if r["status"].startswith("skipped"):
        return "skipped"
    return "did not finish" if "did not finish" in r["status"] else "error"


def md_table(label: str, rows: list[dict[str, Any]], methods: tuple[str, ...] = METHODS) -> str:
    return table(
        [label, "ops", "rounds", *methods],
        [[r[label], r["ops"], r["rounds"], *(cell(r[m]) for m in methods)] for r in rows],
    )


def stopped(r: dict[str, Any]) -> bool:
    return not r["ok"] or r["status"].startswith("time-limit")


def failures(rows: list[dict[str, Any]], label: str, methods: tuple[str, ...] = METHODS) -> str:
    out = []
    for method in methods:
        first = next((r for r in rows if stopped(r[method])), None)
        if first is None:
            continue
        status = first[method]["status"]
        out.append(f"- **{method}** first stopped at {label}={first[label]}: {status}")
    return "\n".join(out) + "\n" if out else "- every method finished every case\n"


def slopes(rows: list[dict[str, Any]], x: str) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for method in METHODS:
        pts = [(r[x], r[method]["seconds"]) for r in rows if r[method]["ok"]]
        out[method] = (
            loglog_slope([p[0] for p in pts], [p[1] for p in pts]) if len(pts) > 2 else None
        )
    return out


def plot(size_rows: list[dict], device_rows: list[dict], path: Path) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, rows, x, title in (
        (axes[0], size_rows, "ops", "against graph size (mesh 8)"),
        (axes[1], device_rows, "devices", "against devices (2-layer GPT)"),
    ):
        for method in METHODS:
            pts = [(r[x], r[method]["seconds"]) for r in rows if r[method]["ok"]]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=method)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(x)
        ax.set_ylabel("search seconds")
        ax.set_title(title)
        ax.grid(True, which="both", linewidth=0.3)
    axes[0].legend(fontsize=8)
    save_figure(fig, path)
    return True


def outcome(r: dict[str, Any]) -> str:
    """How a run ended: "finished", "time-limit" (a plan, but the limit cut the search short),
    "timeout" (no plan within the limit), "refused" (too large to try), "skipped" or "error"."""
    status = r["status"]
    if r["ok"]:
        return "time-limit" if status.startswith("time-limit") else "finished"
    if status.startswith("skipped"):
        return "skipped"
    if "did not finish within" in status:
        return "timeout"
    return "refused" if "did not finish" in status else "error"


def stop_phase(status: str) -> str:
    """Where a run that did not finish stopped, read from its SolverError message."""
    if "HiGHS found no feasible plan" in status:
        return "searching in HiGHS, with no feasible plan found yet"
    timed = re.search(r"did not finish within \S+ s[^(]*\((.*)\)\s*$", status)
    if timed:
        return timed.group(1)
    refused = re.search(r"did not finish(?: on [^:]*)?: ([^;]*)", status)
    return refused.group(1) if refused else status


TABLE_PHASES = ("enumerating strategies", "pricing", "splitting", "building cost tables")
"""Phases (stop_phase prefixes) in which the ILP / DP were still building their cost tables."""


def versus_drec(r: dict[str, Any], drec_s: float | None, time_limit: float) -> str:
    """Time over D-Rec's: a ratio when the method finished; when the limit stopped it, a lower
    bound (the time it ran without finishing, at most the limit, over D-Rec's)."""
    kind = outcome(r)
    if not drec_s or kind not in ("finished", "time-limit", "timeout"):
        return "-"
    if kind == "finished":
        return f"{r['seconds'] / drec_s:.3g}x"
    return f">= {min(r['seconds'], time_limit) / drec_s:.3g}x"


def xl_status(r: dict[str, Any]) -> str:
    kind = outcome(r)
    if kind == "time-limit":
        return f"{r['status']}: best plan found within the limit"
    if kind == "timeout":
        return f"did not finish within the limit ({stop_phase(r['status'])})"
    if kind == "refused":
        return f"refused as too large: {stop_phase(r['status'])}"
    return r["status"]


def xl_verdict(
    method: str,
    r: dict[str, Any],
    drec_s: float | None,
    time_limit: float,
    stopped_at: int | None = None,
) -> str:
    """One sentence on an exact method against D-Rec, honest about what the limit cut short;
    `stopped_at`: the fewest layers at which it already stopped on the same width."""
    kind, ratio, name = outcome(r), versus_drec(r, drec_s, time_limit), method.upper()
    cost = r.get("cost_over_drec")
    if kind == "finished":
        optimum = f"; D-Rec's plan costs {1 / cost:.3g}x its optimum" if cost else ""
        text = f"**{name}: {ratio} D-Rec's time**, {r['status']} in {r['seconds']:.3g} s{optimum}."
    elif kind == "time-limit":
        best = f"; its best plan by then costs {cost:.3g}x D-Rec's" if cost else ""
        text = (
            f"**{name}: {ratio} D-Rec's time** (lower bound): it hit the {time_limit:g} s limit, "
            f"{r['status']}{best}."
        )
    elif kind == "timeout":
        phase = stop_phase(r["status"])
        text = (
            f"**{name}: {ratio} D-Rec's time** (lower bound): it did not finish within "
            f"{time_limit:g} s, stopped while {phase}."
        )
        if phase.startswith(TABLE_PHASES):
            text += " Building its cost tables alone took longer than the limit."
    elif kind == "refused":
        text = (
            f"**{name}** refused the problem as too large after {r['seconds']:.3g} s "
            f"({stop_phase(r['status'])}); no time ratio."
        )
    else:
        text = f"**{name}**: {r['status']}"
    if stopped_at is not None and kind != "finished":
        text += f" On this width it already stops at {stopped_at} layers (below)."
    return "- " + text


def gpt_layers(graph: Any) -> int:
    """Transformer blocks in a zoo GPT graph (its ops are scoped h.0., h.1., ...)."""
    return len({op.name.split(".")[1] for op in graph.ops if op.name.startswith("h.")})


def xl_section(
    time_limit: float,
    ladder: tuple[int, ...],
    ladder_limit: float | None = None,
    model: str = XL_MODEL,
    mesh_text: str = XL_MESH,
    **build_options: Any,
) -> dict[str, Any]:
    """GPT-2 xl on 2x8: every method once, then D-Rec, ILP and DP on the same model cut to
    `ladder` layers under `ladder_limit` (default `time_limit`; an exact method that stopped is
    not run on more layers). `model`,
    `mesh_text` and `build_options` (zoo.build keywords) are there for tests."""
    mesh = parse_mesh(mesh_text)
    graph = zoo.build(model, **build_options)
    batch, seq = graph.tensor("input_ids").shape
    layers = gpt_layers(graph)
    (row,) = sweep("layers", [(graph, mesh, {"layers": layers})], time_limit)
    cases = [(zoo.build(model, layers=n, **build_options), mesh, {"layers": n}) for n in ladder]
    rows = sweep("layers", cases, ladder_limit or time_limit, ("drec", *EXACT))
    drec_s = row["drec"]["seconds"]
    return {
        "model": model,
        "mesh": mesh_text,
        "layers": layers,
        "hidden": graph.tensor("wte").shape[1],
        "batch": batch,
        "seq": seq,
        "time_limit": time_limit,
        "ladder_limit": ladder_limit or time_limit,
        "row": row,
        "vs_drec": {m: versus_drec(row[m], drec_s, time_limit) for m in METHODS},
        "ladder": rows,
    }


def xl_markdown(xl: dict[str, Any]) -> str:
    row, limit = xl["row"], xl["time_limit"]
    drec_s = row["drec"]["seconds"]
    md = f"\n## {xl['model']} on {xl['mesh']}\n\n"
    md += (
        f"Zoo model `{xl['model']}` at its defaults: {xl['layers']} layers, hidden "
        f"{xl['hidden']}, batch {xl['batch']}, seq {xl['seq']} ({row['ops']} ops), mesh "
        f"{xl['mesh']} ({row['rounds']} rounds). ILP and DP limit: {limit:g} s each, including "
        "their cost tables. Time / D-Rec is a ratio when the method finished and a lower bound "
        "(>=) when the limit stopped it; cost / D-Rec is the cost of the plan the method "
        "returned (for an ILP stopped at the limit, its best plan so far).\n\n"
    )
    md += table(
        ["method", "seconds", "status", "time / D-Rec", "cost / D-Rec"],
        [
            [
                m,
                f"{row[m]['seconds']:.3g}",
                xl_status(row[m]),
                xl["vs_drec"][m],
                f"{row[m]['cost_over_drec']:.3g}" if "cost_over_drec" in row[m] else "-",
            ]
            for m in METHODS
        ],
    )
    first_stop = {
        m: next((r["layers"] for r in xl["ladder"] if stopped(r[m])), None) for m in EXACT
    }
    md += "\n"
    md += "\n".join(xl_verdict(m, row[m], drec_s, limit, first_stop[m]) for m in EXACT) + "\n"
    details = [n for m in EXACT for n in row[m].get("notes", [])]
    if details:
        md += "\n" + "\n".join(f"- {n}" for n in details) + "\n"
    ladder = ("drec", *EXACT)
    md += (
        f"\n### Where the exact methods stop finishing (same width, batch and seq, "
        f"{xl.get('ladder_limit', limit):g} s limit; the last row is the full model above, "
        f"{limit:g} s limit)\n\n"
    )
    md += md_table("layers", [*xl["ladder"], row], ladder)
    md += "\n" + failures(xl["ladder"], "layers", ladder)
    return md


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer sizes, shorter limits")
    parser.add_argument("--time-limit", type=float, default=None, help="ILP/DP seconds per run")
    parser.add_argument(
        "--xl-time-limit",
        type=float,
        default=None,
        help="ILP/DP seconds per run in the GPT-2 xl section (default 600, quick 30)",
    )
    parser.add_argument("--name", default="speed", help="results file stem (default speed)")
    args = parser.parse_args()
    time_limit = args.time_limit or (20.0 if args.quick else 120.0)
    xl_time_limit = args.xl_time_limit or (30.0 if args.quick else 600.0)
    layers = [1, 2, 4, 8] if args.quick else [1, 2, 4, 8, 16, 32, 64, 96]
    devices = (
        [2, 4, 8, 16, 32, 64, 256, 1024]
        if args.quick
        else [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    )
    info = run_info(__file__, quick=args.quick, time_limit=time_limit, xl_time_limit=xl_time_limit)
    mesh8 = parse_mesh("8")
    size_cases = [
        (zoo.build("gpt3", layers=n, batch=8, **SHAPE), mesh8, {"layers": n}) for n in layers
    ]
    size_rows = sweep("layers", size_cases, time_limit)
    graph = zoo.build("gpt3", layers=2, batch=64, **SHAPE)
    device_cases = [(graph, parse_mesh(str(n)), {"devices": n}) for n in devices]
    device_rows = sweep("devices", device_cases, time_limit)
    for r in size_rows:
        r["devices"] = 8
    xl = xl_section(xl_time_limit, XL_LADDER["quick" if args.quick else "full"], time_limit)
    size_slopes = slopes(size_rows, "ops")
    device_slopes = slopes(device_rows, "rounds")
    md = "# Search time: D-Rec, ILP, DP and the expert plans\n\n"
    md += f"Command: `{info['command']}` (source {info['source']})\n\n"
    md += (
        f"ILP and DP time limit: {time_limit:g} s per run (their times include building the cost "
        "tables). Cells: seconds (x ratio to D-Rec on the same problem); a method that failed "
        "or hit the time limit is skipped on larger problems. Graph: GPT, hidden 256, 4 heads, "
        "seq 256, vocab 1024.\n\n"
    )
    md += "## Against graph size (mesh 8, batch 8)\n\n" + md_table("layers", size_rows)
    md += "\nLog-log slope of time against ops: " + ", ".join(
        f"{m} {s:.2f}" for m, s in size_slopes.items() if s is not None
    )
    md += " (1.00 = linear).\n\nWhere the exact methods stopped:\n\n" + failures(
        size_rows, "layers"
    )
    md += "\n## Against devices (2 layers, batch 64, flat meshes)\n\n"
    md += md_table("devices", device_rows)
    md += "\nLog-log slope of time against the number of rounds: " + ", ".join(
        f"{m} {s:.2f}" for m, s in device_slopes.items() if s is not None
    )
    md += " (1.00 = proportional to log2(devices)).\n\nWhere the exact methods stopped:\n\n"
    md += failures(device_rows, "devices")
    both = [
        r
        for r in size_rows + device_rows
        if r["ilp"]["ok"] and r["dp"]["ok"] and r["ilp"]["status"] == "optimal"
    ]
    if both:
        worst = max(abs(r["dp"]["cost"] / r["ilp"]["cost"] - 1) for r in both)
        md += (
            f"\nWhere both exact methods finished ({len(both)} runs) their costs agree within "
            f"{worst:.1e} (relative).\n"
        )
    md += xl_markdown(xl)
    if plot(size_rows, device_rows, RESULTS / f"{args.name}.png"):
        md += f"\n![search time]({args.name}.png)\n"
    write(
        args.name,
        {
            **info,
            "sizes": size_rows,
            "devices": device_rows,
            "slope_vs_ops": size_slopes,
            "slope_vs_rounds": device_slopes,
            "xl": xl,
        },
        md,
    )


if __name__ == "__main__":
    main()
