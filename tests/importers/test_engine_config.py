"""`--from-config` of DeepSpeed configs written for the Hugging Face Trainer: its "auto" values
read as the Trainer fills them (importers/engine_config.py `_hf_auto`)."""

from __future__ import annotations

import json

import pytest

from shardplan.cli.main import main
from shardplan.errors import ArgumentError
from shardplan.importers.engine_config import read_engine_config

PLAN = ["plan", "gpt2-small", "--small", "--layers", "4", "--batch", "32", "--mesh", "4x4"]
PLAN += ["--dtype", "bf16", "-q"]
HIDDEN = 64  # gpt2-small --small


def _trainer_config(**values):
    """A ZeRO-3 config as the Trainer's documentation writes it, `values` in place of autos."""
    auto = "auto"
    return {
        "bf16": {"enabled": values.get("bf16", auto)},
        "zero_optimization": {
            "stage": 3,
            "overlap_comm": True,
            "reduce_bucket_size": auto,
            "stage3_prefetch_bucket_size": values.get("prefetch", auto),
            "stage3_param_persistence_threshold": auto,
        },
        "gradient_accumulation_steps": auto,
        "train_batch_size": values.get("batch", auto),
        "train_micro_batch_size_per_gpu": values.get("micro", 2),
    }


def test_trainer_autos_read_as_the_trainer_fills_them(tmp_path, capsys):
    """The batch from --batch, the precision from --dtype, the stage-3 prefetch on (the Trainer
    writes int(0.9 hidden^2) > 0): the step of the config with those numbers written in."""
    read = read_engine_config(json.dumps(_trainer_config()))
    assert read.batch is None and read.dtype is None and read.prefetch is None
    assert any("train_batch_size (--batch)" in n and "bf16.enabled" in n for n in read.notes)
    steps = []
    filled = _trainer_config(bf16=True, batch=32, prefetch=int(0.9 * HIDDEN * HIDDEN))
    for cfg in (_trainer_config(), filled):
        path, out = tmp_path / "ds.json", tmp_path / "scored.json"
        path.write_text(json.dumps(cfg))
        assert main([*PLAN, "--from-config", str(path), "--json", str(out)]) == 0
        capsys.readouterr()
        steps.append(json.loads(out.read_text())["step"]["step_s"])
    assert steps[0] == steps[1]


def test_an_auto_micro_batch_asks_for_the_trainers_number():
    with pytest.raises(ArgumentError, match="per_device_train_batch_size"):
        read_engine_config(json.dumps(_trainer_config(micro="auto")))
