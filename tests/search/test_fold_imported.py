"""Folding an imported graph: blocks found by structure, not names (a torch GPT of plain
nn.Linear blocks whose attention is written `softmax(q @ k.T)`, its embedding one op)."""

from __future__ import annotations

import pytest

import shardplan as sp
from shardplan.cost import CostOptions
from shardplan.search.drec.flex import build_flex_graph
from shardplan.search.drec.fold import find_fold
from shardplan.search.drec.search import drec, drec_folded

torch = pytest.importorskip("torch")

from torch_gpts import GPT  # noqa: E402


@pytest.fixture(scope="module")
def graph() -> sp.Graph:
    ids = torch.zeros(8, 16, dtype=torch.long)
    return sp.from_torch(GPT(6, 32, 4, ffn=128, vocab=64, seq=16, plain=True), (ids,))


def test_the_blocks_of_an_imported_gpt_fold(graph):
    fold = find_fold(graph)
    assert fold is not None and fold.count == 6
    # the reduced graph's own walk from the head runs through the 4 kept blocks into the
    # embedding; the full graph's stops inside the run, so the placed flex graph is used
    assert not fold.local(build_flex_graph(fold.reduced))
    assert fold.flex_graph() is not None


@pytest.mark.parametrize("mesh", ["8", "2x4"])
def test_the_folded_plan_is_the_full_search_plan_and_the_notes_say_so(graph, mesh):
    opts = CostOptions.make()
    strategies, fold = drec_folded(graph, sp.parse_mesh(mesh), opts)
    assert fold is not None
    assert strategies == drec(graph, sp.parse_mesh(mesh), opts, fold=False)
    plan = sp.plan(graph, mesh)
    assert any(n.startswith("repeated blocks folded: 4 of 6 identical blocks") for n in plan.notes)
