"""Fidelity of the cost model: predicted vs measured collective bytes on JAX/XLA.

For several small zoo models (batch 8) on meshes 8 and 2x4, every plan (drec, data-parallel,
megatron, fsdp) of a training step is compiled for 8 fake CPU devices; the collectives of the
compiled HLO are converted to "bytes one device sends" and compared with the cost model per
kind (shardplan.fidelity.verify). Per model, the Kendall tau between the ranking of the plans by
predicted communication bytes and by measured bytes says whether the model orders plans right.

    python benchmarks/fidelity.py                      # writes benchmarks/results/fidelity.*
    python benchmarks/fidelity.py --models mlp,moe --meshes 8 --numerics

With `--numerics` each plan also runs sharded and unsharded in float64 (`verify_plan`'s default;
rtol 1e-9, atol 1e-12); the bytes always come from the float32 program, the plan's dtype.

Writes benchmarks/results/fidelity.json (every number) and fidelity.md (the tables).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _report import source_version  # noqa: E402

MODELS = (
    "mlp",
    "sapp-mlp",
    "wide-deep",
    "alexnet",
    "vgg16",
    "bert-base",
    "gpt2-small",
    "vit-b16",
    "moe",
)
MESHES = ("8", "2x4")
METHODS = ("drec", "data-parallel", "megatron", "fsdp")


def run_one(model: str, mesh: str, method: str, train: bool, numerics: bool) -> dict:
    from shardplan import zoo
    from shardplan.fidelity.verify import verify_plan
    from shardplan.search import plan

    graph = zoo.build(model, small=True, batch=8)
    p = plan(graph, mesh, method, train=train)
    start = time.perf_counter()
    report = verify_plan(p, train=train, check_numerics=numerics)
    return {
        "model": model,
        "mesh": mesh,
        "method": method,
        "train": train,
        "predicted": {k.kind: k.predicted for k in report.kinds},
        "measured": {k.kind: k.measured for k in report.kinds},
        "count": {k.kind: k.count for k in report.kinds},
        "ratio": {
            k.kind: (None if k.ratio == float("inf") else k.ratio)
            for k in report.kinds
            if k.predicted or k.measured
        },
        "within_10pct": {k.kind: k.within for k in report.kinds if k.predicted or k.measured},
        "causes": {k.kind: list(k.causes) for k in report.kinds if k.causes},
        "predicted_total": report.predicted_total,
        "measured_total": report.measured_total,
        "predicted_seconds": p.cost.comm.total if p.cost else None,
        "explained": report.explained,
        "unexplained": [
            {
                "op": d.op,
                "kind": d.kind,
                "predicted": d.predicted,
                "measured": d.measured,
                "unexplained_bytes": d.unexplained_bytes,
            }
            for d in report.differences
            if not d.explained
        ],
        "numerics_ok": report.numerics_ok if numerics else None,
        "max_error": report.max_error if numerics else None,
        "numerics_dtype": report.dtype if numerics else None,
        "compile_seconds": report.compile_seconds,
        "seconds": time.perf_counter() - start,
    }


def kendall(runs: list[dict]) -> dict:
    from scipy.stats import kendalltau

    pred = [r["predicted_total"] for r in runs]
    meas = [r["measured_total"] for r in runs]
    if len(set(pred)) < 2 or len(set(meas)) < 2:
        return {"tau": None, "p": None, "n": len(runs), "note": "constant ranking"}
    res = kendalltau(pred, meas)
    return {"tau": float(res.statistic), "p": float(res.pvalue), "n": len(runs)}


def _fmt(x: float | None, digits: int = 3) -> str:
    if x is None:
        return "-"
    return f"{x:.{digits}f}"


def _bytes(x: float) -> str:
    for unit in ("", "K", "M", "G"):
        if abs(x) < 1000:
            return f"{x:.3g}{unit}"
        x /= 1000
    return f"{x:.3g}T"


def markdown(data: dict) -> str:
    lines = [
        "# Cost-model fidelity on JAX/XLA (8 fake CPU devices)",
        "",
        f"Produced by `{data['meta']['command']}` on {data['meta']['date']} "
        f"(source {data['meta'].get('source', '?')}, jax {data['meta']['jax']}, "
        f"{data['meta']['machine']}). Training step of each zoo "
        "model at `small=True, batch=8`; bytes are what one device sends with ring algorithms "
        "(all-reduce 2(g-1)/g B, all-gather (g-1)/g B, reduce-scatter (g-1) B, all-to-all "
        "(g-1)/g B, collective-permute B), predicted by `plan.cost.comm` and measured from the "
        "compiled HLO (`shardplan.fidelity.verify`). Ratio = measured / predicted; `*` marks a "
        "kind outside +-10%, whose causes (docs/verification.md) follow. Numerics (with "
        "`--numerics`): max error of the sharded vs the unsharded run, both in "
        f"{data['meta'].get('numerics_dtype') or 'float32'}; bytes from the float32 program.",
        "",
        "| model | mesh | plan | numerics (max error) | predicted | measured | ratio | all-reduce "
        "| all-gather | all-to-all | permute | causes of >10% differences |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in data["runs"]:
        cells = []
        for kind in ("all-reduce", "all-gather", "all-to-all", "collective-permute"):
            if kind not in r["ratio"]:
                cells.append("")
                continue
            ratio = r["ratio"][kind]
            mark = "" if r["within_10pct"][kind] else "*"
            cells.append("inf" + mark if ratio is None else f"{ratio:.2f}{mark}")
        causes = sorted({c for cs in r["causes"].values() for c in cs})
        if not r["explained"]:
            causes.append("**unexplained**")
        total = (r["measured_total"] / r["predicted_total"]) if r["predicted_total"] else None
        numerics = (
            "-"
            if r["numerics_ok"] is None
            else f"{'OK' if r['numerics_ok'] else 'FAIL'} ({r['max_error']:.1e})"
        )
        lines.append(
            f"| {r['model']} | {r['mesh']} | {r['method']} | {numerics} | "
            f"{_bytes(r['predicted_total'])} | "
            f"{_bytes(r['measured_total'])} | {_fmt(total, 2)} | "
            + " | ".join(cells)
            + f" | {', '.join(causes)} |"
        )
    lines += [
        "",
        "## Ranking of plans: Kendall tau (predicted bytes vs measured bytes)",
        "",
        "| model | mesh 8 | mesh 2x4 | both meshes (8 plans) |",
        "|---|---:|---:|---:|",
    ]
    for model, entry in data["kendall"].items():
        row = [entry.get(m, {}).get("tau") for m in ("8", "2x4", "all")]
        lines.append(f"| {model} | " + " | ".join(_fmt(t, 2) for t in row) + " |")
    s = data["summary"]
    lines += [
        "",
        f"Runs: {s['runs']}; kinds within +-10%: {s['kinds_within']}/{s['kinds']}; runs with "
        f"every difference explained: {s['explained']}/{s['runs']}; mean tau over models "
        f"(both meshes): {_fmt(s['mean_tau'], 2)}.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--meshes", default=",".join(MESHES))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--infer", action="store_true", help="forward pass instead of training")
    ap.add_argument("--numerics", action="store_true", help="also run and compare numerics")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fidelity"))
    args = ap.parse_args(argv)

    import jax

    if jax.device_count() < 8:
        print(
            f"need 8 devices, JAX sees {jax.device_count()}; set XLA_FLAGS="
            "--xla_force_host_platform_device_count=8",
            file=sys.stderr,
        )
        return 2
    source = source_version()  # before the run, as the other benchmarks do
    runs = []
    for model in args.models.split(","):
        for mesh in args.meshes.split(","):
            for method in args.methods.split(","):
                r = run_one(model, mesh, method, not args.infer, args.numerics)
                runs.append(r)
                print(
                    f"{model:11s} {mesh:4s} {method:14s} predicted {r['predicted_total']:12.0f}"
                    f" measured {r['measured_total']:12.0f} explained {r['explained']} "
                    f"({r['seconds']:.1f}s)",
                    flush=True,
                )
    taus: dict[str, dict] = {}
    for model in args.models.split(","):
        mine = [r for r in runs if r["model"] == model]
        taus[model] = {
            m: kendall([r for r in mine if r["mesh"] == m]) for m in args.meshes.split(",")
        }
        taus[model]["all"] = kendall(mine)
    kinds = [(r, k) for r in runs for k in r["within_10pct"]]
    valid = [t["all"]["tau"] for t in taus.values() if t["all"]["tau"] is not None]
    data = {
        "meta": {
            "command": "python benchmarks/fidelity.py"
            + (" " + " ".join(argv or sys.argv[1:]) if (argv or sys.argv[1:]) else ""),
            "date": time.strftime("%Y-%m-%d"),
            "source": source,
            "numerics_dtype": runs[0]["numerics_dtype"] if runs else None,
            "jax": jax.__version__,
            "machine": f"{platform.machine()} {os.cpu_count()} cores",
            "train": not args.infer,
        },
        "runs": runs,
        "kendall": taus,
        "summary": {
            "runs": len(runs),
            "kinds": len(kinds),
            "kinds_within": sum(1 for r, k in kinds if r["within_10pct"][k]),
            "explained": sum(1 for r in runs if r["explained"]),
            "mean_tau": sum(valid) / len(valid) if valid else None,
        },
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(data, indent=1))
    out.with_suffix(".md").write_text(markdown(data))
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
