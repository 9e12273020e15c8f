"""A plan placed from the last plan its cache placed (cost/incremental.py) scores exactly as a
whole evaluation does, fails as it does, and is used where few ops change."""

from __future__ import annotations

import random

import pytest

import shardplan as sp
import shardplan.cost.evaluate as evaluate
from shardplan import zoo
from shardplan.cost import CostOptions
from shardplan.cost.evaluate import ScoreCache, evaluate_strategies
from shardplan.cost.incremental import row_readers
from shardplan.errors import ShardplanError
from shardplan.mesh import parse_mesh

CASES = [
    ("gpt2-small", {"layers": 2}, "2x4"),
    ("mixtral-8x7b", {"layers": 2}, "2x2x2"),
    ("llama", {"layers": 2}, "3x2"),
]


@pytest.mark.parametrize(("name", "sizes", "mesh_text"), CASES)
def test_sibling_plans_score_as_their_whole_evaluation(monkeypatch, name, sizes, mesh_text):
    graph = zoo.build(name, small=True, batch=24, **sizes)
    mesh, opts = parse_mesh(mesh_text), CostOptions()
    # plans that cut every op, in other ways: their ops mixed make sibling plans
    plans = [dict(sp.plan(graph, mesh, m).strategies) for m in ("data-parallel", "megatron")]
    assert plans[0] != plans[1]
    cache = ScoreCache(graph, mesh, opts)
    used = []
    real = evaluate.placed_since

    def counted(last, strategies, c):
        found = real(last, strategies, c)
        used.append(len(found[4]))
        return found

    monkeypatch.setattr(evaluate, "placed_since", counted)
    rng = random.Random(7)
    scored = 0
    for _ in range(30):
        plan = dict(rng.choice(plans))
        for op in rng.sample(sorted(plan), rng.randint(1, 5)):  # another plan's cut, or none
            plan[op] = rng.choice(plans)[op] if rng.random() < 0.5 else (None,) * len(mesh.rounds)
        try:
            mine = evaluate_strategies(graph, mesh, plan, opts, cache=cache)
        except ShardplanError as err:  # the whole evaluation fails alike
            with pytest.raises(type(err), match=str(err)[:40].replace("(", r"\(")):
                evaluate_strategies(graph, mesh, plan, opts)
            continue
        assert mine == evaluate_strategies(graph, mesh, plan, opts)  # a fresh cache: whole
        plans.append(plan)
        scored += 1
    assert scored >= 10 and len(used) >= 10  # the incremental path ran, on few rows
    assert min(used) < len(graph.ops) / 2


def test_the_rows_an_op_reaches():
    graph = zoo.build("gpt2-small", small=True, layers=1)
    readers = row_readers(graph)
    for i, op in enumerate(graph.ops):
        assert i in readers[i]
        for name in op.outputs:  # every reader of its results
            assert {j for j, _ in graph.consumers.get(name, ())} <= set(readers[i])
    # a parameter's first reader reaches every reader of it (their home is its layout)
    tied = [n for n, users in graph.consumers.items() if len({j for j, _ in users}) > 1]
    params = [n for n in tied if graph.tensors[n].role.name == "PARAMETER"]
    for name in params:
        first = graph.consumers[name][0][0]
        assert {j for j, _ in graph.consumers[name]} <= set(readers[first])
