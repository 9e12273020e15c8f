"""Does `shardplan plan gpt3-175b --mesh 128x8 --batch 1536 --memory 80GB --dtype bf16` return a
plan that fits 80 GB per device, and how long does it take on this machine?

Runs that exact command line in a subprocess (a user's wall time: interpreter start, imports,
model build, the search and the printout), with `--json` to read the plan back; the memory per
device and the step figures come from the plan's own evaluation (cost/step.py). Progress lines
the search prints on stderr are counted.

Run: python benchmarks/scale_fit.py [--name STEM]
Writes benchmarks/results/scale_fit.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import run_info, table, write  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
ARGS = ["gpt3-175b", "--mesh", "128x8", "--batch", "1536", "--memory", "80GB", "--dtype", "bf16"]
BUDGET = 80e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--name", default="scale_fit", help="results file stem")
    args = ap.parse_args()
    info = run_info(__file__, command_timed="shardplan plan " + " ".join(ARGS))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        cmd = [sys.executable, "-m", "shardplan.cli", "plan", *ARGS, "--json", str(out)]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise SystemExit(f"command failed ({proc.returncode}):\n{proc.stderr}")
        data = json.loads(out.read_text())
    step = data["step"]
    progress = [line for line in proc.stderr.splitlines() if line.strip().startswith("S=")]
    result = {
        "wall_seconds": wall,
        "search_seconds": data["search_seconds"],
        "progress_lines_on_stderr": len(progress),
        "memory_per_device_GB": step["memory_per_device_bytes"] / 1e9,
        "fits_80GB": step["memory_per_device_bytes"] <= BUDGET,
        "pipeline_stages": data["pipeline_stages"],
        "micro_batches": data["micro_batches"],
        "axes": data["axes"],
        "levers": [(s["recompute"], s["zero"]) for s in data["stages"]],
        "stage_methods": [s["plan"]["method"] for s in data["stages"]],
        "step_s": step["step_s"],
        "tokens_per_s": step["tokens_per_s"],
        "tflops_per_device": step["tflops_per_device"],
        "peak_fraction": step["peak_fraction"],
        "notes": data["notes"],
    }
    md = "# gpt3-175b on 128x8 A100-80GB, batch 1536, bf16: fit and search time\n\n"
    md += f"Command timed: `{info['command_timed']}` (source {info['source']}; run by "
    md += f"`{info['command']}`).\n\n"
    md += table(
        ["item", "value"],
        [
            ["wall time of the command", f"{wall:.1f} s"],
            ["search time (plan's search_seconds)", f"{data['search_seconds']:.1f} s"],
            ["progress lines on stderr", len(progress)],
            ["max memory per device", f"{result['memory_per_device_GB']:.3g} GB"],
            ["fits 80 GB", "yes" if result["fits_80GB"] else "NO"],
            ["structure", "; ".join(data["axes"])],
            ["stages x micro-batches", f"{data['pipeline_stages']} x {data['micro_batches']}"],
            ["levers per stage (recompute, ZeRO)", str(result["levers"])],
            ["stage plans", str(result["stage_methods"])],
            ["predicted step", f"{step['step_s']:.4g} s"],
            ["predicted model TFLOP/s per device", f"{step['tflops_per_device']:.4g}"],
        ],
    )
    md += "\nNotes:\n" + "".join(f"- {n}\n" for n in data["notes"])
    write(args.name, {**info, "result": result}, md)


if __name__ == "__main__":
    main()
