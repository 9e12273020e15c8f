"""The step search's own plans go to Megatron: `shardplan plan --method step --json` then
`shardplan export --to megatron` succeeds, and the flags say the plan's levers (sequence
parallelism, ZeRO-1, recomputation, interleaving) and the stage family the search recorded in its
note (tensor degree, expert / context ways) — on GPT-3-, Llama- and Mixtral-shaped models at
small widths where the search picks one engine layout for every stage."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from shardplan.cli.main import main
from shardplan.exporters import training_json
from shardplan.mesh import parse_mesh

CASES = {
    # id: (model and size flags, mesh, batch, memory); found by running the search (see report)
    "gpt3-sp": (["gpt3", "--layers", "4", "--hidden", "1024", "--heads", "16", "--seq", "1024"],
                "2x8", 8, "4GB"),
    "llama3-8b-tp": (["llama3-8b", "--layers", "4", "--hidden", "1024", "--heads", "16",
                      "--kv-heads", "4", "--ffn", "3584", "--vocab", "32000", "--seq", "1024"],
                     "2x8", 8, "4GB"),
    "mixtral-ep": (["mixtral-8x7b", "--layers", "2", "--hidden", "512", "--heads", "8",
                    "--kv-heads", "4", "--ffn", "1024", "--vocab", "32000", "--seq", "1024"],
                   "2x8", 64, "8GB"),
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


@pytest.mark.parametrize("case", sorted(CASES))
def test_search_plan_exports_to_megatron_with_its_levers(case: str, tmp_path: Path) -> None:
    model, mesh, batch, memory = CASES[case]
    plan_json, out = tmp_path / "plan.json", tmp_path / "flags.sh"
    argv = ["plan", *model, "--mesh", mesh, "--batch", str(batch), "--memory", memory]
    assert main([*argv, "--dtype", "bf16", "--method", "step", "--json", str(plan_json)]) == 0
    assert main(["export", str(plan_json), "--to", "megatron", "-o", str(out)]) == 0
    tp = training_json.from_json(json.loads(plan_json.read_text()))
    flags = _flags(out.read_text())
    lv = tp.stages[0].levers
    assert all(s.levers == lv for s in tp.stages)
    note = next(n for n in tp.notes if n.startswith("stage plans:"))
    family = re.match(r"stage plans: megatron t=(\d+)( \+SP)?( \+CP(\d+))?( \+EP(\d+))? on", note)
    assert family is not None, note  # one Megatron family on every stage
    t, cp, ep = int(family[1]), int(family[4] or 1), int(family[6] or 1)
    assert int(flags["--tensor-model-parallel-size"] or 0) == t
    assert ("--sequence-parallel" in flags) == lv.sequence_parallel == bool(family[2])
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
