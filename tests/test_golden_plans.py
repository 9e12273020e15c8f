"""Plans stay bit-identical across refactors: every zoo model (small) x meshes 8, 2x8 (D-Rec).

The expected plans were generated from the code before the issue-17 moves (commit 817c0d8) by
tests/data/regen_plans.py, the only sanctioned way to change them (see its docstring). A plan is
compared on its strategies, parameter layouts, status, notes and exact cost floats.
"""

import json
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(DATA))
import regen_plans  # noqa: E402

GOLDEN = json.loads(regen_plans.GOLDEN.read_text())


def test_golden_file_covers_every_model_and_mesh():
    import shardplan as sp

    expected = {f"{m}@{mesh}" for m in sp.zoo.MODELS for mesh in regen_plans.MESHES}
    assert set(GOLDEN) == expected


@pytest.mark.parametrize("key", sorted(GOLDEN))
def test_plan_is_unchanged(key):
    model, mesh = key.split("@")
    assert regen_plans.plan_record(model, mesh) == GOLDEN[key]
