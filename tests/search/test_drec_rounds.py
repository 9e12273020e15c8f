"""D-Rec's round pricer against the evaluator on multi-round meshes (hypothesis).

Every zoo model at test size, fp32 and bf16, both presets, training and inference, meshes of 2-3
rounds ("2x2", "4", "2x3", "8"). A random full plan (a random valid cut per op per round) is
priced round by round the way D-Rec prices it: `begin_round(r)`, `round_cost(r, decided)` with
the earlier rounds applied by `apply_round` (cuts, layouts, local sizes, all-reduce histories).
With "no cut" priced as its share of the final compute (`final_compute=True`), the sum over the
rounds plus the compute every op would do if cut in every round equals `evaluate_strategies`:
  * edges: each round pays the edge's price over rounds 0..r minus over 0..r-1, which
    telescopes to the whole edge (multi-round all-to-alls included);
  * all-reduces: a round's piece is priced as if the faster later rounds that can cut the op (or
    all of them: `hopeful`, MindSpore's assumption) shrink the operand, the backlog of an assumed
    round that does not is charged on the grown pieces;
  * a gradient another reader reduces is credited while both readers' layouts agree and owed
    back in the round where they part.
The redistribution part alone is also checked against the evaluator's redistribution terms.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardplan as sp
from shardplan.cost import CostOptions, evaluate_strategies
from shardplan.cost.work import ideal_compute
from shardplan.ir.op import Role
from shardplan.search.drec.costs import RoundCosts
from shardplan.sharding import cut_problem
from tests.search.test_drec_costs import _bytes
from tests.search.test_tables_vs_evaluator import GRAPHS, MODELS


def _edges(pricer: RoundCosts, decided: dict[int, str | None]) -> float:
    """The round's edge prices alone, as `round_cost` sums them (unit weights)."""
    graph, total = pricer.graph, 0.0
    for i, op in enumerate(graph.ops):
        for pos, name in enumerate(op.inputs):
            dst = pricer._in(i, decided[i], pos)
            p = graph.producer.get(name)
            if p is not None:
                src = pricer._out(p, decided[p], pricer.out_pos[name])
            elif graph.tensors[name].role is Role.PARAMETER:
                first, first_pos = graph.consumers[name][0]
                if first == i:
                    continue
                src = pricer._in(first, decided[first], first_pos)
            else:
                continue
            total += pricer._edge(src, dst, pricer._in_ctx[i][pos], pricer._form(name))
    return total


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    model=st.sampled_from(MODELS),
    nbytes=st.sampled_from([4, 2]),
    devices=st.sampled_from(["2x2", "4", "2x3", "8"]),
    preset=st.sampled_from(["shardplan", "mindspore"]),
    train=st.booleans(),
    hopeful=st.booleans(),
    data=st.data(),
)
def test_rounds_sum_to_the_evaluator(model, nbytes, devices, preset, train, hopeful, data):
    graph, mesh = GRAPHS[model, nbytes], sp.parse_mesh(devices)
    opts = CostOptions.make(preset, train)
    pricer = RoundCosts(graph, mesh, opts, 0.0, final_compute=True, hopeful=hopeful)
    rng = data.draw(st.randoms(use_true_random=False))  # uniform cuts: "no cut" runs too
    total = edges = 0.0
    for r, rnd in enumerate(mesh.rounds):
        pricer.begin_round(r)
        decided: dict[int, str | None] = {}
        for i, state in enumerate(pricer.states):
            valid = [
                c
                for c in pricer.candidates[i]
                if c is None or cut_problem(state.op, c, state.extents[c], rnd.q) is None
            ]
            decided[i] = rng.choice(valid)
        total += pricer.round_cost(r, decided)
        edges += _edges(pricer, decided)
        pricer.apply_round(r, decided)
    plan = {state.op.name: tuple(state.cuts) for state in pricer.states}
    devices_total = math.prod(rnd.q for rnd in mesh.rounds)
    cut_compute = sum(
        ideal_compute(op.flops, _bytes(graph, op, opts), devices_total, opts, mesh)
        for op in graph.ops
    )
    want = evaluate_strategies(graph, mesh, plan, opts)
    redistribution = want.comm.redistribution_fwd + want.comm.redistribution_bwd
    assert edges == pytest.approx(redistribution, rel=1e-9, abs=1e-15)
    assert total + cut_compute == pytest.approx(want.total, rel=1e-9, abs=1e-15)
