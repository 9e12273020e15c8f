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


def _plain_gpt(layers: int = 6, hidden: int = 32, vocab: int = 64):
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden) for _ in range(4))
            self.fc, self.proj = nn.Linear(hidden, 4 * hidden), nn.Linear(4 * hidden, hidden)

        def forward(self, x):
            y = self.ln1(x)
            q, k, v = self.q(y), self.k(y), self.v(y)
            x = x + self.o(torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v)
            return x + self.proj(torch.relu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte = nn.Embedding(vocab, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln, self.head = nn.LayerNorm(hidden), nn.Linear(hidden, vocab, bias=False)

        def forward(self, ids):
            x = self.wte(ids)
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    return GPT()


@pytest.fixture(scope="module")
def graph() -> sp.Graph:
    ids = torch.zeros(8, 16, dtype=torch.long)
    return sp.from_torch(_plain_gpt(), (ids,))


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
