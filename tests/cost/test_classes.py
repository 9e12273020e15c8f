"""The per-op facts the evaluator's caches key on (cost/classes.py), and the evaluator's sums.

Each fast path is checked against the plain definition it replaces, written out here: op classes
numbered by `op_key` one op at a time, previous readers by `previous_consumer` one operand at a
time, the breakdown's communication fields by adding the ops' CommTerms in graph order.
"""

from __future__ import annotations

import pytest

from shardplan import zoo
from shardplan.cost import CostOptions, ScoreCache, evaluate_strategies
from shardplan.cost.classes import op_classes, op_key, previous_consumer, previous_consumers
from shardplan.cost.evaluate import PriceTable, op_terms, output_layouts, param_homes
from shardplan.cost.terms import ZERO
from shardplan.ir import GraphBuilder
from shardplan.mesh import parse_mesh
from shardplan.search.drec.fold import find_fold, op_labels
from shardplan.search.drec.search import drec

MODELS = ("gpt3", "bert-base", "resnet50", "wide-deep")


def _twice_read():
    """One tensor read twice by one op and once more later (previous readers in one op)."""
    b = GraphBuilder("twice")
    x = b.input("x", (8, 8))
    y = b.apply("add", x, x, name="double")
    b.apply("mul", y, x, name="again")
    return b.build()


@pytest.mark.parametrize("model", MODELS)
def test_op_classes_number_op_keys_in_order_of_first_appearance(model):
    graph = zoo.build(model, small=True)
    ids: dict[tuple[object, ...], int] = {}
    plain = [ids.setdefault(op_key(graph, op), len(ids)) for op in graph.ops]
    assert op_classes(graph, {}) == plain
    assert op_labels(graph) == plain  # the fold's labels are the evaluator's classes


@pytest.mark.parametrize("graph", [zoo.build(m, small=True) for m in MODELS] + [_twice_read()])
def test_previous_consumers_in_one_pass_are_previous_consumer(graph):
    plain = [
        [previous_consumer(graph, name, i, pos) for pos, name in enumerate(op.inputs)]
        for i, op in enumerate(graph.ops)
    ]
    assert previous_consumers(graph) == plain


def test_find_fold_with_a_shared_tables_classes_is_the_same_fold():
    """A ScoreCache on a PriceTable another graph filled numbers classes otherwise; the fold
    reads only their equality, so it finds the same run and reduced graph."""
    graph, mesh, opts = zoo.build("gpt3", small=True, layers=8), parse_mesh("8"), CostOptions.make()
    table = PriceTable(mesh, opts)
    ScoreCache(zoo.build("bert-base", small=True), mesh, opts, table)  # takes the first ids
    cache = ScoreCache(graph, mesh, opts, table)
    assert cache.classes != op_labels(graph)
    plain, given = find_fold(graph), find_fold(graph, cache.classes)
    assert plain is not None and given is not None
    assert (plain.start, plain.period, plain.count) == (given.start, given.period, given.count)
    assert [op.name for op in plain.reduced.ops] == [op.name for op in given.reduced.ops]
    assert plain.labels == given.labels


@pytest.mark.parametrize(
    ("model", "mesh", "train"), [("gpt3", "2x4", True), ("resnet50", "6", False)]
)
def test_the_breakdown_sums_the_ops_terms_in_graph_order(model, mesh, train):
    """Bit for bit: each communication field is the ops' intra then redistribution terms added in
    graph order, the compute their compute, as adding their CommTerms one op at a time."""
    graph, m = zoo.build(model, small=True), parse_mesh(mesh)
    opts = CostOptions.make(train=train)
    strategies = drec(graph, m, opts)
    cost = evaluate_strategies(graph, m, strategies, opts)
    homes, layouts = param_homes(graph, strategies), output_layouts(graph, strategies)
    comm, compute, rows = ZERO, 0.0, []
    for t in op_terms(graph, m, strategies, opts, homes, layouts):
        comm = comm + t.intra + t.redistribution
        compute += t.compute
        rows.append((t.op.name, t.compute, t.intra.total, t.redistribution.total))
    assert cost.comm == comm
    assert cost.compute == compute
    assert [(r.name, r.compute, r.intra, r.redistribution) for r in cost.ops] == rows
