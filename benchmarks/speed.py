"""Search time of D-Rec, the exact ILP and the DP baseline, side by side, plus the expert plans.

(a) against graph size: GPT with 1, 2, 4, ..., 96 layers at a small hidden size (256, 4 heads,
    seq 256, batch 8, vocab 1024) on mesh 8;
(b) against devices: a 2-layer GPT of the same shape (batch 64) on flat meshes of 2 .. 1024
    devices.
Every method runs through `shardplan.plan` (the API a user calls); times are the plans'
`search_seconds` (D-Rec, experts) or wall time (ILP, DP, including their cost tables). The ILP and
the DP get a time limit; when one fails or times out at some size it is not run on larger ones,
and the report says where and why. Ratios are method time / D-Rec time on the same problem.

Run: python benchmarks/speed.py [--quick] [--time-limit S]
Writes benchmarks/results/speed.{json,md} (and speed.png when matplotlib is installed).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import RESULTS, loglog_slope, table, write  # noqa: E402

from shardplan import zoo  # noqa: E402
from shardplan.errors import ShardplanError  # noqa: E402
from shardplan.mesh import parse_mesh  # noqa: E402
from shardplan.search import plan  # noqa: E402

METHODS = ("drec", "ilp", "dp", "data-parallel", "megatron", "fsdp")
EXACT = ("ilp", "dp")
SHAPE = {"hidden": 256, "heads": 4, "seq": 256, "vocab": 1024, "max_positions": 256}


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
    return {"ok": True, "seconds": seconds, "status": p.status, "cost": p.cost.total}


def sweep(
    label: str, cases: list[tuple[Any, Any, dict[str, Any]]], time_limit: float
) -> list[dict[str, Any]]:
    """Run every method on every case; an exact method that failed is skipped afterwards."""
    failed_at: dict[str, str] = {}
    rows = []
    for graph, mesh, info in cases:
        row: dict[str, Any] = {**info, "ops": len(graph.ops), "rounds": len(mesh.rounds)}
        for method in METHODS:
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
        for method in METHODS:
            r = row[method]
            r["over_drec"] = r["seconds"] / drec_s if r["ok"] and drec_s else None
            if r["ok"] and row["drec"]["ok"]:
                r["cost_over_drec"] = r["cost"] / row["drec"]["cost"]
        rows.append(row)
        print(
            f"{label}={info[label]}: "
            + ", ".join(
                f"{m} {row[m]['seconds']:.3g}s" if row[m]["ok"] else f"{m} -" for m in METHODS
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


def md_table(label: str, rows: list[dict[str, Any]]) -> str:
    return table(
        [label, "ops", "rounds", *METHODS],
        [[r[label], r["ops"], r["rounds"], *(cell(r[m]) for m in METHODS)] for r in rows],
    )


def stopped(r: dict[str, Any]) -> bool:
    return not r["ok"] or r["status"].startswith("time-limit")


def failures(rows: list[dict[str, Any]], label: str) -> str:
    out = []
    for method in METHODS:
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
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
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
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def source_version() -> str:
    """The commit the run used, "+dirty" when shardplan/ had uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "shardplan"],
            cwd=root,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except OSError:
        return "unknown"
    return head + ("+dirty" if dirty else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer sizes, shorter limits")
    parser.add_argument("--time-limit", type=float, default=None, help="ILP/DP seconds per run")
    parser.add_argument("--name", default="speed", help="results file stem (default speed)")
    args = parser.parse_args()
    time_limit = args.time_limit or (20.0 if args.quick else 120.0)
    layers = [1, 2, 4, 8] if args.quick else [1, 2, 4, 8, 16, 32, 64, 96]
    devices = (
        [2, 4, 8, 16, 32, 64, 256, 1024]
        if args.quick
        else [2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    )
    version = source_version()
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
    command = "python benchmarks/speed.py " + " ".join(sys.argv[1:])
    size_slopes = slopes(size_rows, "ops")
    device_slopes = slopes(device_rows, "rounds")
    md = "# Search time: D-Rec, ILP, DP and the expert plans\n\n"
    md += f"Command: `{command.strip()}` (source {version})\n\n"
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
    if plot(size_rows, device_rows, RESULTS / f"{args.name}.png"):
        md += f"\n![search time]({args.name}.png)\n"
    write(
        args.name,
        {
            "command": command,
            "source": version,
            "quick": args.quick,
            "time_limit": time_limit,
            "sizes": size_rows,
            "devices": device_rows,
            "slope_vs_ops": size_slopes,
            "slope_vs_rounds": device_slopes,
        },
        md,
    )


if __name__ == "__main__":
    main()
