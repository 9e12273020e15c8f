"""verify_torch: the verdict of a distributed torch run (strict mode raises on a mismatch)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from shardplan import zoo  # noqa: E402
from shardplan.engines import torch_report as tr  # noqa: E402
from shardplan.errors import BackendError  # noqa: E402
from shardplan.fidelity.torch import verify_torch  # noqa: E402
from shardplan.search import plan as make_plan  # noqa: E402


def test_verify_torch_strict_raises_on_mismatch(monkeypatch):
    bad = tr.DistReport(
        "m", "drec", "4", (2, 2), 4, False, False, "float32", 1e-4, 1e-5,
        (tr.TensorError("loss", 1.0, 0.5, False),), 1.0, 0.5, first_mismatch="loss",
    )  # fmt: skip
    import shardplan.fidelity.torch as fidelity_torch

    monkeypatch.setattr(fidelity_torch, "run_distributed", lambda *a, **k: bad)
    p = make_plan(zoo.build("mlp", small=True), "4", method="data-parallel")
    assert verify_torch(p) is bad
    with pytest.raises(BackendError, match="MISMATCH"):
        verify_torch(p, strict=True)
    assert "MISMATCH" in bad.text() and bad.to_dict()["first_mismatch"] == "loss"
