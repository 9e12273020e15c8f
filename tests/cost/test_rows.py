"""The evaluator's rows (cost/rows.py): the breakdown's fields are the ops' terms added in order."""

import pytest

import shardplan as sp
from shardplan.cost import CostOptions
from shardplan.cost.evaluate import op_terms, output_layouts, param_homes
from shardplan.cost.terms import ZERO
from shardplan.search import plan


@pytest.mark.parametrize("method", ["megatron", "data-parallel", "drec"])
@pytest.mark.parametrize("train", [True, False])
def test_the_breakdown_adds_each_ops_terms_in_graph_order(method, train):
    """`Rows.field_sums` (fields summed column by column, all-zero columns skipped) equals adding
    every op's CommTerms, own then redistribution, op after op, to the last bit; and the
    compute is the rows' compute added in order."""
    g = sp.zoo.build("gpt2-small", small=True, batch=8)
    p = plan(g, "2x4", method, train=train)
    opts = CostOptions.make("shardplan", train)
    homes = param_homes(g, p.strategies, p.param_layouts)
    terms = op_terms(g, p.mesh, p.strategies, opts, homes, output_layouts(g, p.strategies))
    comm, compute = ZERO, 0.0
    for t in terms:
        comm = comm + t.intra + t.redistribution
        compute += t.compute
    assert p.cost.comm == comm
    assert p.cost.compute == compute
    assert p.cost.total == comm.total + compute
    assert p.cost.comm.halo == 0.0 and p.cost.comm.all_to_all_bytes == 0.0  # skipped columns
