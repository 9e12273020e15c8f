"""Rules of the explainer (shardplan.fidelity.explain) on plans whose HLO shows the pattern."""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")  # fixture devices8: tests/conftest.py

from shardplan import zoo  # noqa: E402
from shardplan.fidelity import verify as v  # noqa: E402
from shardplan.search import plan  # noqa: E402


def test_tied_fsdp_table_gathered_once_is_a_shared_parameter_gather(devices8):
    # GPT-2's tied `wte` [128, 64] is stored split by FSDP and read whole by the lookup and the
    # LM head; XLA gathers it once (at the lookup) and reuses it, the model charges both reads
    g = zoo.build("gpt2-small", small=True, batch=8)
    report = v.verify_plan(plan(g, "8", "fsdp"), check_numerics=False)
    whole = 128 * 64 * 4 * 7 / 8  # one ring all-gather of the table over 8 devices
    diffs = {(d.op, d.kind): d for d in report.differences}
    head = diffs[("lm_head", "all-gather")]
    assert (head.predicted, head.measured) == (whole, 0)
    assert head.causes == ("shared-parameter-gather",) and head.explained
    assert ("tok_emb", "all-gather") not in diffs  # the lookup's gather is measured as predicted
