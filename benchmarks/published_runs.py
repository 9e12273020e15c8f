"""Published Megatron-LM runs scored by shardplan's recipe: predicted vs measured, never fitted.

Every row is a configuration a paper ran and timed, scored by `megatron_recipe` with the paper's
knobs (tensor, pipeline, micro-batch size, recomputation, sequence parallelism, interleaving) and
the step model's constants from `shardplan/hardware.py` (A100-80GB datasheet rates, NVLink/IB
link rates, meta-pytorch/autoparallel's 70 % achieved-fraction roofline; docs/cost-model.md).
Nothing here is fitted to these rows: the ratio is printed whatever it is. The step's terms are
printed with it: bubble, p2p, recomputation, gradient sync, the optimizer step; the layer
table's collectives are the forward's plus what the backward leaves exposed (`cost/overlap.py`).

Rows (GPT models, sequence 2048, vocabulary 51,200, bf16 mixed precision, Adam, A100-80GB nodes
of 8; `gpt3` zoo family, which has no dropout):
- Narayanan et al., SC'21, Table 1 (TFLOP/s per GPU counting the recomputation's extra forward):
  1.7B (24 layers, h 2304, 24 heads; 32 GPUs, batch 512, TP 1, PP 1): 137;
  18.4B (40, 6144, 48; 256 GPUs, batch 1024, TP 8, PP 1): 135;
  145.6B (80, 12288, 96; 1536 GPUs, batch 2304, TP 8, PP 8): 148;
  and, as held-out rows (added after the model was built, scored the same way): 3.6B (30, 3072,
  32; 64 GPUs, 512, TP 2): 138; 7.5B (36, 4096, 32; 128, 512, TP 4): 142; 39.1B (48, 8192, 64;
  512, 1536, TP 8 PP 2): 138; 76.1B (60, 10240, 80; 1024, 1792, TP 8 PP 4): 140; 310.1B (96, 16384,
  128; 1920, 2160, TP 8 PP 16): 155; 529.6B (105, 20480, 128; 2520, 2520, PP 35): 163; 1008.0B (128,
  25600, 160; 3072, 3072, PP 64): 163;
  micro-batch size 1, full recomputation, plain 1F1B (the configuration benchmarks/
  megatron_table.py has used; the table does not list the micro-batch size).
- Korthikanti et al., MLSys'23 ("Reducing Activation Recomputation"), s/iteration, full
  recomputation | selective recomputation + sequence parallelism:
  22B (48 layers, h 6144, 64 heads; 8 GPUs, TP 8, PP 1, batch 4, micro-batch 4): 1.42 | 1.10;
  175B (96, 12288, 96; 64 GPUs, TP 8, PP 8 interleaved with 3 chunks per device, batch 64,
  micro-batch 1): 18.13 | 13.75;
  and their Table 4, one 22B layer, forward / backward ms: baseline 7.7 / 11.9, sequence
  parallel 7.2 / 11.8, full recompute 7.7 / 19.5, selective 7.7 / 13.2, selective + SP 7.2 / 13.1
  (a middle layer of the 22B model on its 8 GPUs at micro-batch 4, forward and backward of the
  step model's stage terms; the backward includes the recomputation).

Overlap: these runs used Megatron-LM of 2021-22, which had neither `--overlap-p2p-communication`
(Megatron-LM f9283c5, 2023-05; on by default for the interleaved schedule since 4eeff55, 2023-10)
nor `--overlap-grad-reduce` (2d5220a, 2023-08; off by default): every row is scored with both
off (`PAPER_ERA`). The last table scores the same configurations with today's Megatron-LM
defaults (p2p overlapped when interleaved) and with `--overlap-grad-reduce` as well, and the
sequence-parallel rows with `--tp-comm-overlap` too (`cost/overlap.py`): what the step model
says those would hide, against the same measurements.

Run: python benchmarks/published_runs.py  ->  benchmarks/results/published_runs.{json,md}
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import run_info, table, write  # noqa: E402

from shardplan import zoo  # noqa: E402
from shardplan.cost import CostOptions  # noqa: E402
from shardplan.cost.step import Levers, Recompute, block_starts, profile_stage, stage_cost  # noqa: E402
from shardplan.ir.segments import segments, subgraph  # noqa: E402
from shardplan.mesh import parse_mesh  # noqa: E402
from shardplan.search.experts import megatron  # noqa: E402
from shardplan.search.step.recipes import megatron_recipe  # noqa: E402
from shardplan.search.step.stages import stage_mesh  # noqa: E402
from shardplan.training import TrainingPlan, at_precision  # noqa: E402

BUDGET = 80e9  # A100-80GB
MODELS = {
    "1.7B": dict(layers=24, hidden=2304, heads=24),
    "18.4B": dict(layers=40, hidden=6144, heads=48),
    "145.6B": dict(layers=80, hidden=12288, heads=96),
    "22B": dict(layers=48, hidden=6144, heads=64),
    "175B": dict(layers=96, hidden=12288, heads=96),
    "3.6B": dict(layers=30, hidden=3072, heads=32),
    "7.5B": dict(layers=36, hidden=4096, heads=32),
    "39.1B": dict(layers=48, hidden=8192, heads=64),
    "76.1B": dict(layers=60, hidden=10240, heads=80),
    "310.1B": dict(layers=96, hidden=16384, heads=128),
    "529.6B": dict(layers=105, hidden=20480, heads=128),
    "1008.0B": dict(layers=128, hidden=25600, heads=160),
}
SC21 = [  # (model, mesh, batch, tensor, pipeline, measured TFLOP/s per GPU)
    ("1.7B", "4x8", 512, 1, 1, 137),
    ("18.4B", "32x8", 1024, 8, 1, 135),
    ("145.6B", "192x8", 2304, 8, 8, 148),
]
DEVELOPMENT = {(r[0], r[1]) for r in SC21}
SC21_OTHER = [  # the table's other rows: scored the same way, never looked at while building
    ("3.6B", "8x8", 512, 2, 1, 138),
    ("7.5B", "16x8", 512, 4, 1, 142),
    ("39.1B", "64x8", 1536, 8, 2, 138),
    ("76.1B", "128x8", 1792, 8, 4, 140),
    ("310.1B", "240x8", 2160, 8, 16, 155),
    ("529.6B", "315x8", 2520, 8, 35, 163),
    ("1008.0B", "384x8", 3072, 8, 64, 163),
]
FULL = dict(recompute="full")
SEL_SP = dict(recompute="selective", sequence_parallel=True)
PAPER_ERA = dict(overlap_grad_reduce=False, overlap_p2p=False)  # Megatron-LM 2021-22 (docstring)
TODAY = ({}, dict(overlap_grad_reduce=True))  # today's defaults; and --overlap-grad-reduce
TP_OVERLAP = dict(overlap_grad_reduce=True, tp_comm_overlap=True)  # and --tp-comm-overlap (SP)
MLSYS23 = [  # (model, mesh, batch, tensor, pipeline, micro-batch size, v, knobs, measured s)
    ("22B", "1x8", 4, 8, 1, 4, 1, FULL, 1.42),
    ("22B", "1x8", 4, 8, 1, 4, 1, SEL_SP, 1.10),
    ("175B", "8x8", 64, 8, 8, 1, 3, FULL, 18.13),
    ("175B", "8x8", 64, 8, 8, 1, 3, SEL_SP, 13.75),
]
LAYER = [  # (column, recompute, sequence parallel, measured forward ms, backward ms)
    ("baseline", Recompute.NONE, False, 7.7, 11.9),
    ("sequence parallel", Recompute.NONE, True, 7.2, 11.8),
    ("full recompute", Recompute.FULL, False, 7.7, 19.5),
    ("selective recompute", Recompute.SELECTIVE, False, 7.7, 13.2),
    ("selective + sequence parallel", Recompute.SELECTIVE, True, 7.2, 13.1),
]


def builder(model: str) -> Any:
    m = MODELS[model]
    return lambda b: zoo.build("gpt3", batch=b, vocab=51200, seq=2048, max_positions=2048, **m)


def recipe(
    opts: CostOptions,
    model: str,
    mesh: str,
    batch: int,
    tensor: int,
    pipeline: int,
    micro_batch_size: int,
    virtual: int,
    knobs: dict[str, Any],
) -> TrainingPlan:
    """A published configuration scored by the Megatron recipe."""
    return megatron_recipe(
        builder(model),
        batch,
        parse_mesh(mesh),
        opts,
        tensor,
        pipeline,
        micro_batch_size,
        virtual_stages=virtual,
        **knobs,
    )


def terms(tp: TrainingPlan) -> dict[str, Any]:
    """The step's terms and memory (what the ratio is made of)."""
    s = tp.step
    assert s is not None
    slowest = max(s.stages, key=lambda c: c.fwd_s + c.bwd_s)
    first = s.stages[0]
    return {
        "notes": list(tp.notes),
        "micro_batches": tp.micro_batches,
        "step_s": s.step_s,
        "pipeline_s": s.pipeline_s,
        "bubble_s": s.bubble_s,
        "p2p_s": s.p2p_s,
        "recompute_s": s.recompute_s,
        "grad_sync_s": s.sync_s,
        "optimizer_s": s.optimizer_s,
        "comm_per_micro_batch_s": slowest.comm_s,
        "slot_fwd_s": slowest.fwd_s,
        "slot_bwd_s": slowest.bwd_s,
        "param_GB": first.param_bytes / 1e9,
        "activation_GB": first.activation_bytes / 1e9,
        "in_flight": first.in_flight,
        "memory_GB": s.memory_per_device / 1e9,
        "fits_80GB": s.memory_per_device <= BUDGET,
        "tflops_per_device": s.tflops_per_device,
        "hardware_tflops_per_device": s.hardware_tflops_per_device,
    }


def layer_times(opts: CostOptions) -> list[dict[str, Any]]:
    """One middle 22B layer on its 8 GPUs (TP 8) at micro-batch 4: forward and backward ms."""
    mesh = at_precision(parse_mesh("1x8"), opts)
    graph = builder("22B")(4)
    segs = segments(graph)
    starts = block_starts(graph, segs)
    k = len(starts) // 2
    layer = subgraph(graph, segs[starts[k]].start, segs[starts[k + 1] - 1].stop, "22B.layer")
    smesh = stage_mesh(mesh, 1)
    strategies = megatron(layer, smesh, 8)
    out = []
    for name, rec, sp, fwd_ms, bwd_ms in LAYER:
        prof = profile_stage(layer, smesh, strategies, opts, sequence_parallel=sp)
        c = stage_cost(prof, Levers(rec, 0, sp), 1, 1)
        out.append(
            {
                "column": name,
                "predicted_fwd_ms": c.fwd_s * 1e3,
                "predicted_bwd_ms": c.bwd_s * 1e3,
                "measured_fwd_ms": fwd_ms,
                "measured_bwd_ms": bwd_ms,
                "fwd_ratio": c.fwd_s * 1e3 / fwd_ms,
                "bwd_ratio": c.bwd_s * 1e3 / bwd_ms,
                "comm_ms": c.comm_s * 1e3,
                "recompute_ms": c.recompute_s * 1e3,
            }
        )
    return out


def main() -> None:
    info = run_info(__file__, budget_bytes=BUDGET, dtype="bf16")
    opts = CostOptions.make(dtype="bf16")
    t0 = time.perf_counter()
    sc21, mlsys = [], []
    for model, mesh, batch, t, p, measured in SC21 + SC21_OTHER:
        tp = recipe(opts, model, mesh, batch, t, p, 1, 1, {**FULL, **PAPER_ERA})
        r = terms(tp)
        ratio = r["hardware_tflops_per_device"] / measured
        sc21.append(
            {
                "model": model,
                "row": "development" if (model, mesh) in DEVELOPMENT else "held out",
                "mesh": mesh,
                "batch": batch,
                "tensor": t,
                "pipeline": p,
                "measured_tflops": measured,
                "ratio": ratio,
                **r,
            }
        )
        print(f"SC'21 {model}: {ratio:.3f}", file=sys.stderr)
    for model, mesh, batch, t, p, mbs, v, knobs, measured in MLSYS23:
        tp = recipe(opts, model, mesh, batch, t, p, mbs, v, {**knobs, **PAPER_ERA})
        r = terms(tp)
        ratio = r["step_s"] / measured
        label = "selective + SP" if knobs.get("sequence_parallel") else "full recompute"
        mlsys.append(
            {
                "model": model,
                "column": label,
                "mesh": mesh,
                "batch": batch,
                "tensor": t,
                "pipeline": p,
                "micro_batch_size": mbs,
                "virtual_stages": v,
                "measured_s": measured,
                "ratio": ratio,
                **r,
            }
        )
        print(f"MLSys'23 {model} {label}: {ratio:.3f}", file=sys.stderr)
    layer = layer_times(opts)
    today = overlap_rows(opts)
    elapsed = time.perf_counter() - t0
    write(
        "published_runs",
        {
            **info,
            "seconds": elapsed,
            "sc21": sc21,
            "mlsys23": mlsys,
            "layer_22b": layer,
            "todays_overlap": today,
        },
        markdown(info, sc21, mlsys, layer) + overlap_markdown(today),
    )


def overlap_rows(opts: CostOptions) -> list[dict[str, Any]]:
    """Every run again under today's Megatron-LM overlap defaults, then with
    --overlap-grad-reduce too (and, with sequence parallelism, --tp-comm-overlap): step, what
    each overlap hides, the ratio to the (2021-22) measurement."""
    sc21 = [(f"SC'21 {r[0]}", *r[:5], 1, 1, FULL, r[5], "TFLOP/s") for r in SC21]
    mlsys = [
        (f"MLSys'23 {r[0]} {'sel+SP' if r[7].get('sequence_parallel') else 'full'}", *r, "s")
        for r in MLSYS23
    ]
    out = []
    for label, model, mesh, batch, t, p, mbs, v, knobs, measured, unit in sc21 + mlsys:
        extras = TODAY + ((TP_OVERLAP,) if knobs.get("sequence_parallel") else ())
        for extra in extras:
            tp = recipe(opts, model, mesh, batch, t, p, mbs, v, {**knobs, **extra})
            s = tp.step
            assert s is not None
            out.append(
                {
                    "run": label,
                    "knobs": "today's defaults"
                    + (" + overlap_grad_reduce" if extra else "")
                    + (" + tp_comm_overlap" if extra.get("tp_comm_overlap") else ""),
                    "step_s": s.step_s,
                    "grad_sync_s": s.sync_s,
                    "sync_hidden_s": s.sync_hidden_s,
                    "p2p_s": s.p2p_s,
                    "p2p_hidden_s": s.p2p_hidden_s,
                    "tflops_per_device": s.hardware_tflops_per_device,
                    "measured": f"{measured} {unit}",
                    "ratio": (s.step_s if unit == "s" else s.hardware_tflops_per_device) / measured,
                }
            )
            print(f"today's overlap: {label} {out[-1]['knobs']}: {s.step_s:.4g} s", file=sys.stderr)
    return out


def overlap_markdown(rows: list[dict[str, Any]]) -> str:
    md = "\n## The same runs with today's Megatron-LM overlap (not the published configuration)\n\n"
    md += "Measured without either overlap (Megatron-LM 2021-22); ratio to that measurement "
    md += "(SC'21: TFLOP/s per GPU counting recomputation, as above).\n\n"
    return md + table(
        [
            "run",
            "knobs",
            "step s",
            "grad sync s",
            "sync hidden s",
            "p2p s",
            "p2p hidden s",
            "TFLOP/s per GPU",
            "measured",
            "predicted / measured",
        ],
        [
            [
                r["run"],
                r["knobs"],
                f"{r['step_s']:.4g}",
                f"{r['grad_sync_s']:.4g}",
                f"{r['sync_hidden_s']:.4g}",
                f"{r['p2p_s']:.4g}",
                f"{r['p2p_hidden_s']:.4g}",
                f"{r['tflops_per_device']:.4g}",
                r["measured"],
                f"{r['ratio']:.3f}",
            ]
            for r in rows
        ],
    )


def markdown(
    info: dict[str, Any],
    sc21: list[dict[str, Any]],
    mlsys: list[dict[str, Any]],
    layer: list[dict[str, Any]],
) -> str:
    md = "# Published Megatron-LM runs: the recipe's prediction vs the measurement\n\n"
    md += f"Command: `{info['command']}` (source {info['source']}). Constants: "
    md += "shardplan/hardware.py and docs/cost-model.md; none fitted to these rows.\n\n"
    md += "## Narayanan et al., SC'21, Table 1 (TFLOP/s per GPU, recomputation counted)\n\n"
    md += table(
        [
            "model",
            "row",
            "GPUs (mesh)",
            "batch",
            "TP x PP",
            "predicted",
            "measured",
            "predicted / measured",
            "step s",
            "bubble s",
            "p2p s",
            "recompute s",
            "grad sync s",
            "optimizer s",
            "memory GB",
        ],
        [
            [
                r["model"],
                r["row"],
                r["mesh"],
                r["batch"],
                f"{r['tensor']} x {r['pipeline']}",
                f"{r['hardware_tflops_per_device']:.4g}",
                r["measured_tflops"],
                f"{r['ratio']:.3f}",
                f"{r['step_s']:.4g}",
                f"{r['bubble_s']:.4g}",
                f"{r['p2p_s']:.4g}",
                f"{r['recompute_s']:.4g}",
                f"{r['grad_sync_s']:.4g}",
                f"{r['optimizer_s']:.4g}",
                f"{r['memory_GB']:.3g}",
            ]
            for r in sc21
        ],
    )
    md += "\n## Korthikanti et al., MLSys'23 (seconds per iteration)\n\n"
    md += table(
        [
            "model",
            "column",
            "GPUs (mesh)",
            "TP x PP (v)",
            "micro-batch",
            "predicted s",
            "measured s",
            "predicted / measured",
            "bubble s",
            "p2p s",
            "recompute s",
            "grad sync s",
            "optimizer s",
            "params GB",
            "activations GB (in flight)",
            "memory GB",
            "fits 80 GB",
        ],
        [
            [
                r["model"],
                r["column"],
                r["mesh"],
                f"{r['tensor']} x {r['pipeline']} ({r['virtual_stages']})",
                f"{r['micro_batch_size']} ({r['micro_batches']} per step)",
                f"{r['step_s']:.4g}",
                r["measured_s"],
                f"{r['ratio']:.3f}",
                f"{r['bubble_s']:.4g}",
                f"{r['p2p_s']:.4g}",
                f"{r['recompute_s']:.4g}",
                f"{r['grad_sync_s']:.4g}",
                f"{r['optimizer_s']:.4g}",
                f"{r['param_GB']:.3g}",
                f"{r['activation_GB']:.3g} ({r['in_flight']:.3g})",
                f"{r['memory_GB']:.3g}",
                "yes" if r["fits_80GB"] else "NO",
            ]
            for r in mlsys
        ],
    )
    md += "\n## Korthikanti et al., Table 4: one 22B layer (ms)\n\n"
    md += table(
        [
            "column",
            "forward predicted",
            "measured",
            "ratio",
            "backward predicted",
            "measured",
            "ratio",
            "of which recompute",
            "collectives (fwd + bwd)",
        ],
        [
            [
                r["column"],
                f"{r['predicted_fwd_ms']:.3g}",
                r["measured_fwd_ms"],
                f"{r['fwd_ratio']:.3f}",
                f"{r['predicted_bwd_ms']:.3g}",
                r["measured_bwd_ms"],
                f"{r['bwd_ratio']:.3f}",
                f"{r['recompute_ms']:.3g}",
                f"{r['comm_ms']:.3g}",
            ]
            for r in layer
        ],
    )
    return md


if __name__ == "__main__":
    main()
