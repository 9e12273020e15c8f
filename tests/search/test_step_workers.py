"""D-Rec on the stage segments in a worker process (search/step/workers.py): the same plan as
in process, and the same when the worker cannot run."""

from __future__ import annotations

import pytest

import shardplan as sp
import shardplan.search.step.search as step_search
import shardplan.search.step.workers as workers
from shardplan import zoo
from shardplan.exporters.training_json import to_json


def _plan(monkeypatch, min_ops: int) -> str:
    monkeypatch.setattr(step_search, "MIN_OPS", min_ops)
    build = lambda b: zoo.build("gpt3", small=True, layers=6, batch=b)  # noqa: E731
    tp = sp.plan(build, "4x4", "step", batch=32, dtype="bf16", memory=2e6)
    return to_json(tp).replace(f'"search_seconds": {tp.search_seconds}', "")


@pytest.mark.skipif(not (workers.os.cpu_count() or 1) > 1, reason="one core: no worker")
def test_a_worker_plans_the_segments_as_the_search_would(monkeypatch):
    started = []
    real = workers.SegmentWorkers.__init__

    def recorded(self, enabled):
        real(self, enabled)
        started.append(self.active)

    monkeypatch.setattr(workers.SegmentWorkers, "__init__", recorded)
    alone = _plan(monkeypatch, 10**9)
    beside = _plan(monkeypatch, 0)
    assert started == [False, True]  # the second search ran D-Rec in a worker
    assert beside == alone


def test_a_worker_that_dies_leaves_the_segments_to_the_search(monkeypatch):
    alone = _plan(monkeypatch, 10**9)
    monkeypatch.setattr(workers, "_SERVE", "import sys; sys.exit(3)")  # ends at once
    assert _plan(monkeypatch, 0) == alone
