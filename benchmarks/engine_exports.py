"""Engine exports at scale: GPT-3 175B on 128x8 (batch 1536), Llama 3 70B on 64x8 (batch 512)
and Llama 3 405B on 2048x8 (batch 2048, as the Llama 3 paper trained it on 16K GPUs).

For each model and each engine (torchtitan, Megatron-LM, DeepSpeed): the search within the
engine's menu (`plan --target X`, search/step/menus.py) and the unrestricted training search
(search/step/search.py), both under 80 GB per device in bf16; the plan written as training JSON and
exported (`shardplan export --to X`); then the engine's own configuration code judges the
export at the plan's world size, and at a wrong world size and batch
(tests/exporters/engine_checks.py: torchtitan's ConfigManager + ParallelDims, megatron-core's
TransformerConfig + parallel_state + micro-batch calculator, DeepSpeedConfig; fake process
group, no devices). Llama 3 70B is the zoo's entry (80 layers, hidden 8192, 64 heads with 8 KV
heads, FFN 28672, vocabulary 128,256, sequence 8192); batch 512 sequences is 4.2M tokens.
Llama 3 405B (126 layers, hidden 16384, 128 heads with 8 KV heads, FFN 53248): no pipeline
degree above 2 that divides the 2048-way outer axis divides its 126 layers, so the menus of
Megatron-LM and torchtitan also try uneven first / last stages, interleaved too
(`uneven.first_last_layers`; megatron-core judges such cuts in tests/exporters/test_engines.py),
and Megatron-LM's ZeRO-3 is Megatron-FSDP (without pipeline stages); the table says which layout
won. A fourth row per model is `--target megatron --overlap-grad-reduce --prefetch`
(`Menu.with_overlaps`), the overlaps Megatron-LM's own Megatron-FSDP example sets, against the
unrestricted search with the same overlaps.

Run: python benchmarks/engine_exports.py [--models gpt3-175b,llama3-70b,llama3-405b]
Writes benchmarks/results/engine_exports.{json,md} and the configs under
benchmarks/results/engine_exports/ (with the Megatron-core kwargs and Megatron-DeepSpeed flags
that go with the Megatron and DeepSpeed configs).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import RESULTS, run_info, table, write  # noqa: E402

from shardplan import zoo  # noqa: E402
from shardplan.cli.engines import export_text  # noqa: E402
from shardplan.cost import CostOptions  # noqa: E402
from shardplan.cost.levers import Levers  # noqa: E402
from shardplan.cost.overlap import MEGATRON_BUCKET_FLOOR  # noqa: E402
from shardplan.exporters import megatron, training_json  # noqa: E402
from shardplan.exporters.deepspeed import deepspeed_config  # noqa: E402
from shardplan.exporters.engine_layout import architecture, read_layout  # noqa: E402
from shardplan.mesh import parse_mesh  # noqa: E402
from shardplan.search.step.engine_menus import Overlaps  # noqa: E402
from shardplan.search.step.menus import MENUS, plan_for_menu  # noqa: E402
from shardplan.search.step.search import plan_training  # noqa: E402

CASES = {
    "gpt3-175b": ("gpt3-175b", {}, "128x8", 1536),
    "llama3-70b": ("llama3-70b", {}, "64x8", 512),
    "llama3-405b": ("llama3-405b", {}, "2048x8", 2048),
}
SUFFIX = {"torchtitan": "toml", "megatron": "sh", "deepspeed": "json"}
# as Megatron-LM's own Megatron-FSDP example runs (examples/megatron_fsdp/
# sbatch_mfsdp_deepseek_v3.sh: --overlap-grad-reduce --overlap-param-gather)
OVERLAP_FLAGS = "--overlap-grad-reduce --prefetch"
OVERLAPS = Overlaps(grad_reduce=True, prefetch=True)
CHECKS = Path(__file__).resolve().parent.parent / "tests" / "exporters" / "engine_checks.py"


def engine_cases(engine: str, tp, arch: dict, path: Path) -> list[dict]:
    """Accept at the plan's world; reject at a wrong world and a wrong batch."""
    lay = read_layout(tp, MENUS[engine])
    world, groups = (
        tp.mesh.size,
        {
            "tensor_model_parallel_size": lay.tensor,
            "pipeline_model_parallel_size": lay.pipeline,
        },
    )
    if engine == "torchtitan":
        ok = {"engine": engine, "world": world, "path": str(path)}
        return [ok, {**ok, "world": world + 8}]
    if engine == "megatron":
        kw = megatron.megatron_kwargs(lay, arch)
        ok = {"engine": engine, "world": world, "repo": str(CHECKS.parents[2]), "kwargs": kw}
        ok |= {"global_batch_size": lay.batch, "micro_batch_size": lay.micro_batch_size}
        return [
            ok,
            {**ok, "world": world + lay.tensor * 3 + 1},
            {**ok, "global_batch_size": lay.batch + lay.data // 2 + 1},
        ]
    cfg = deepspeed_config(lay)
    ok = {"engine": engine, "world": world, "config": cfg, "kwargs": groups}
    return [
        ok,
        {**ok, "world": 2 * world},
        {**ok, "config": {**cfg, "train_batch_size": lay.batch + 1}},
    ]


def run_case(label: str, out_dir: Path) -> dict:
    name, overrides, mesh_text, batch = CASES[label]
    opts = CostOptions.make("shardplan", True, "adam", "bf16")
    mesh, budget = parse_mesh(mesh_text), 80e9

    def build(b: int):
        return zoo.build(name, batch=b, **overrides)

    arch = architecture(name, False, overrides)
    t0 = time.perf_counter()
    free = plan_training(build, batch, mesh, opts, budget)
    free_s = time.perf_counter() - t0
    # the unrestricted search with the same overlaps, for the overlap row
    hidden = Levers(overlap_grad_reduce=True, prefetch=True, bucket_elements=MEGATRON_BUCKET_FLOOR)
    free_hidden = plan_training(build, batch, mesh, opts, budget, overlap=hidden)
    rows = []
    for engine, flags in (*((e, "") for e in SUFFIX), ("megatron", OVERLAP_FLAGS)):
        menu = MENUS[engine].with_overlaps(OVERLAPS) if flags else MENUS[engine]
        stem = f"{label}-overlaps" if flags else label
        t0 = time.perf_counter()
        tp = plan_for_menu(build, batch, mesh, opts, budget, menu)
        seconds = time.perf_counter() - t0
        data = training_json.to_dict(tp)
        data["model_config"] = {"name": name, "small": False, "overrides": overrides}
        tp = training_json.from_json(data)
        text = export_text(data, engine)
        path = out_dir / f"{stem}.{engine}.{SUFFIX[engine]}"
        path.write_text(text)
        extra = {"megatron": "megatron-core", "deepspeed": "megatron-deepspeed"}.get(engine)
        if extra:  # the companions tests/exporters/test_engine_exports_at_scale.py reads
            suffix = "json" if extra == "megatron-core" else "sh"
            (out_dir / f"{stem}.{extra}.{suffix}").write_text(export_text(data, extra))
        with tempfile.TemporaryDirectory() as tmp:
            cases = Path(tmp) / "cases.json"
            cases.write_text(json.dumps(engine_cases(engine, tp, arch, path)))
            done = subprocess.run(
                [sys.executable, str(CHECKS), str(cases)], capture_output=True, text=True
            )
        line = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
        verdicts = (
            json.loads(line[-1][7:]) if line else [{"ok": False, "error": done.stderr[-500:]}]
        )
        versus = free_hidden if flags else free
        assert tp.step is not None and versus.step is not None
        rows.append(
            {
                "model": label,
                "mesh": mesh_text,
                "batch": batch,
                "engine": engine,
                "overlap_flags": flags,
                "note": tp.notes[0],
                "step_s": tp.step.step_s,
                "unrestricted_step_s": versus.step.step_s,
                "ratio": tp.step.step_s / versus.step.step_s,
                "memory_gb": tp.step.memory_per_device / 1e9,
                "search_s": seconds,
                "unrestricted_search_s": free_s,
                "config": str(path.relative_to(RESULTS)),
                "accepted": verdicts[0],
                "rejected": verdicts[1:],
            }
        )
        said = f"{label} {engine}{f' {flags}' if flags else ''}"
        print(f"{said}: {tp.notes[0]}; engine check {verdicts[0].get('ok')}", flush=True)
    return {
        "rows": rows,
        "unrestricted_axes": list(free.axes),
        "unrestricted_notes": list(free.notes),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(CASES))
    args = ap.parse_args()
    info = run_info(__file__, models=args.models)
    out_dir = RESULTS / "engine_exports"
    out_dir.mkdir(parents=True, exist_ok=True)
    results = {label: run_case(label, out_dir) for label in args.models.split(",")}
    rows = [r for v in results.values() for r in v["rows"]]
    md = "# Engine exports at scale\n\n" + table(
        ["model", "mesh", "batch", "engine", "layout", "step (s)", "vs unrestricted", "GB/device",
         "engine accepts", "engine rejects wrong world / batch"],
        [
            [
                r["model"], r["mesh"], r["batch"],
                r["engine"] + (f" {r['overlap_flags']}" if r.get("overlap_flags") else ""),
                r["note"].split(";")[0], f"{r['step_s']:.4g}", f"{r['ratio']:.3f}x",
                f"{r['memory_gb']:.3g}", "yes" if r["accepted"]["ok"] else r["accepted"]["error"],
                " / ".join("yes" if not x["ok"] else "NO" for x in r["rejected"]),
            ]
            for r in rows
        ],
    )  # fmt: skip
    md += (
        "\nLayouts searched within each engine's menu (search/step/menus.py) against the "
        "unrestricted training search, both under 80 GB per device in bf16 on A100 meshes; "
        "exported configs in "
        "`benchmarks/results/engine_exports/`; judged by the engines' own configuration code "
        "(tests/exporters/engine_checks.py). torchtitan's batch check is inline in its Trainer "
        "and is not run (docs/engines.md). `megatron --overlap-grad-reduce --prefetch`: "
        "`--target megatron` with those flags (`Menu.with_overlaps`), as Megatron-LM's own "
        "Megatron-FSDP example runs (--overlap-grad-reduce --overlap-param-gather), against the "
        "unrestricted search with the same overlaps.\n"
    )
    write(
        "engine_exports",
        {**info, "results": results},
        md,
    )


if __name__ == "__main__":
    main()
