"""The configs `benchmarks/engine_exports.py` exported for GPT-3 175B on 128x8, Llama 3 70B on
64x8 and Llama 3 405B on 2048x8, judged by the engines' own configuration code at the plan's
world size (accepted) and at another world size (rejected). The searches take minutes, so the
benchmark writes the configs and this test re-reads the committed files."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardplan.importers.engine_config import read_engine_config

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
RUN = RESULTS / "engine_exports.json"
CHECKS = Path(__file__).with_name("engine_checks.py")


def run_checks(cases: list[dict], tmp_path: Path) -> list[dict]:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    out = subprocess.run(
        [sys.executable, str(CHECKS), str(path)], capture_output=True, text=True, timeout=900
    )
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, out.stderr[-3000:]
    return json.loads(line[-1][len("RESULT ") :])


def _rows() -> list[dict]:
    if not RUN.exists():
        return []
    return [r for v in json.loads(RUN.read_text())["results"].values() for r in v["rows"]]


def _world(mesh: str) -> int:
    out = 1
    for x in mesh.split("x"):
        out *= int(x)
    return out


def _cases(row: dict) -> list[dict]:
    path = RESULTS / row["config"]
    world = _world(row["mesh"])
    stem = str(path).rsplit(".", 2)[0]
    if row["engine"] == "torchtitan":
        ok = {"engine": "torchtitan", "world": world, "path": str(path)}
        return [ok, {**ok, "world": world + 8}]
    if row["engine"] == "megatron":
        cfg = read_engine_config(path.read_text())
        kw = json.loads(Path(stem + ".megatron-core.json").read_text())
        ok = {"engine": "megatron", "world": world, "repo": str(RESULTS.parents[1]), "kwargs": kw}
        ok |= {"global_batch_size": cfg.batch, "micro_batch_size": cfg.micro_batch_size}
        return [ok, {**ok, "world": world + cfg.tensor * 3 + 1}]
    flags = read_engine_config(Path(stem + ".megatron-deepspeed.sh").read_text())
    groups = {
        "tensor_model_parallel_size": flags.tensor,
        "pipeline_model_parallel_size": flags.pipeline,
    }
    ok = {"engine": "deepspeed", "world": world, "config": json.loads(path.read_text())}
    ok["kwargs"] = groups
    return [ok, {**ok, "world": 2 * world}]


NEEDS = {"torchtitan": "torchtitan", "megatron": "megatron", "deepspeed": "deepspeed"}


@pytest.mark.parametrize("engine", ["torchtitan", "megatron", "deepspeed"])
def test_engines_accept_the_exports_at_scale(engine: str, tmp_path: Path) -> None:
    for module in {NEEDS[engine], "megatron"}:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module}: pip install 'shardplan[engines]'")
    rows = [r for r in _rows() if r["engine"] == engine]
    if not rows:
        pytest.skip("no benchmarks/results/engine_exports.json: run benchmarks/engine_exports.py")
    assert {r["model"] for r in rows} == {"gpt3-175b", "llama3-70b", "llama3-405b"}
    cases = [c for r in rows for c in _cases(r)]
    res = run_checks(cases, tmp_path)
    for i, row in enumerate(rows):
        good, bad = res[2 * i], res[2 * i + 1]
        assert good["ok"], (row["model"], good)
        assert not bad["ok"], (row["model"], bad)
