"""Where the training-step search spends its time (issue 24's speed targets), by component.

GPT-3 175B on 128x8 (batch 1536) and the 1T GPT on 384x8 (batch 3072), bf16, 80 GB, as in
benchmarks/train_search.py. The search runs once per model with timers wrapped around its
components (module attributes replaced for the run, then restored):
  - D-Rec on a stage segment (`search._drec_planner`), also grouped by the segment's op count;
  - the expert walks (`experts.megatron`, `experts.data_parallel`, `experts.context_parallel`);
  - a chunk's step-model profile (`profiles.profile_stage`) and its plan's plain evaluation
    (`profiles.evaluate_strategies`);
  - the model at a micro-batch size (`sizes.ModelSizes.__call__`: built or derived) and the
    memory-sharpened bound (`_Search.refined_bound`, which may build that model first: such a
    build counts in both rows);
  - the step model's sums per layout and lever (`search.step_cost`).
A component's time excludes its own nested calls (a timer inside a timer of the same name
counts once); different components nest (D-Rec runs inside a profile's strategies), so the
shares need not add up to the whole. The wrappers cost a little time themselves: the total is
the wrapped search's, not train_search.py's. Everything runs in this process: the search's D-Rec
worker (search/step/workers.py), which otherwise plans the stage segments in a second process
while the search prices the other families, is off here, so D-Rec's share is the time the worker
can take off the search.

Run: python benchmarks/step_search_time.py  ->  benchmarks/results/step_search_time.{json,md}
"""

from __future__ import annotations

import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import run_info, table, write  # noqa: E402

import shardplan as sp  # noqa: E402
import shardplan.search.step.profiles as profiles  # noqa: E402
import shardplan.search.step.search as search  # noqa: E402
import shardplan.search.step.sizes as sizes  # noqa: E402
from shardplan import zoo  # noqa: E402

MODELS = [  # (name, layers, hidden, heads, mesh, batch): train_search.py's speed rows
    ("GPT-3 175B", 96, 12288, 96, "128x8", 1536),
    ("GPT 1T", 128, 25600, 160, "384x8", 3072),
]
WRAPPED: list[tuple[Any, str, str]] = [  # (owner, attribute, component)
    (search, "_drec_planner", "D-Rec on a segment"),
    (profiles.experts, "megatron", "Megatron walk"),
    (profiles.experts, "data_parallel", "data-parallel walk"),
    (profiles.experts, "context_parallel", "context-parallel walk"),
    (profiles, "profile_stage", "chunk profile"),
    (profiles, "evaluate_strategies", "plain evaluation"),
    (sizes.ModelSizes, "__call__", "model at a micro-batch size"),
    (search._Search, "refined_bound", "sharpened bound"),
    (search, "step_cost", "step-model sums"),
]


@contextmanager
def timers() -> Iterator[tuple[Counter[str], Counter[str], dict[int, list[float]]]]:
    """Seconds and calls per component, and D-Rec seconds per segment op count, while inside."""
    seconds: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    drec: dict[int, list[float]] = defaultdict(list)
    active: list[str] = []

    def wrap(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            outer = label in active
            active.append(label)
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                spent = time.perf_counter() - start
                active.pop()
                if not outer:
                    seconds[label] += spent
                    calls[label] += 1
                    if label == "D-Rec on a segment":
                        drec[len(args[0].ops)].append(spent)

        return timed

    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in WRAPPED]
    for (owner, name, label), (_, _, fn) in zip(WRAPPED, saved, strict=True):
        setattr(owner, name, wrap(fn, label))
    try:
        yield seconds, calls, drec
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def run(name: str, layers: int, hidden: int, heads: int, mesh: str, batch: int) -> dict:
    def build(b: int) -> Any:
        return zoo.build(
            "gpt3", batch=b, layers=layers, hidden=hidden, heads=heads, vocab=51200, seq=2048
        )

    build(batch)  # warm: imports and caches outside the timed search
    min_ops, search.MIN_OPS = search.MIN_OPS, 10**12  # D-Rec in process, where it is timed
    slow, search.SLOW_LAYOUT = search.SLOW_LAYOUT, float("inf")  # and never started late
    try:
        with timers() as (seconds, calls, drec):
            start = time.perf_counter()
            tp = sp.plan(build, mesh, "step", batch=batch, dtype="bf16", memory=80e9)
            total = time.perf_counter() - start
    finally:
        search.MIN_OPS, search.SLOW_LAYOUT = min_ops, slow
    note = next(n for n in tp.notes if "layouts evaluated" in n)
    evaluated = note.split(" layouts evaluated")[0].rsplit("; ", 1)[-1]
    return {
        "model": name,
        "mesh": mesh,
        "batch": batch,
        "search_s": total,
        "layouts": evaluated,
        "components": {k: {"s": seconds[k], "calls": calls[k]} for k in seconds},
        "drec_by_ops": {str(k): {"calls": len(v), "s": sum(v)} for k, v in sorted(drec.items())},
    }


def markdown(info: dict, rows: list[dict]) -> str:
    md = (
        "# Where the training-step search spends its time\n\n"
        f"Command: `python benchmarks/step_search_time.py` (source {info['source']}); bf16, "
        "80 GB per device. Components time their own calls (not nested calls of the same "
        "component); D-Rec runs inside the profiles' strategies, so shares overlap. All in one "
        "process: the D-Rec worker (search/step/workers.py) is off here.\n"
    )
    for r in rows:
        md += (
            f"\n## {r['model']} on {r['mesh']}, batch {r['batch']}: {r['search_s']:.2f} s "
            f"(wrapped), {r['layouts']} layouts evaluated\n\n"
        )
        parts = sorted(r["components"].items(), key=lambda kv: -kv[1]["s"])
        md += table(
            ["component", "seconds", "share of the search", "calls", "ms per call"],
            [
                [k, f"{v['s']:.2f}", f"{v['s'] / r['search_s']:.0%}", v["calls"],
                 f"{1e3 * v['s'] / max(v['calls'], 1):.2f}"]
                for k, v in parts
            ],
        )  # fmt: skip
        md += "\nD-Rec by the segment's op count:\n\n" + table(
            ["ops", "calls", "seconds", "ms per call"],
            [
                [k, v["calls"], f"{v['s']:.2f}", f"{1e3 * v['s'] / v['calls']:.1f}"]
                for k, v in r["drec_by_ops"].items()
            ],
        )
    return md


def main() -> None:
    info = run_info(__file__)
    rows = [run(*m) for m in MODELS]
    write("step_search_time", {**info, "rows": rows}, markdown(info, rows))


if __name__ == "__main__":
    main()
