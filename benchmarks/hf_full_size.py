"""Full-size Hugging Face configs imported without weights: import time and peak memory.

For each published config under tests/data/hf, a fresh Python process runs
`shardplan.from_hf(config, batch=BATCH, seq=SEQ)` (the module on torch's meta device, traced by
torch.export with fake tensors) and reports its wall time, CPU time and peak RSS
(`resource.getrusage(RUSAGE_SELF).ru_maxrss`, which includes the interpreter, torch and
transformers). With `--plan`, one more process runs the CLI command of the issue,
`shardplan plan --hf tests/data/hf/llama3-70b --mesh 64x8 --batch 1024 --seq 8192 --dtype bf16
--memory 80GB`, and reports the same figures for the whole run (import at each micro-batch
size + training-step search).

Run: python benchmarks/hf_full_size.py [--only NAME,NAME] [--plan]
Writes benchmarks/results/hf_full_size.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import run_info, table, write  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HF = ROOT / "tests" / "data" / "hf"
BATCH, SEQ = 1024, 8192
PLAN = [
    "plan",
    "--hf",
    "tests/data/hf/llama3-70b",
    "--mesh",
    "64x8",
    "--batch",
    "1024",
    "--seq",
    "8192",
    "--dtype",
    "bf16",
    "--memory",
    "80GB",
]

_CHILD = """
import json, resource, sys, time
t0, c0 = time.perf_counter(), time.process_time()
{body}
print(json.dumps({{"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
    "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **extra}}))
"""

_IMPORT = """
import shardplan as sp
g = sp.from_hf(sys.argv[1], batch=int(sys.argv[2]), seq=int(sys.argv[3]))
extra = {"params": g.num_params, "ops": len(g.ops), "flops": g.flops}
"""

_PLAN = """
import contextlib, io
from shardplan.cli.main import main
out = io.StringIO()
with contextlib.redirect_stdout(out):
    code = main(sys.argv[1:])
text = out.getvalue()
line = [s for s in text.splitlines() if "model TFLOP/s per device" in s]
extra = {"exit_code": code, "tflops_line": line[0].strip() if line else "", "stdout": text}
"""


def _child(body: str, *argv: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD.format(body=body), *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr else "failed"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default="", help="comma-separated config names")
    parser.add_argument("--plan", action="store_true", help="also time the 70B training plan")
    args = parser.parse_args()
    only = {n for n in args.only.split(",") if n}
    info = run_info(__file__, batch=BATCH, seq=SEQ)
    rows = []
    for path in sorted(HF.iterdir()):
        if only and path.name not in only:
            continue
        row = {"config": path.name, **_child(_IMPORT, str(path), str(BATCH), str(SEQ))}
        print(row, file=sys.stderr)
        rows.append(row)
    plan = _child(_PLAN, *PLAN) if args.plan else None
    md = (
        "# Full-size Hugging Face configs imported without weights\n\n"
        f"`{info['command']}` (source {info['source']}); each import in a fresh process at batch "
        f"{BATCH}, seq {SEQ}, on torch's meta device. Peak RSS includes the interpreter, torch "
        "and transformers.\n\n"
        + table(
            ["config", "parameters", "ops", "import wall s", "import CPU s", "peak RSS MB"],
            [
                [
                    r["config"],
                    f"{r['params'] / 1e9:.2f}B",
                    r["ops"],
                    f"{r['wall_s']:.1f}",
                    f"{r['cpu_s']:.1f}",
                    f"{r['peak_rss_mb']:.0f}",
                ]
                if "error" not in r
                else [r["config"], r["error"], "", "", "", ""]
                for r in rows
            ],
        )
    )
    if plan is not None:
        md += f"\n## Training plan of the 70B config\n\n`shardplan {' '.join(PLAN)}`\n\n"
        if "error" in plan:
            md += f"failed: {plan['error']}\n"
        else:
            md += (
                f"exit code {plan['exit_code']}; wall {plan['wall_s']:.1f} s, CPU "
                f"{plan['cpu_s']:.1f} s, peak RSS {plan['peak_rss_mb']:.0f} MB; "
                f"{plan['tflops_line']}\n\n```text\n{plan['stdout'].rstrip()}\n```\n"
            )
    write("hf_full_size", {"run": info, "rows": rows, "plan": plan}, md)


if __name__ == "__main__":
    main()
