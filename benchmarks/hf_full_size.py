"""Today's LLMs at full size: import of the published configs without weights, and the issue's
two training-plan commands, each in its own process.

Imports: for each published config under tests/data/hf, a fresh Python process runs
`shardplan.from_hf(config, batch=1024, seq=8192)` (the module on torch's meta device, traced by
torch.export with fake tensors) and reports the import's own wall and CPU seconds.

Plans: each command of the issue runs as a child process through the CLI's `main` (what the
`shardplan` script calls):
  shardplan plan --hf tests/data/hf/llama3-70b --mesh 64x8 --batch 1024 --seq 8192
      --dtype bf16 --memory 80GB
  shardplan plan llama3-405b --mesh 1024x8 --machine h100 --batch 2048 --seq 8192 --dtype bf16
      --memory 80GB
The child wraps `shardplan.importers.hf_config.hf_importer` with a timer (nothing else changes),
so the report splits the command's time into config imports (building the meta module, then one
torch.export per micro-batch size the planner tries) and the rest; the predicted model TFLOP/s
per device is read from the printed report.

Every child is measured from outside: wall time around it, and its CPU seconds and peak RSS
(`ru_maxrss`, which includes the interpreter, torch and transformers) from `os.wait4`'s resource
usage of that one process. Linux carries the RSS a process had before exec into `ru_maxrss`, so
a child's figure is at least this script's own RSS at the fork (reported with the results).
The other big zoo LLMs (Mixtral 8x22B, DeepSeek-V3, Qwen3-235B-A22B) are planned with the
405B command's mesh, machine and sizes too. `--quick` runs the same commands cut to 2 layers on
small meshes (to try the script).

Run: python benchmarks/hf_full_size.py [--only NAME,NAME] [--no-imports] [--no-plans] [--quick]
     [--timeout S]
Writes benchmarks/results/hf_full_size.{json,md} (hf_full_size_quick.* with --quick); a section
skipped with --no-imports / --no-plans is kept from the last results file, with the command and
source commit of the run that produced it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import RESULTS, run_info, table, write  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
HF = ROOT / "tests" / "data" / "hf"
BATCH, SEQ = 1024, 8192
TRAIN = ["--seq", "8192", "--dtype", "bf16", "--memory", "80GB"]
PLANS = {  # the two commands of issue 25's "Must show"
    "llama3-70b --hf": ["plan", "--hf", "tests/data/hf/llama3-70b", "--mesh", "64x8"]
    + ["--batch", "1024", *TRAIN],
    "llama3-405b": ["plan", "llama3-405b", "--mesh", "1024x8", "--machine", "h100"]
    + ["--batch", "2048", *TRAIN],
}
MORE = ("mixtral-8x22b", "deepseek-v3", "qwen3-235b-a22b")  # on the 405B command's mesh
QUICK_SIZES = {"--layers": "2", "--mesh": "2x8", "--batch": "32", "--seq": "1024"}
QUICK_IMPORT = (8, 1024)

_IMPORT = """
import json, sys, time
start, cpu = time.perf_counter(), time.process_time()
import shardplan as sp
g = sp.from_hf(sys.argv[1], batch=int(sys.argv[2]), seq=int(sys.argv[3]))
wall, cpu = time.perf_counter() - start, time.process_time() - cpu
print(json.dumps({"import_s": wall, "import_cpu_s": cpu, "params": g.num_params,
    "ops": len(g.ops), "flops": g.flops}))
"""

_PLAN = """
import json, sys, time
import shardplan.importers.hf_config as hf_config
imports = []
build_importer = hf_config.hf_importer

def hf_importer(*args, **kwargs):  # the same importer, timed
    start = time.perf_counter()
    importer = build_importer(*args, **kwargs)
    imports.append(["meta module", time.perf_counter() - start])
    def timed(batch):
        start = time.perf_counter()
        result = importer(batch)
        imports.append([f"batch {batch}", time.perf_counter() - start])
        return result
    return timed

hf_config.hf_importer = hf_importer
from shardplan.cli.main import main
code = main(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump({"exit_code": code, "imports": imports}, f)
sys.exit(code)
"""


def measure(argv: list[str], timeout: float) -> dict[str, Any]:
    """Run `argv` from the repository root: its wall seconds, and CPU seconds and peak RSS of
    that process alone (`os.wait4`); stdout and stderr as text. Killed after `timeout` s."""
    env = {**os.environ, "COLUMNS": "160", "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        child = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=err, env=env)
        killer = threading.Timer(timeout, child.kill)
        killer.start()
        _, status, usage = os.wait4(child.pid, 0)
        killer.cancel()
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        out.seek(0)
        err.seek(0)
        return {
            "returncode": child.returncode,
            "timed_out": wall >= timeout,
            "wall_s": wall,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "peak_rss_mb": usage.ru_maxrss / 1024,  # KiB on Linux
            "stdout": out.read(),
            "stderr": err.read(),
        }


def import_row(path: Path, batch: int, seq: int, timeout: float) -> dict[str, Any]:
    run = measure([sys.executable, "-c", _IMPORT, str(path), str(batch), str(seq)], timeout)
    row = {"config": path.name, **_process(run)}
    if run["returncode"] == 0:
        row.update(json.loads(run["stdout"].strip().splitlines()[-1]))
    return row


def plan_row(name: str, args: list[str], timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        run = measure([sys.executable, "-c", _PLAN, str(report), *args], timeout)
        inner = json.loads(report.read_text()) if report.exists() else {}
    imports = inner.get("imports", [])
    return {
        "name": name,
        "command": "shardplan " + " ".join(args),
        **_process(run),
        "exit_code": inner.get("exit_code", run["returncode"]),
        "imports": imports,
        "import_s": sum(s for _, s in imports),
        "first_import_s": sum(s for _, s in imports[:2]),  # meta module + first trace
        "tflops_per_gpu": tflops_per_device(run["stdout"]),
        "plan_title": next((x.strip() for x in run["stdout"].splitlines() if " on mesh " in x), ""),
        "stdout": run["stdout"],
    }


def _process(run: dict[str, Any]) -> dict[str, Any]:
    row = {k: run[k] for k in ("returncode", "timed_out", "wall_s", "cpu_s", "peak_rss_mb")}
    if run["returncode"]:
        lines = run["stderr"].strip().splitlines()
        row["error"] = "timed out" if run["timed_out"] else (lines[-1] if lines else "failed")
    return row


def tflops_per_device(report: str) -> float | None:
    """The predicted model TFLOP/s per device from a training report's 'model FLOP/s per
    device' row (first number; a PFLOP/s or GFLOP/s figure is converted), or None."""
    for line in report.splitlines():
        if "model FLOP/s per device" in line:
            found = re.search(r"([\d.]+)\s*([GTP])FLOP/s", line)
            if found:
                return float(found[1]) * {"G": 1e-3, "T": 1.0, "P": 1e3}[found[2]]
    return None


def quick(args: list[str]) -> list[str]:
    """The same command at 2 layers on a 2x8 mesh, batch 32, seq 1024 (to try the script)."""
    out, i = [], 0
    while i < len(args):
        if args[i] in QUICK_SIZES:
            i += 2
            continue
        out.append(args[i])
        i += 1
    return out + [x for kv in QUICK_SIZES.items() for x in kv]


def markdown(imports: dict[str, Any] | None, plans: dict[str, Any] | None) -> str:
    md = (
        "# Today's LLMs at full size: imports without weights and training plans\n\n"
        "Each row is one child process; wall time is measured around it, CPU seconds and peak "
        "RSS (`ru_maxrss`, interpreter, torch and transformers included) are that process's own "
        "(`os.wait4`). The machine runs other jobs, so wall time includes waiting for a core; "
        "CPU seconds do not.\n"
    )
    floor = (plans or imports or {}).get("run", {}).get("parent_rss_mb")
    if floor:
        md += (
            f"A child's peak RSS counts this script's own RSS at the fork ({floor:.0f} MB): "
            "Linux carries it into `ru_maxrss` across exec.\n"
        )
    if imports:
        run = imports["run"]
        md += (
            f"\n## Imports at batch {run['import_batch']}, seq {run['import_seq']} (meta device)"
            f"\n\n`{run['command']}` (source {run['source']})\n\n"
        )
        md += table(
            ["config", "parameters", "ops", "import wall s", "import CPU s", "process peak RSS MB"],
            [_import_cells(r) for r in imports["rows"]],
        )
    if plans:
        run = plans["run"]
        md += f"\n## Training plans\n\n`{run['command']}` (source {run['source']})\n"
        md += "".join(_plan_section(r) for r in plans["rows"])
    return md


def _import_cells(r: dict[str, Any]) -> list[Any]:
    if "error" in r:
        return [r["config"], r["error"], "", "", "", f"{r['peak_rss_mb']:.0f}"]
    return [
        r["config"],
        f"{r['params'] / 1e9:.2f}B",
        r["ops"],
        f"{r['import_s']:.1f}",
        f"{r['import_cpu_s']:.1f}",
        f"{r['peak_rss_mb']:.0f}",
    ]


def _plan_section(r: dict[str, Any]) -> str:
    md = f"\n### {r['name']}\n\n`{r['command']}`\n\n"
    if "error" in r:
        return md + f"failed after {r['wall_s']:.0f} s wall, CPU {r['cpu_s']:.0f} s: {r['error']}\n"
    steps = ", ".join(f"{what} {s:.1f} s" for what, s in r["imports"])
    imported = (
        f"config imports {r['import_s']:.1f} s wall (first import {r['first_import_s']:.1f} s; "
        f"{steps})"
        if steps
        else "a zoo model (built in the process, no config import)"
    )
    tflops = f"{r['tflops_per_gpu']:.0f}" if r["tflops_per_gpu"] is not None else "not printed"
    return md + (
        f"exit code {r['exit_code']}; wall {r['wall_s']:.1f} s, CPU {r['cpu_s']:.1f} s, peak "
        f"RSS {r['peak_rss_mb']:.0f} MB; {imported}; predicted model TFLOP/s per GPU: "
        f"{tflops}.\n\n```text\n{r['stdout'].rstrip()}\n```\n"
    )


def _earlier(name: str, section: str) -> dict[str, Any] | None:
    """A section of the last results file, kept when this run skips it (each section names the
    command and source commit that produced it)."""
    path = RESULTS / f"{name}.json"
    if not path.exists():
        return None
    found = json.loads(path.read_text()).get(section)
    return found if isinstance(found, dict) and "rows" in found else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", default="", help="comma-separated config / plan names")
    parser.add_argument("--no-imports", action="store_true", help="keep the last import rows")
    parser.add_argument("--no-plans", action="store_true", help="keep the last plan rows")
    parser.add_argument("--quick", action="store_true", help="2-layer versions, small meshes")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per process")
    args = parser.parse_args()
    only = {n for n in args.only.split(",") if n}
    batch, seq = QUICK_IMPORT if args.quick else (BATCH, SEQ)
    name = "hf_full_size_quick" if args.quick else "hf_full_size"
    info = run_info(__file__, import_batch=batch, import_seq=seq, quick=args.quick)
    info["parent_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    imports, plans = _earlier(name, "imports"), _earlier(name, "plans")
    if not args.no_imports:
        imports = {"run": info, "rows": []}
        for path in sorted(HF.iterdir()):
            if not only or path.name in only:
                imports["rows"].append(import_row(path, batch, seq, args.timeout))
                print(imports["rows"][-1], file=sys.stderr)
    if not args.no_plans:
        commands = {**PLANS, **{n: ["plan", n, *PLANS["llama3-405b"][2:]] for n in MORE}}
        plans = {"run": info, "rows": []}
        for key, argv in commands.items():
            if not only or key in only or key.split()[0] in only:
                plans["rows"].append(
                    plan_row(key, quick(argv) if args.quick else argv, args.timeout)
                )
                print(
                    {k: v for k, v in plans["rows"][-1].items() if k != "stdout"}, file=sys.stderr
                )
    write(name, {"imports": imports, "plans": plans}, markdown(imports, plans))


if __name__ == "__main__":
    main()
