"""The step search's own plans go to Megatron: `shardplan plan --method step --json` then
`shardplan export --to megatron` succeeds, and the flags say the plan's levers (sequence
parallelism, ZeRO-1, recomputation, interleaving) and the stage family the search recorded in its
note (tensor degree, expert / context ways) — on GPT-3-, Llama- and Mixtral-shaped models at
small widths where the search picks one engine layout for every stage."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from test_engines import run_checks  # tests/exporters is on sys.path (rootdir-less test dir)

from shardplan.cli.main import main
from shardplan.exporters import training_json
from shardplan.mesh import parse_mesh
from shardplan.training import TrainingPlan

CASES = {
    # id: (model and size flags, mesh, batch, memory); found by running the search (see report)
    "gpt3-sp": (["gpt3", "--layers", "4", "--hidden", "1024", "--heads", "16", "--seq", "1024"],
                "2x8", 8, "4GB"),
    "llama3-8b-tp": (["llama3-8b", "--layers", "4", "--hidden", "1024", "--heads", "16",
                      "--kv-heads", "4", "--ffn", "3584", "--vocab", "32000", "--seq", "1024"],
                     "2x8", 8, "4GB"),
    # mixtral-ep at batch 128: at 64 D-Rec's own stage plan now wins (step 24.5 -> 23.6 ms),
    # which Megatron cannot run; at 128 the search still picks Megatron EP8 (43.9 ms)
    "mixtral-ep": (["mixtral-8x7b", "--layers", "2", "--hidden", "512", "--heads", "8",
                    "--kv-heads", "4", "--ffn", "1024", "--vocab", "32000", "--seq", "1024"],
                   "2x8", 128, "8GB"),
    "gpt3-175b-8l-interleaved": (["gpt3", "--layers", "8", "--hidden", "12288", "--heads", "96"],
                                 "8x8", 64, "24GB"),
}  # fmt: skip


def _flags(text: str) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for line in text.replace("\\\n", "\n").splitlines():
        parts = line.split()
        if parts and parts[0].startswith("--"):
            out[parts[0]] = parts[1] if len(parts) > 1 else None
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Each case planned by `shardplan plan --method step --json` and exported with
    `shardplan export --to megatron` and `--to megatron-core`: (plan JSON, flags, kwargs)."""
    out = {}
    for case, (model, mesh, batch, memory) in CASES.items():
        d = tmp_path_factory.mktemp(case)
        plan_json, flags, kwargs = d / "plan.json", d / "flags.sh", d / "kwargs.json"
        argv = ["plan", *model, "--mesh", mesh, "--batch", str(batch), "--memory", memory]
        assert main([*argv, "--dtype", "bf16", "--method", "step", "--json", str(plan_json)]) == 0
        assert main(["export", str(plan_json), "--to", "megatron", "-o", str(flags)]) == 0
        assert main(["export", str(plan_json), "--to", "megatron-core", "-o", str(kwargs)]) == 0
        out[case] = (plan_json, flags, kwargs)
    return out


def _family(tp: TrainingPlan) -> tuple[int, bool, int, int]:
    """(t, SP, c, e) of the one Megatron family the search's note says ran every stage."""
    note = next(n for n in tp.notes if n.startswith("stage plans:"))
    family = re.match(r"stage plans: megatron t=(\d+)( \+SP)?( \+CP(\d+))?( \+EP(\d+))? on", note)
    assert family is not None, note
    return int(family[1]), bool(family[2]), int(family[4] or 1), int(family[6] or 1)


@pytest.mark.parametrize("case", sorted(CASES))
def test_search_plan_exports_to_megatron_with_its_levers(case: str, exported) -> None:
    model, mesh, batch, _ = CASES[case]
    plan_json, flags_sh, _ = exported[case]
    tp = training_json.from_json(json.loads(plan_json.read_text()))
    flags = _flags(flags_sh.read_text())
    lv = tp.stages[0].levers
    assert all(s.levers == lv for s in tp.stages)
    t, sp_on, cp, ep = _family(tp)
    assert int(flags["--tensor-model-parallel-size"] or 0) == t
    assert ("--sequence-parallel" in flags) == lv.sequence_parallel == sp_on
    assert int(flags.get("--context-parallel-size") or 1) == cp
    assert (cp > 1) == lv.context_parallel
    assert int(flags.get("--expert-model-parallel-size") or 1) == ep
    assert ("--num-experts" in flags) == model[0].startswith("mixtral")
    assert int(flags["--pipeline-model-parallel-size"] or 0) == tp.pipeline_stages
    assert int(flags.get("--num-virtual-stages-per-pipeline-rank") or 1) == tp.virtual_stages
    assert ("--use-distributed-optimizer" in flags) == (lv.zero == 1)
    assert flags.get("--recompute-granularity", "none") == lv.recompute.value
    # Megatron's own batch arithmetic: global = micro x data ways x micro-batches
    data = parse_mesh(mesh).size // (t * cp * tp.pipeline_stages)
    assert int(flags["--global-batch-size"] or 0) == batch
    assert int(flags["--micro-batch-size"] or 0) * data * tp.micro_batches == batch


def test_megatron_core_takes_the_search_plans(exported, tmp_path: Path) -> None:
    """megatron-core's own TransformerConfig and parallel groups take the exported arguments."""
    pytest.importorskip("megatron.core", reason="megatron-core: pip install 'shardplan[engines]'")
    cases, want = [], []
    for case in sorted(CASES):
        _, mesh, batch, _ = CASES[case]
        plan_json, flags_sh, kwargs = exported[case]
        tp = training_json.from_json(json.loads(plan_json.read_text()))
        t, _, cp, ep = _family(tp)
        cases.append(
            {
                "engine": "megatron",
                "repo": str(Path(__file__).resolve().parents[2]),
                "kwargs": json.loads(kwargs.read_text()),
                "world": parse_mesh(mesh).size,
                "global_batch_size": batch,
                "micro_batch_size": int(_flags(flags_sh.read_text())["--micro-batch-size"] or 0),
            }
        )
        data = parse_mesh(mesh).size // (t * cp * tp.pipeline_stages)
        vpp = tp.virtual_stages if tp.virtual_stages > 1 else None
        want.append((data, cp, ep, tp.micro_batches, vpp))
    for got, (data, cp, ep, m, vpp) in zip(run_checks(cases, tmp_path), want, strict=True):
        assert got["ok"], got
        assert (got["dp"], got["cp"], got["ep"], got["micro_batches"], got["vpp"]) == (
            data, cp, ep, m, vpp
        )  # fmt: skip


def test_torchtitan_target_runs_tensor_parallelism_with_sequence_parallel(tmp_path: Path) -> None:
    """`--target torchtitan` now searches t > 1 with the SP lever on (torchtitan's tensor
    parallelism); the export is accepted by torchtitan's config manager and ParallelDims."""
    plan_json, toml = tmp_path / "plan.json", tmp_path / "job.toml"
    model = ["gpt3", "--layers", "4", "--hidden", "1024", "--heads", "16", "--seq", "1024"]
    argv = ["plan", *model, "--mesh", "2x8", "--batch", "8", "--memory", "2GB", "--dtype", "bf16"]
    assert main([*argv, "--target", "torchtitan", "--json", str(plan_json)]) == 0
    assert main(["export", str(plan_json), "--to", "torchtitan", "-o", str(toml)]) == 0
    tp = training_json.from_json(json.loads(plan_json.read_text()))
    assert all(s.levers.sequence_parallel for s in tp.stages)
    text = toml.read_text()
    degree = int(re.search(r"tensor_parallel_degree = (\d+)", text)[1])  # type: ignore[index]
    assert degree > 1
    if importlib.util.find_spec("torchtitan") is None or importlib.util.find_spec("tyro") is None:
        return  # the engine's own check needs torchtitan and tyro ('shardplan[engines]')
    (got,) = run_checks([{"engine": "torchtitan", "world": 16, "path": str(toml)}], tmp_path)
    assert got["ok"], got
    assert got["tp"] == degree and got["tp"] * got["dp"] * got["pp"] * got["cp"] == 16
