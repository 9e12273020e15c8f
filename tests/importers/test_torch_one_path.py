"""One import path for planning and running a torch module (issue 27): `from_torch` (planning) and
`trace_torch` (what `parallelize` and `verify --user-module` run) translate the same program, so
a plan made by `from_torch` on the same inputs is always for the graph that runs. Checked on the
hand-written model of tests/torch/user_model.py (split, transpose, softmax: the ops whose core-ATen
forms differ from export's own) and on every architecture of benchmarks/import_coverage.py."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from shardplan.importers.torch import from_torch, trace_torch  # noqa: E402
from shardplan.torch.parallelize import check_same_graph  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _same(module, args):
    planned = from_torch(module, args)
    traced = trace_torch(module, args).result.graph
    check_same_graph(traced, planned)  # what parallelize checks a given plan with
    assert [(o.name, o.kind) for o in planned.ops] == [(o.name, o.kind) for o in traced.ops]
    assert {n: t.shape for n, t in planned.tensors.items()} == {
        n: t.shape for n, t in traced.tensors.items()
    }
    return planned


def test_the_hand_written_model_plans_and_runs_one_graph():
    sys.path.insert(0, str(ROOT / "tests" / "torch"))
    from user_model import build

    graph = _same(*build())
    kinds = {op.kind for op in graph.ops}
    assert {"softmax", "transpose"} <= kinds  # export's own forms, not _softmax / permute


def _architectures():
    pytest.importorskip("transformers")
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import import_coverage

    return import_coverage.ARCHITECTURES


@pytest.mark.parametrize("index", range(15))
def test_every_import_coverage_model_plans_and_runs_one_graph(index):
    archs = _architectures()
    if index >= len(archs):
        pytest.skip("fewer architectures")
    name, _, build = archs[index]
    torch.manual_seed(0)
    built = build()
    if len(built) == 3:  # a published config on the meta device (issue 25): nothing to run
        pytest.skip(f"{name} is built on the meta device from its config file")
    module, args = built
    _same(module.eval(), args)
