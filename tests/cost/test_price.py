"""`cost.price`: one pass over an op's operands gives the same floats as the evaluator's
reference definitions (operand_layout, op_pieces, forward_compute, op_intra with shared rounds),
and the evaluator's cached walk the same breakdown as a cold one."""

from dataclasses import replace

import pytest

from shardplan import zoo
from shardplan.cost import CostOptions, ScoreCache, evaluate_strategies
from shardplan.cost.backward import backward_bytes
from shardplan.cost.evaluate import op_intra, previous_consumer, share_credit
from shardplan.cost.presets import PRESETS
from shardplan.cost.price import op_compute, price_op, shared_intra
from shardplan.cost.terms import compute_cost, local_bytes
from shardplan.cost.work import forward_compute, op_pieces
from shardplan.cost.zero import zero_params, zero_steps
from shardplan.ir.segments import segments
from shardplan.mesh import parse_mesh
from shardplan.search import experts
from shardplan.sharding import operand_layout, operand_layouts, resolved


def _cases():
    g = zoo.build("gpt3", **{**dict(zoo.MODELS["gpt3"].small), "layers": 2})
    for text in ("8", "2x4", "2x3"):
        mesh = parse_mesh(text)
        for st in (experts.megatron(g, mesh), experts.data_parallel(g, mesh)):
            yield g, mesh, {k: tuple(v) for k, v in st.items()}


OPTIONS = (
    CostOptions.make(dtype="bf16"),
    CostOptions(train=False),
    CostOptions(preset=PRESETS["mindspore"]),
    CostOptions(zero=2),
)


@pytest.mark.parametrize("opts", OPTIONS)
def test_price_matches_the_reference_definitions(opts):
    for g, mesh, st in _cases():
        for op in g.ops:
            s = st[op.name]
            price = price_op(g, op, s, mesh, opts)
            ins, outs = operand_layouts(op, s)
            assert ins == tuple(operand_layout(op, s, i) for i in range(len(op.inputs)))
            assert outs == tuple(operand_layout(op, s, i, True) for i in range(len(op.outputs)))
            assert price.resolved == tuple(resolved(x) for x in outs)
            assert price.intra == op_intra(g, op, s, mesh.rounds, opts)
            assert price.forward == forward_compute(g, op, s, mesh, opts)
            pin, pout = op_pieces(g, op, s, mesh.rounds, opts)
            assert [p.nbytes for p in (*pin, *pout)] == [
                local_bytes(g, n, lay, mesh.rounds, opts)
                for n, lay in zip((*op.inputs, *op.outputs), (*ins, *outs), strict=True)
            ]
            parts = 1
            for r, cut in zip(mesh.rounds, s, strict=True):
                parts *= r.q if cut is not None else 1
            nbytes = sum(p.nbytes for p in (*pin, *pout))
            bwd = backward_bytes(op.kind, pin, pout)
            assert price.compute == compute_cost(op.flops / parts, nbytes, opts, mesh, bwd)
            assert op_compute(g, op, s, mesh, opts) == price.compute  # the floor polish tests


@pytest.mark.parametrize("opts", OPTIONS[:1] + OPTIONS[2:])
def test_shared_rounds_repriced_alone_equal_op_intra(opts):
    seen = 0
    for g, mesh, st in _cases():
        for index, op in enumerate(g.ops):
            for pos, name in enumerate(op.inputs):
                prev = previous_consumer(g, name, index, pos)
                if prev is None:
                    continue
                p_op = g.ops[prev[0]]
                credit = share_credit(
                    g, name, (p_op, prev[1], st[p_op.name]), (op, pos, st[op.name]), mesh, opts
                )
                cache = ScoreCache(g, mesh, opts)
                prior = (p_op, prev[1], st[p_op.name])
                assert cache.credit(name, prior, (op, pos, st[op.name]), cache.classes[index]) == (
                    credit
                )
                shared = [(pos, r) for r in range(len(mesh.rounds))]
                price = price_op(g, op, st[op.name], mesh, opts)
                assert shared_intra(op, st[op.name], mesh.rounds, price, shared, opts) == (
                    op_intra(g, op, st[op.name], mesh.rounds, opts, shared)
                )
                seen += 1
    assert seen > 0


def test_a_shared_cache_scores_like_a_fresh_one():
    opts = CostOptions.make(dtype="bf16")
    for g, mesh, st in _cases():
        cache = ScoreCache(g, mesh, opts)
        evaluate_strategies(g, mesh, experts.data_parallel(g, mesh), opts, None, cache)
        assert evaluate_strategies(g, mesh, st, opts, None, cache) == evaluate_strategies(
            g, mesh, st, opts
        )


def test_sub_graphs_sharing_a_price_table_score_like_fresh_caches():
    from shardplan.cost.evaluate import PriceTable
    from shardplan.ir.segments import subgraph

    opts = CostOptions.make(dtype="bf16")
    for g, mesh, st in _cases():
        table = PriceTable(mesh, opts)
        segs = segments(g)
        scored = 0
        # overlapping ranges: a received activation in one is an op result in another
        for a, b in [(0, len(segs)), (1, len(segs) - 1), (2, len(segs)), (0, 3)]:
            sub = subgraph(g, segs[a].start, segs[b - 1].stop)
            scored += len(sub.ops)
            mine = {op.name: st[op.name] for op in sub.ops}
            shared = evaluate_strategies(
                sub, mesh, mine, opts, None, ScoreCache(sub, mesh, opts, table)
            )
            assert shared == evaluate_strategies(sub, mesh, mine, opts)
        assert len(table.ids) < len(g.ops) < scored  # one class per repeated op, across graphs
    with pytest.raises(ValueError, match="one mesh"):
        ScoreCache(g, parse_mesh("4"), opts, PriceTable(parse_mesh("8"), opts))


def test_zero_steps_with_known_params_and_block_starts_by_class():
    from shardplan.cost.step import block_starts

    opts = replace(CostOptions.make(dtype="bf16"), zero=0)
    for g, mesh, st in _cases():
        params = zero_params(g, mesh.rounds, st, True)
        assert zero_steps(g, mesh.rounds, st, opts, params) == zero_steps(g, mesh.rounds, st, opts)
        segs = segments(g)
        cache = ScoreCache(g, mesh, opts)
        assert block_starts(g, segs, cache.classes) == block_starts(g, segs)


def test_saved_bytes_from_cached_layouts_and_sizes():
    from shardplan.cost.step import saved_bytes

    opts = CostOptions.make(dtype="bf16")
    for g, mesh, st in _cases():
        cache = ScoreCache(g, mesh, opts)
        classes = zip(g.ops, cache.classes, strict=True)
        prices = [cache.price(op, c, st[op.name]) for op, c in classes]
        layouts = [(p.inputs, p.resolved) for p in prices]
        assert saved_bytes(g, {}, mesh.rounds, opts, layouts, cache.local_bytes) == saved_bytes(
            g, st, mesh.rounds, opts
        )


def test_ring_terms_read_off_the_cache_equal_the_term_functions():
    from shardplan.cost.evaluate import edge_terms, output_layouts, unary_terms
    from shardplan.cost.sequence import ring_terms, tensor_rounds
    from shardplan.search.experts import context_parallel

    opts = CostOptions.make(dtype="bf16")
    seen = 0
    for g, mesh, st in _cases():
        st = context_parallel(g, mesh, st, [0])
        out_layout = output_layouts(g, st)
        tensor = set(tensor_rounds(g, mesh, st))
        gather = scatter = fwd = bwd = exposed_fwd = exposed_bwd = 0.0  # term by term
        for op in g.ops:
            mine = theirs = 0.0  # this reader's gathers forward and backward
            for i, name in enumerate(op.inputs):
                src, dst = out_layout.get(name), operand_layout(op, st[op.name], i)
                if src is None:
                    continue
                rounds = {r for r, (s, d) in enumerate(zip(src, dst, strict=True)) if s >= 0 > d}
                if rounds and not rounds & tensor:  # the ring's rounds: data-parallel only
                    terms = edge_terms(g, name, src, dst, mesh.rounds, opts)
                    mine += terms.redistribution_fwd
                    theirs += terms.redistribution_bwd
            if mine or theirs:
                intra, compute = unary_terms(g, op, st[op.name], mesh, opts)
                forward = forward_compute(g, op, st[op.name], mesh, opts)
                gather, scatter = gather + mine, scatter + theirs + intra.intra_bwd
                fwd, bwd = fwd + forward, bwd + (compute - forward)
                exposed_fwd += max(0.0, mine - forward)
                exposed_bwd += max(0.0, 2 * mine - (compute - forward))
        ring = ring_terms(g, mesh, st, opts)
        assert (ring.gather_s, ring.scatter_s, ring.readers_fwd_s, ring.readers_bwd_s) == (
            pytest.approx(gather),
            pytest.approx(scatter),
            pytest.approx(fwd),
            pytest.approx(bwd),
        )
        assert ring.exposed_fwd_s == pytest.approx(exposed_fwd, abs=1e-15)
        assert ring.exposed_bwd_s == pytest.approx(exposed_bwd, abs=1e-15)
        seen += gather > 0
    assert seen > 0
