"""The cost model's constant factor: `cost.step.profile_stage` and `experts.megatron` (issue 24).

Fixed sub-graphs: GPT-3 175B (h 12288, 96 heads, sequence 2048, vocabulary 51,200, bf16 on
A100s) at micro-batch sizes 1 and 4, cut into the step search's kind of chunks — the embedding
and the first layer, two middle layers, the last layer and the head — on the stage meshes 8x8
and 1x8. On each chunk and mesh, every family the step search prices: D-Rec's plan, the
data-parallel expert, Megatron at t = 2, 4, 8, each with and without sequence parallelism where
it applies (a plan with tensor-parallel rounds). Timed: `profile_stage` of each (family, chunk,
mesh, micro-batch), `experts.megatron` of each (t, chunk, mesh, micro-batch), and the whole step
search for GPT-3 at 16 layers on 16x8, batch 256, 80 GB (`sp.plan(..., "step")`).
Each side runs in its own worker process (`PYTHONPATH` = its source tree); with `--baseline PATH`
(another checkout, e.g. a worktree of main) the workers alternate, baseline then this tree, for
`--repeats` passes, and each timing is the least over the passes of the worker's CPU seconds
(`time.process_time`; the machine is shared). The
workers also hash every result (each profile's repr, each strategy map, the search's step):
equal hashes mean both trees computed the same numbers, bit for bit.

The hash matches only when the baseline's cost model is this tree's but for the changes timed
(e.g. main at the merge base); an older main whose own commits since changed some result (a
regenerated golden) says NO there while its timings still compare the same code paths.

Run: python benchmarks/cost_speed.py [--baseline PATH] [--repeats N] [--no-search] [--name NAME]
       [--search LAYERS,MESH,BATCH | MODEL,MESH,BATCH] [--no-cases]
       (e.g. --search 96,128x8,1536: issue 24's 175B; --search deepseek-v3,256x8,4096: a zoo
       model at full size)
  ->  benchmarks/results/NAME.{json,md} (NAME: cost_speed)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GPT3 = dict(hidden=12288, heads=96, vocab=51200, seq=2048)
LAYERS = 4  # chunks below: ops of segments [0, 4), [4, 8), [8, 13) of a 4-layer model
CHUNKS = (("embedding + layer 0", 0, 4), ("layers 1-2", 4, 8), ("layer 3 + head", 8, 13))
MICRO_BATCHES = (1, 4)
MESHES = ("8x8", "1x8")
SEARCH = "16,16x8,256"  # layers, mesh, global batch of the timed step search (`--search`)


def _digest(x: Any) -> str:
    return hashlib.sha256(repr(x).encode()).hexdigest()[:16]


def _best(f: Any, reps: int) -> tuple[float, Any]:
    """Least CPU time of `reps` calls of f() and its result (`time.process_time`: the worker's
    own seconds, less moved by other load on a shared machine than wall time)."""
    best, out = float("inf"), None
    for _ in range(reps):
        t = time.process_time()
        out = f()
        best = min(best, time.process_time() - t)
    return best, out


def _search_spec(spec: str) -> tuple[int | str, str, int]:
    """LAYERS,MESH,BATCH (GPT-3 at that depth) or MODEL,MESH,BATCH (a zoo model at full size)."""
    what, mesh, batch = spec.split(",")
    return (int(what) if what.isdigit() else what), mesh, int(batch)


def _search_label(spec: str) -> str:
    what, mesh, batch = _search_spec(spec)
    return f"step search {f'GPT-3 L{what}' if isinstance(what, int) else what} {mesh} b{batch}"


def worker(reps: int, search: str | None, cases: bool = True) -> dict[str, Any]:
    """Time every case in this process (the shardplan on PYTHONPATH)."""
    import shardplan as sp
    from shardplan import zoo
    from shardplan.cost.sequence import tensor_rounds
    from shardplan.cost.step import profile_stage
    from shardplan.ir.segments import segments, subgraph
    from shardplan.mesh import parse_mesh
    from shardplan.problem import Problem
    from shardplan.search import experts
    from shardplan.search.drec import drec
    from shardplan.training import at_precision

    def build(b: int, layers: int = LAYERS) -> Any:
        return zoo.build("gpt3", batch=b, layers=layers, **GPT3)

    opts = Problem.make(build(1), "8", dtype="bf16", memory=80e9).options
    profiles: dict[str, float] = {}
    megatron: dict[str, float] = {}
    hashes: list[str] = []
    for mb in MICRO_BATCHES if cases else ():
        graph = build(mb)
        segs = segments(graph)
        for mesh_text in MESHES:
            mesh = at_precision(parse_mesh(mesh_text), opts)
            for chunk, a, e in CHUNKS:
                sub = subgraph(graph, segs[a].start, segs[e - 1].stop)
                where = f"{chunk}, mb {mb}, {mesh_text}"
                plans = {"drec": drec(sub, mesh, opts), "data-parallel": None}
                for t in (2, 4, 8):
                    secs, st = _best(partial(experts.megatron, sub, mesh, t), reps)
                    megatron[f"t={t}, {where}"] = secs
                    hashes.append(_digest(sorted(st.items())))
                    plans[f"megatron t={t}"] = st
                plans["data-parallel"] = experts.data_parallel(sub, mesh)
                for family, st in plans.items():
                    st = {op.name: tuple(st[op.name]) for op in sub.ops}
                    for seq in (False, True):
                        if seq and not tensor_rounds(sub, mesh, st):
                            continue  # nothing to split along the sequence (as the search skips)
                        run = partial(profile_stage, sub, mesh, st, opts, sequence_parallel=seq)
                        secs, prof = _best(run, reps)
                        profiles[f"{family}{' +SP' if seq else ''}, {where}"] = secs
                        hashes.append(_digest(prof))
    out: dict[str, Any] = {"profile_stage": profiles, "megatron": megatron}
    if search:
        what, mesh_text, batch = _search_spec(search)
        model = (partial(build, layers=what) if isinstance(what, int)
                 else lambda b, name=what: zoo.build(name, batch=b))  # fmt: skip
        t = time.process_time()
        tp = sp.plan(model, mesh_text, "step", batch=batch, dtype="bf16", memory=80e9)
        out["search_s"] = time.process_time() - t
        out["search"] = search
        hashes.append(_digest(tp.step))
    out["digest"] = _digest(hashes)
    return out


def _spawn(tree: Path, reps: int, search: str | None, cases: bool) -> dict[str, Any]:
    """One worker pass with `tree` first on the import path."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, __file__, "--worker", path, "--reps", str(reps)]
    cmd += ["--search", search] if search else ["--no-search"]
    subprocess.run([*cmd, *([] if cases else ["--no-cases"])], env=env, check=True)
    data = json.loads(Path(path).read_text())
    os.unlink(path)
    return data


def _merge(passes: list[dict[str, Any]]) -> dict[str, Any]:
    """Per timing, the least over the passes; the passes' digests must agree."""
    out: dict[str, Any] = {"digest": passes[0]["digest"]}
    if any(p["digest"] != out["digest"] for p in passes):
        out["digest"] = "differs between passes"
    for part in ("profile_stage", "megatron"):
        out[part] = {k: min(p[part][k] for p in passes) for k in passes[0][part]}
    out["search"] = passes[0].get("search")
    if "search_s" in passes[0]:
        out["search_s"] = min(p["search_s"] for p in passes)
    return out


def _report(current: dict[str, Any], base: dict[str, Any] | None, info: dict[str, Any]) -> str:
    from _report import table

    def ms(x: float) -> str:
        return f"{x * 1e3:.2f}"

    lines = [
        "# Cost-model speed: profile_stage and experts.megatron (issue 24)\n",
        "CPU milliseconds of one worker process per call (`time.process_time`).\n",
        f"`{info['command']}` at {info['source']}"
        + (f", baseline {info['baseline']}" if base else "")
        + f"; least of {info['repeats']} passes per timing.\n",
    ]
    rows = []
    for part, label in (("profile_stage", "profile_stage"), ("megatron", "experts.megatron")):
        if not current[part]:
            continue  # --no-cases
        cur = sum(current[part].values())
        row = [label, len(current[part]), ms(cur / len(current[part]))]
        if base:
            old = sum(base[part].values())
            row += [ms(old / len(base[part])), f"{old / cur:.2f}x"]
        rows.append(row)
    if "search_s" in current:
        row = [_search_label(current["search"]), 1]
        row.append(ms(current["search_s"]))
        if base:
            row += [ms(base["search_s"]), f"{base['search_s'] / current['search_s']:.2f}x"]
        rows.append(row)
    head = ["what", "cases", "this tree, ms per case"]
    if base:
        head += ["baseline, ms per case", "speed-up"]
    lines.append(table(head, rows))
    if base:
        same = current["digest"] == base["digest"]
        lines.append(
            f"Results identical to the baseline (hash of every profile, strategy map and the "
            f"search's step): **{'yes' if same else 'NO'}** ({current['digest']} vs "
            f"{base['digest']}).\n"
        )
    for part in ("profile_stage", "megatron") if current["profile_stage"] else ():
        lines.append(f"\n## {part} per case (ms)\n")
        head = ["case", "this tree"] + (["baseline", "speed-up"] if base else [])
        body = []
        for k, v in current[part].items():
            row = [k, ms(v)]
            if base:
                row += [ms(base[part][k]), f"{base[part][k] / v:.2f}x"]
            body.append(row)
        lines.append(table(head, body))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, help="another source tree to time side by side")
    ap.add_argument("--repeats", type=int, default=2, help="worker passes per tree")
    ap.add_argument("--reps", type=int, default=2, help="calls per case within a pass")
    ap.add_argument("--no-search", action="store_true", help="skip the whole step search")
    ap.add_argument("--search", default=SEARCH, help="timed: LAYERS,MESH,BATCH or MODEL,MESH,BATCH")
    ap.add_argument("--no-cases", action="store_true", help="time the search alone")
    ap.add_argument("--name", default="cost_speed", help="results file name (no extension)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        search = None if args.no_search else args.search
        Path(args.worker).write_text(json.dumps(worker(args.reps, search, not args.no_cases)))
        return
    sys.path.insert(0, str(HERE))
    from _report import run_info, write

    info = run_info(__file__, repeats=args.repeats, reps=args.reps)
    if args.baseline:
        info["baseline"] = _tree_version(args.baseline)
    search, cases = None if args.no_search else args.search, not args.no_cases
    mine: list[dict[str, Any]] = []
    theirs: list[dict[str, Any]] = []
    for _ in range(args.repeats):
        if args.baseline:
            theirs.append(_spawn(args.baseline.resolve(), args.reps, search, cases))
        mine.append(_spawn(ROOT, args.reps, search, cases))
    current = _merge(mine)
    base = _merge(theirs) if theirs else None
    data = {**info, "current": current, "baseline_timings": base}
    if base:
        data["speedup"] = {
            part: sum(base[part].values()) / sum(current[part].values())
            for part in ("profile_stage", "megatron")
            if current[part]
        }
        if "search_s" in current:
            data["speedup"]["search"] = base["search_s"] / current["search_s"]
        data["identical"] = current["digest"] == base["digest"]
    write(args.name, data, _report(current, base, info))


def _tree_version(tree: Path) -> str:
    """The commit a source tree is at (short hash)."""
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=tree, capture_output=True, text=True
    )
    return out.stdout.strip() or str(tree)


if __name__ == "__main__":
    main()
