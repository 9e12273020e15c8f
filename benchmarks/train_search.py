"""The training-step search at full size, and against the published configurations (issue 24).

Part 1 — speed: GPT-3 175B (96 layers, h 12288, 96 heads) on 128x8 A100-80GB, batch 1536, and a
1T GPT (128 layers, h 25600, 160 heads) on 384x8, batch 3072; sequence 2048, vocabulary 51,200,
bf16, 80 GB per device. Each row times building the model's graph once and the search
(`sp.plan(..., method="step")`) in the same run, and gives their ratio (targets: <= 2 s and
<= 8x the build for 175B, <= 10 s and <= 40x for 1T); and, with no target set, two
mixture-of-experts models at their published sizes (`zoo`: Mixtral 8x7B on 16x8, batch 512;
DeepSeek-V3 on 256x8, batch 4096), whose expert-parallel variants multiply the plans priced.
Part 2 — quality: every published run of benchmarks/published_runs.py (Narayanan et al. SC'21
Table 1, its held-out rows included; Korthikanti et al. MLSys'23) — the published configuration
scored by the Megatron recipe with the paper's knobs (and the paper-era engine: no gradient-sync
or p2p overlap, as the free search prices none), and the search on the same model, mesh, batch
and 80 GB budget; the ratio planner / published is printed whatever it is (target <= 0.91),
with the stage plans the search chose (which stages D-Rec decided). A second search per run may
also choose today's Megatron-core overlap levers (`TODAYS_OVERLAPS`: --overlap-grad-reduce,
--overlap-p2p-communication, --tp-comm-overlap; cost/overlap.py), levers the published runs'
2021-22 Megatron-LM did not have: its ratio is printed beside the engine-neutral one, against the
same published configuration as run. A third search per run is `--target megatron`
(`menus.plan_for_menu`): the fastest layout Megatron-LM can say (tensor x pipeline x v chunks x
data x micro-batch size, uneven first / last stages, sequence and context parallelism,
recomputation, distributed optimizer, Megatron-FSDP)
with what today's Megatron-LM overlaps by default (the interleaved schedule's sends), against
the same published configuration as run; a fourth is the same menu with today's overlap flags
as a run would set them (`--target megatron --overlap-grad-reduce --overlap-p2p
--tp-comm-overlap`, `Menu.with_overlaps`).
Nothing is fitted: both sides are the same step model (shardplan/cost/step.py).

Run: python benchmarks/train_search.py [--quick]  ->  benchmarks/results/train_search.{json,md}
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import run_info, table, write  # noqa: E402
from published_runs import MLSYS23, PAPER_ERA, SC21, SC21_OTHER, builder  # noqa: E402

import shardplan as sp  # noqa: E402
from shardplan import zoo  # noqa: E402
from shardplan.cost import CostOptions  # noqa: E402
from shardplan.mesh import parse_mesh  # noqa: E402
from shardplan.search.step.engine_menus import Overlaps  # noqa: E402
from shardplan.search.step.menus import MENUS, plan_for_menu  # noqa: E402
from shardplan.training import TrainingPlan  # noqa: E402

BUDGET = 80e9
TODAYS_OVERLAPS = dict(overlap_grad_reduce=True, overlap_p2p=True, tp_comm_overlap=True)
TODAYS_FLAGS = Overlaps(grad_reduce=True, p2p=True, tp_comm=True)  # the same, as --target's flags
SPEED = [  # (name, layers, hidden, heads, mesh, batch, target seconds, target ratio to the build)
    ("GPT-3 175B", 96, 12288, 96, "128x8", 1536, 2.0, 8.0),
    ("GPT 1T", 128, 25600, 160, "384x8", 3072, 10.0, 40.0),
]
MOE_SPEED = [  # (name, zoo model at its published size, mesh, batch): no target set, measured
    ("Mixtral 8x7B", "mixtral-8x7b", "16x8", 512),
    ("DeepSeek-V3", "deepseek-v3", "256x8", 4096),
]


def cpu_seconds() -> float:
    """CPU seconds of this process and of its ended children: the search's D-Rec worker
    (search/step/workers.py) is reaped when the search returns, so its CPU counts too."""
    t = os.times()
    return time.process_time() + t.children_user + t.children_system


def gpt(layers: int, hidden: int, heads: int) -> Any:
    return lambda b: zoo.build(
        "gpt3", batch=b, layers=layers, hidden=hidden, heads=heads, vocab=51200, seq=2048
    )


def stage_methods(tp: TrainingPlan) -> str:
    """Which plan each chunk runs ("drec" where D-Rec decided), as runs of equal methods."""
    out: list[list[Any]] = []
    for c, stage in enumerate(tp.stages):
        if out and out[-1][0] == stage.plan.method:
            out[-1][2] = c
        else:
            out.append([stage.plan.method, c, c])
    return ", ".join(f"{m} {a}-{b}" if a != b else f"{m} {a}" for m, a, b in out)


def summary(tp: TrainingPlan) -> dict[str, Any]:
    s = tp.step
    assert s is not None
    return {
        "step_s": s.step_s,
        "step_floor_s": tp.step_floor_s,
        "memory_GB": s.memory_per_device / 1e9,
        "pipeline_stages": tp.pipeline_stages,
        "virtual_stages": tp.virtual_stages,
        "micro_batches": tp.micro_batches,
        "stage_methods": stage_methods(tp),
        "drec_chunks": sum(st.plan.method == "drec" for st in tp.stages),
        "overlaps": ", ".join(
            f for f in ("tp_comm_overlap", "overlap_grad_reduce", "overlap_p2p")
            if any(getattr(st.levers, f) for st in tp.stages)
        ) or "none",
        "chunks": len(tp.stages),
        "notes": list(tp.notes),
    }


def speed_rows() -> list[dict[str, Any]]:
    rows = []
    cases: list[tuple[str, Any, str, int, float | None, float | None]] = [
        (name, gpt(layers, hidden, heads), mesh, batch, target_s, target_ratio)
        for name, layers, hidden, heads, mesh, batch, target_s, target_ratio in SPEED
    ]
    cases += [
        (name, lambda b, model=model: zoo.build(model, batch=b), mesh, batch, None, None)
        for name, model, mesh, batch in MOE_SPEED
    ]
    for name, build, mesh, batch, target_s, target_ratio in cases:
        t0, c0 = time.perf_counter(), cpu_seconds()
        build(batch)
        build_s, build_cpu = time.perf_counter() - t0, cpu_seconds() - c0
        t0, c0 = time.perf_counter(), cpu_seconds()
        tp = sp.plan(build, mesh, "step", batch=batch, dtype="bf16", memory=BUDGET)
        search_s, search_cpu = time.perf_counter() - t0, cpu_seconds() - c0
        rows.append(
            {
                "model": name,
                "mesh": mesh,
                "batch": batch,
                "build_s": build_s,
                "search_s": search_s,
                "ratio": search_s / build_s,
                "build_cpu_s": build_cpu,
                "search_cpu_s": search_cpu,
                "cpu_ratio": search_cpu / build_cpu,
                "target_s": target_s,
                "target_ratio": target_ratio,
                **summary(tp),
            }
        )
        print(f"{name}: search {search_s:.2f} s, build {build_s:.2f} s", file=sys.stderr)
    return rows


def published_rows() -> list[dict[str, Any]]:
    runs = [
        (f"SC'21 {m}", m, mesh, batch, dict(tensor=t, pipeline=p, micro_batch_size=1,
                                            recompute="full"))  # fmt: skip
        for m, mesh, batch, t, p, _ in SC21 + SC21_OTHER
    ]
    for m, mesh, batch, t, p, mbs, v, knobs, _ in MLSYS23:
        label = "sel+SP" if knobs.get("sequence_parallel") else "full"
        knobs = dict(tensor=t, pipeline=p, micro_batch_size=mbs, virtual_stages=v, **knobs)
        runs.append((f"MLSys'23 {m} {label}", m, mesh, batch, knobs))
    rows = []
    for label, model, mesh, batch, knobs in runs:
        build = builder(model)
        # overlaps as the search prices them (none): the same step model on both sides
        published = sp.plan(
            build, mesh, "megatron-recipe", batch=batch, dtype="bf16", **knobs, **PAPER_ERA
        )
        t0 = time.perf_counter()
        tp = sp.plan(build, mesh, "step", batch=batch, dtype="bf16", memory=BUDGET)
        search_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        today = sp.plan(
            build, mesh, "step", batch=batch, dtype="bf16", memory=BUDGET, **TODAYS_OVERLAPS
        )
        today_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        opts = CostOptions.make("shardplan", True, "adam", "bf16")
        target = plan_for_menu(build, batch, parse_mesh(mesh), opts, BUDGET, MENUS["megatron"])
        target_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        own = MENUS["megatron"].with_overlaps(TODAYS_FLAGS)
        target_own = plan_for_menu(build, batch, parse_mesh(mesh), opts, BUDGET, own)
        target_own_s = time.perf_counter() - t0
        assert target.step is not None and target_own.step is not None
        assert published.step is not None and tp.step is not None and today.step is not None
        rows.append(
            {
                "run": label,
                "mesh": mesh,
                "batch": batch,
                "published_knobs": knobs,
                "published_step_s": published.step.step_s,
                "published_memory_GB": published.step.memory_per_device / 1e9,
                "published_fits": published.step.memory_per_device <= BUDGET,
                "search_s": search_s,
                "ratio": tp.step.step_s / published.step.step_s,
                "floor_ratio": tp.step_floor_s / published.step.step_s,
                **summary(tp),
                "today": {**summary(today), "search_s": today_s,
                          "ratio": today.step.step_s / published.step.step_s},
                "target": {**summary(target), "search_s": target_s,
                           "ratio": target.step.step_s / published.step.step_s},
                "target_overlaps": {**summary(target_own), "search_s": target_own_s,
                                    "ratio": target_own.step.step_s / published.step.step_s},
            }
        )  # fmt: skip
        print(f"{label}: {rows[-1]['ratio']:.3f} ({search_s:.1f} s)", file=sys.stderr)
    return rows


def main() -> None:
    quick = "--quick" in sys.argv
    info = run_info(__file__, budget_bytes=BUDGET, dtype="bf16", quick=quick)
    info["load_before"] = os.getloadavg()[0]
    t0 = time.perf_counter()
    speed = [] if quick else speed_rows()
    published = published_rows()
    info["load_after"] = os.getloadavg()[0]
    data = {**info, "seconds": time.perf_counter() - t0, "speed": speed, "published": published}
    write("train_search_quick" if quick else "train_search", data, markdown(info, speed, published))


def markdown(info: dict[str, Any], speed: list[dict[str, Any]], pub: list[dict[str, Any]]) -> str:
    md = "# The training-step search: speed at full size and against published configurations\n\n"
    md += f"Command: `{info['command']}` (source {info['source']}); bf16, 80 GB per device.\n"
    md += (
        "Wall seconds (perf_counter) and, in brackets, CPU seconds of this process and of the"
        " search's D-Rec worker process (search/step/workers.py, for models of 1000 ops or more"
        " or whose first layout took 0.1 s: it plans the stage segments while the search prices"
        " the other families, so the CPU seconds may exceed the wall): on a shared machine other"
        " jobs inflate the wall time, not the CPU time (1-minute load"
        f" average {info['load_before']:.1f} before the run, {info['load_after']:.1f} after).\n\n"
    )
    if speed:
        md += "## Speed (build the graph once vs the whole search, same run)\n\n"
        md += table(
            ["model", "mesh", "batch", "build s (CPU s)", "search s (CPU s)",
             "search / build (CPU)", "targets", "step s", "proven floor s", "S x v, m",
             "memory GB", "stage plans"],  # fmt: skip
            [
                [r["model"], r["mesh"], r["batch"], f"{r['build_s']:.3f} ({r['build_cpu_s']:.3f})",
                 f"{r['search_s']:.2f} ({r['search_cpu_s']:.2f})",
                 f"{r['ratio']:.1f} ({r['cpu_ratio']:.1f})",
                 "none set" if r["target_s"] is None
                 else f"<= {r['target_s']:g} s, <= {r['target_ratio']:g}x",
                 f"{r['step_s']:.4g}", f"{r['step_floor_s']:.4g}",
                 f"{r['pipeline_stages']} x {r['virtual_stages']}, "
                 f"{r['micro_batches']}", f"{r['memory_GB']:.3g}", r["stage_methods"]]  # fmt: skip
                for r in speed
            ],
        )
    md += "\n## Against the published configurations (same step model, 80 GB)\n\n"
    md += (
        "Proven floor: `TrainingPlan.step_floor_s`, the least bound over every layout the search"
        " considered (FLOPs and bytes at the roofline over the pipeline's slots, sharpened by"
        " memory where reached): no plan of those layouts, whatever its per-op cuts and levers,"
        " steps faster. The planner's step lies between it and the published step.\n\n"
    )
    md += table(
        ["run", "mesh", "batch", "published step s", "published GB", "planner step s",
         "planner / published", "proven floor / published", "planner S x v, m", "planner GB",
         "stage plans", "search s"],
        [
            [r["run"], r["mesh"], r["batch"], f"{r['published_step_s']:.4g}",
             f"{r['published_memory_GB']:.3g}", f"{r['step_s']:.4g}", f"{r['ratio']:.3f}",
             f"{r['floor_ratio']:.3f}",
             f"{r['pipeline_stages']} x {r['virtual_stages']}, {r['micro_batches']}",
             f"{r['memory_GB']:.3g}", r["stage_methods"], f"{r['search_s']:.1f}"]
            for r in pub
        ],
    )  # fmt: skip
    md += (
        "\n## The same runs planned with today's Megatron-core overlap levers\n\n"
        "The search may also choose `overlap_grad_reduce`, `overlap_p2p` and `tp_comm_overlap`"
        " (cost/overlap.py: Megatron-core's --overlap-grad-reduce, --overlap-p2p-communication,"
        " --tp-comm-overlap), which the published runs' Megatron-LM of 2021-22 did not have; the"
        " published configuration is scored as run, as above.\n\n"
    )
    md += table(
        ["run", "published step s", "planner step s", "planner / published",
         "planner S x v, m", "planner GB", "stage plans", "levers", "search s"],
        [
            [r["run"], f"{r['published_step_s']:.4g}", f"{r['today']['step_s']:.4g}",
             f"{r['today']['ratio']:.3f}",
             f"{r['today']['pipeline_stages']} x {r['today']['virtual_stages']}, "
             f"{r['today']['micro_batches']}", f"{r['today']['memory_GB']:.3g}",
             r["today"]["stage_methods"], r["today"]["overlaps"], f"{r['today']['search_s']:.1f}"]
            for r in pub
        ],
    )  # fmt: skip
    md += (
        "\n## The same runs planned by `--target megatron`\n\n"
        "The fastest layout Megatron-LM can say (menus.plan_for_menu: one tensor degree, pipeline"
        " stages with v interleaved chunks or uneven first / last stages, sequence parallelism on"
        " or off, context parallelism where a sample per rank cannot fill the data ways, one"
        " recomputation mode and ZeRO-0/1 on every stage, ZeRO-2/3 as Megatron-FSDP without"
        " pipeline stages), priced with today's Megatron-LM default overlap (the"
        " interleaved schedule's sends; gradient sync not overlapped), against the published"
        " configuration as run.\n\n"
    )
    md += _target_table(pub, "target", "--target megatron step s")
    md += (
        "\n## `--target megatron --overlap-grad-reduce --overlap-p2p --tp-comm-overlap`\n\n"
        "The same engine menu with today's overlap flags as a Megatron-LM run would set them"
        " (`Menu.with_overlaps`: --overlap-grad-reduce, the interleaved sends, --tp-comm-overlap"
        " with sequence parallelism), against the published configuration as run.\n\n"
    )
    md += _target_table(pub, "target_overlaps", "target + overlaps step s")
    return md


def _target_table(pub: list[dict[str, Any]], key: str, step_header: str) -> str:
    """The `--target` rows of `key` ("target", "target_overlaps") against the published step."""
    return table(
        ["run", "published step s", step_header, "target / published", "layout", "GB",
         "search s"],
        [
            [r["run"], f"{r['published_step_s']:.4g}", f"{r[key]['step_s']:.4g}",
             f"{r[key]['ratio']:.3f}", r[key]["notes"][0].split(" on every stage")[0],
             f"{r[key]['memory_GB']:.3g}", f"{r[key]['search_s']:.1f}"]
            for r in pub
        ],
    )  # fmt: skip


if __name__ == "__main__":
    main()
