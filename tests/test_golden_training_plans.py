"""Training plans stay bit-identical across refactors: GPT-3-shaped decoders on four meshes with
budgets (the training-step search) and two Megatron recipes.

The expected plans were generated from main 86a2cb8 (before the issue-22 moves) by
tests/data/regen_training_plans.py, the only sanctioned way to change them.
"""

import json
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parent / "data"
sys.path.insert(0, str(DATA))
import regen_training_plans as regen  # noqa: E402

GOLDEN = json.loads(regen.GOLDEN.read_text())


def test_golden_file_covers_every_case():
    assert set(GOLDEN) == set(regen.cases())


@pytest.mark.parametrize("key", sorted(GOLDEN))
def test_training_plan_is_unchanged(key):
    assert regen.record(regen.plan_of(key)) == GOLDEN[key]
