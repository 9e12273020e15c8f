"""Helpers for benchmark scripts: where results go, JSON + markdown writing, log-log slopes,
markdown tables, what a run was (command line, source commit, settings), and matplotlib set-up
and saving."""

from __future__ import annotations

import json
import math
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def write(name: str, data: dict[str, Any], markdown: str) -> None:
    RESULTS.mkdir(exist_ok=True)
    data = {"machine": {"python": platform.python_version(), "cpu": platform.processor()}, **data}
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=1))
    (RESULTS / f"{name}.md").write_text(markdown)
    print(markdown)


def loglog_slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of log(y) against log(x): 1 = linear growth, 0 = constant."""
    lx = [math.log(x) for x in xs]
    ly = [math.log(max(y, 1e-12)) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    num = sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True))
    den = sum((a - mx) ** 2 for a in lx)
    return num / den


def table(headers: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out) + "\n"


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


def run_info(script: str, **settings: Any) -> dict[str, Any]:
    """The head of a results record: the command that ran `script` (pass `__file__`), the source
    commit (`source_version()`, read now: call it before the run) and the run's `settings`."""
    command = " ".join(["python", f"benchmarks/{Path(script).name}", *sys.argv[1:]])
    return {"command": command, "source": source_version(), **settings}


def pyplot() -> Any | None:
    """matplotlib.pyplot on the file-only Agg backend, or None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_figure(fig: Any, path: Path) -> None:
    """Lay out, write (120 dpi) and close a figure made with `pyplot()`."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
