"""Hugging Face models trained through `shardplan.torch.parallelize` (and PyTorch's own
tensor-parallel API via `to_torch_tp`) on 4 gloo processes, mesh 2x2: the losses and parameters
against one process, and the collectives of one training step by kind (count and bytes sent per
device, measured with a dispatch mode that counts each collective and its bytes) next to the plan's
predicted bytes per kind. Issue 12.

Run: python benchmarks/torch_parallelize.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import run_info, table, write  # noqa: E402

from shardplan.torch.check import KINDS, hf_model, train_many  # noqa: E402
from shardplan.torch.launch import spawn  # noqa: E402

CASES = {
    "GPT-2 / D-Rec (memory / 2) / parallelize": {"builder_args": ("gpt2",)},
    "Llama / D-Rec (memory / 2) / parallelize": {"builder_args": ("llama",)},
    "Llama / Megatron / to_torch_tp": {
        "builder_args": ("llama",),
        "engine": "torch_tp",
        "method": "megatron",
        "memory_fraction": 1.0,
    },
}


def main() -> None:
    info = run_info(__file__)  # the source commit, read before the run
    configs = [
        {"builder": hf_model, "mesh": "2x2", "steps": 3, "lr": 1e-2, **c} for c in CASES.values()
    ]
    results = spawn(train_many, 4, (configs,), timeout=3000)
    rows, comm_rows, data = [], [], {}
    for name, r in zip(CASES, results, strict=True):
        r = dict(r)
        r.pop("plan", None)
        data[name] = r
        if "error" in r:
            rows.append([name, "-", "-", "-", r["error"]])
            continue
        worst_loss = max(
            abs(a - b) / abs(b)
            for a, b in zip(r["parallel_losses"], r["reference_losses"], strict=True)
        )
        rows.append(
            [
                name,
                f"{r['sharded_params']}/{r['params']}",
                " ".join(f"{x:.6f}" for x in r["parallel_losses"]),
                f"{worst_loss:.1e}",
                f"{r['max_param_error']:.1e}",
            ]
        )
        for kind in KINDS:
            pred = r["predicted_bytes"][kind]
            comm_rows.append(
                [
                    name,
                    kind,
                    r["measured_counts"][kind],
                    f"{r['measured_bytes'][kind]:,.0f}",
                    "not modelled" if kind == "reduce-scatter" else f"{pred:,.0f}",
                ]
            )
    md = "# Training your own module under a plan (4 gloo processes, mesh 2x2, float64)\n\n"
    md += table(
        [
            "case",
            "sharded params",
            "losses (3 AdamW steps)",
            "max rel. loss diff",
            "max param diff",
        ],
        rows,
    )
    md += "\n## Collectives of one training step (forward + backward), per kind\n\n"
    md += table(
        ["case", "kind", "measured count", "measured bytes/device", "predicted bytes/device"],
        comm_rows,
    )
    md += (
        "\ngloo has no all-to-all: DTensor falls back to all-gather + local chunk, so a "
        "predicted all-to-all is measured as all-gather. The cost model charges an all-reduce "
        "or an all-gather where DTensor reduce-scatters (a partial sum read as a split).\n"
    )
    write("torch_parallelize", {"run": info, "cases": data}, md)


if __name__ == "__main__":
    main()
