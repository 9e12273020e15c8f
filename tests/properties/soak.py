"""Run the training-planner property suites in chunks, each with a fresh random seed, and tally.

    python tests/properties/soak.py --examples 20000 [--chunk 500] [--jobs 2] [--first-seed 1]
        [--suites test_training test_step_vs_recipes test_inputs test_plans]

Each chunk is `pytest <suite> --hypothesis-profile=soak --hypothesis-seed=S` with
SHARDPLAN_SOAK_EXAMPLES=chunk (tests/conftest.py), so a long run banks its progress chunk by
chunk; suites alternate, `--jobs` chunks run at once. Prints one line per chunk (suite, seed,
passing examples as hypothesis counted them, pass/fail, seconds) and the totals; exit 1 when a
chunk failed (its log is kept under --logs).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SUITES = ("tests/properties/test_training.py", "tests/properties/test_step_vs_recipes.py")
"""The suites soaked by default: the training planner's."""
PASSING = re.compile(r"(\d+) passing examples")


def run_chunk(suite: str, seed: int, examples: int, logs: Path) -> tuple[str, int, int, int, float]:
    env = dict(os.environ, SHARDPLAN_SOAK_EXAMPLES=str(examples), PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "pytest", suite, "-p", "no:cacheprovider", "-o", "addopts=",
           "-q", "--hypothesis-profile=soak", f"--hypothesis-seed={seed}",
           "--hypothesis-show-statistics"]  # fmt: skip
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    text = out.stdout + out.stderr
    log = logs / f"{Path(suite).stem}-{seed}.log"
    log.write_text(text)
    passing = sum(int(n) for n in PASSING.findall(text))
    return suite, seed, passing, out.returncode, seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=20_000, help="examples in all")
    ap.add_argument("--chunk", type=int, default=500, help="examples per pytest run")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--logs", type=Path, default=Path("soak-logs"))
    ap.add_argument(
        "--suites",
        nargs="+",
        default=[Path(s).stem for s in SUITES],
        help="property suites (file stems under tests/properties) to alternate",
    )
    args = ap.parse_args(argv)
    suites = [f"tests/properties/{name.removesuffix('.py')}.py" for name in args.suites]
    missing = [s for s in suites if not (ROOT / s).is_file()]
    if missing:
        ap.error(f"no property suite {', '.join(missing)}; see tests/properties/test_*.py")
    args.logs.mkdir(parents=True, exist_ok=True)
    chunks = -(-args.examples // args.chunk)
    jobs = [(suites[k % len(suites)], args.first_seed + k) for k in range(chunks)]
    total, failed = 0, 0
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(run_chunk, s, seed, args.chunk, args.logs) for s, seed in jobs]
        for f in futures:
            suite, seed, passing, code, seconds = f.result()
            total += passing
            failed += code != 0
            status = "ok" if code == 0 else f"FAILED (exit {code})"
            print(f"{Path(suite).stem} seed {seed}: {passing} passing examples, {status}, "
                  f"{seconds:.0f} s; total {total}", flush=True)  # fmt: skip
    print(f"{total} passing examples in {chunks} chunks, {failed} failed chunk(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
