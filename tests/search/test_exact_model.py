"""The exact methods' pairwise cost model: gradient-credit ("share") tables and the entry limit."""

import numpy as np
import pytest

import shardplan as sp
from shardplan.cost import CostOptions
from shardplan.cost.evaluate import previous_consumer, share_credit
from shardplan.cost.terms import reduces
from shardplan.errors import SolverError
from shardplan.ir.graph import Graph
from shardplan.mesh import parse_mesh
from shardplan.search.exact.model import _Builder, _classes, _compress
from shardplan.search.exact.space import build_space
from shardplan.sharding import operand_layout

OPTS = CostOptions.make()


def _share_pairs(graph: Graph) -> list[tuple[str, tuple[int, int], tuple[int, int]]]:
    """(tensor, previous consumer, consumer) of every share term between two ops."""
    out = []
    for ci, op in enumerate(graph.ops):
        for c_pos, tensor in enumerate(op.inputs):
            prev = previous_consumer(graph, tensor, ci, c_pos)
            if prev is not None and prev[0] != ci:
                out.append((tensor, prev, (ci, c_pos)))
    return out


def _dense_share_table(builder: _Builder, tensor: str, prev, cur):
    """The share table as a dense strategies x classes matrix, classed afterwards: the
    straightforward construction the builder's row-by-row classing must reproduce."""
    graph, mesh = builder.graph, builder.mesh
    grad = tensor in graph.requires_grad
    (pi, p_pos), (ci, c_pos) = prev, cur
    p_op, c_op = graph.ops[pi], graph.ops[ci]

    def signature(op, s, pos):
        dims = op.signature.inputs[pos]
        return operand_layout(op, s, pos), tuple(
            reduces(op, d, dims, False, grad, OPTS.train) for d in s
        )

    p_strategies = builder.space.strategies[pi]
    u_class, u_keys = _classes([signature(p_op, s, p_pos) for s in p_strategies])
    rep = {int(c): s for s, c in reversed(list(zip(p_strategies, u_class, strict=True)))}
    c_strategies = builder.space.strategies[ci]
    columns = np.zeros((len(c_strategies), len(u_keys)))
    for t, s in enumerate(c_strategies):
        layout, mask = signature(c_op, s, c_pos)
        for c, (u_layout, u_mask) in enumerate(u_keys):
            both = tuple(a and b for a, b in zip(u_mask, mask, strict=True))
            if u_layout == layout and any(both):
                columns[t, c] = share_credit(
                    graph, tensor, (p_op, p_pos, rep[c]), (c_op, c_pos, s), mesh, OPTS
                ).total
    v_class, v_keys = _classes([tuple(row) for row in columns])
    table = np.array(v_keys, dtype=float).reshape(len(v_keys), len(u_keys)).T
    return _compress(table, u_class, v_class)


def _builder(graph: Graph, mesh: str, max_entries: int | None) -> _Builder:
    space = build_space(graph, parse_mesh(mesh))
    return _Builder(space, OPTS, None, max_entries, "ilp")


@pytest.mark.parametrize(
    ("model", "sizes", "mesh"),
    [("gpt2-small", {"layers": 1}, "2x3"), ("moe", {}, "4"), ("resnet50", {}, "2x2")],
)
def test_share_tables_match_the_dense_construction(model, sizes, mesh):
    graph = sp.zoo.build(model, small=True, **sizes)
    builder = _builder(graph, mesh, None)
    pairs = _share_pairs(graph)
    assert pairs, "the model has tensors read by two ops"
    for tensor, prev, cur in pairs[:6]:
        table, uc, vc = builder._share_table(tensor, prev, cur, ("test", tensor, prev, cur))
        want, want_uc, want_vc = _dense_share_table(builder, tensor, prev, cur)
        # the same credit for every pair of strategies, however the classes are numbered
        np.testing.assert_allclose(table[uc][:, vc], want[want_uc][:, want_vc], rtol=0, atol=0)
        assert table.shape == want.shape


def test_a_share_table_past_the_entry_limit_is_refused_before_it_is_built():
    graph = sp.zoo.build("gpt2-small", small=True, layers=1)
    tensor, prev, cur = _share_pairs(graph)[0]
    builder = _builder(graph, "2x3", 1)
    with pytest.raises(SolverError, match=rf"{tensor!r} alone needs \d+ or more x \d+"):
        builder._share_table(tensor, prev, cur, ("test",))
    assert builder.entries == 0  # nothing counted: the table was never made
