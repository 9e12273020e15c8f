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


@pytest.mark.skipif(not (workers.os.cpu_count() or 1) > 1, reason="one core: no worker")
def test_the_next_group_is_queued_before_the_current_one_is_priced(monkeypatch):
    events: list[tuple[str, object]] = []
    submit, evaluate = workers.SegmentWorkers.submit, step_search._Search.evaluate

    def submitted(self, key, graph, mesh, opts):
        events.append(("submit", (key[0], key[2])))  # stage mesh, micro-batches
        submit(self, key, graph, mesh, opts)

    def evaluated(self, layout, say):
        smesh = step_search.stage_mesh(self.mesh, layout.stages)
        events.append(("evaluate", (smesh.shape, layout.micro_batches)))
        return evaluate(self, layout, say)

    monkeypatch.setattr(workers.SegmentWorkers, "submit", submitted)
    monkeypatch.setattr(step_search._Search, "evaluate", evaluated)
    _plan(monkeypatch, 0)
    evaluations = [what for kind, what in events if kind == "evaluate"]
    assert len(set(evaluations)) > 1
    first = events.index(("evaluate", evaluations[0]))
    queued = {what for kind, what in events[:first] if kind == "submit"}
    # the first group's segments and another group's, before the first layout is priced
    assert evaluations[0] in queued and len(queued) > 1


@pytest.mark.skipif(not (workers.os.cpu_count() or 1) > 1, reason="one core: no worker")
def test_a_smaller_model_starts_the_worker_once_a_layout_proves_slow(monkeypatch):
    starts = []
    real = workers.SegmentWorkers.start

    def recorded(self):
        real(self)
        starts.append(self.active)

    monkeypatch.setattr(workers.SegmentWorkers, "start", recorded)
    monkeypatch.setattr(step_search, "SLOW_LAYOUT", 3600.0)  # no layout that slow: no worker
    alone = _plan(monkeypatch, 10**9)
    assert starts == []
    monkeypatch.setattr(step_search, "SLOW_LAYOUT", 0.0)  # every layout slow: started late
    assert _plan(monkeypatch, 10**9) == alone
    assert starts == [True]
