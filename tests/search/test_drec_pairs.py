"""D-Rec's pair moves (`search/drec/polish.py`: `_pair_moves`, `pair_polished`). BERT-base (one
layer, batch 12) on 18 = 2 x 3 x 3: D-Rec cut the position embedding lookup and the add reading
it along the batch, all-reducing the table's gradient; the optimum cuts the lookup's hidden dim
and the add's with it. Moving either alone adds a redistribution the pair removes, so no single
move pays (benchmarks/results/quality_batch12.md at cd7244e: 1.052 of the ILP optimum)."""

from __future__ import annotations

import pytest

import shardplan as sp
from shardplan.cost import CostOptions
from shardplan.cost.evaluate import ScoreCache, evaluate_strategies
from shardplan.search.drec.polish import _swapped, polish

POS, ADD = "embeddings.pos_emb", "embeddings.add_pos"


@pytest.fixture(scope="module")
def bert_case():
    graph, mesh = sp.zoo.build("bert-base", layers=1, batch=12), sp.parse_mesh("18")
    exact = sp.plan(graph, mesh, method="ilp", time_limit=120)  # optimal in about 1 s
    return graph, mesh, exact


def test_drec_reaches_the_ilp_optimum_on_bert_on_mesh_18(bert_case):
    graph, mesh, exact = bert_case
    drec = sp.plan(graph, mesh, method="drec")
    assert drec.cost.total <= exact.cost.total * (1 + 1e-9)


def test_single_moves_miss_what_the_pair_move_finds(bert_case):
    graph, mesh, exact = bert_case
    opts = CostOptions.make()
    batch_cut = {POS: ("d0", "d0", None), ADD: ("d0", "d0", None)}  # what the greedy chose
    start = dict(exact.strategies) | batch_cut
    before = evaluate_strategies(graph, mesh, start, opts).total
    assert before > exact.cost.total * 1.03
    alone = polish(graph, mesh, start, ScoreCache(graph, mesh, opts))
    assert {k: alone[k] for k in batch_cut} == batch_cut  # a local optimum of single moves
    paired = polish(graph, mesh, start, ScoreCache(graph, mesh, opts), pairs=True)
    assert (paired[POS], paired[ADD]) == (exact.strategies[POS], exact.strategies[ADD])
    after = evaluate_strategies(graph, mesh, paired, opts).total
    assert after == pytest.approx(exact.cost.total, rel=1e-12)


def test_pair_moves_keep_frozen_ops_and_never_cost_more(bert_case):
    graph, mesh, exact = bert_case
    opts = CostOptions.make()
    start = dict(exact.strategies) | {POS: ("d0", "d0", None), ADD: ("d0", "d0", None)}
    frozen = {graph.op_index[POS]}
    paired = polish(graph, mesh, start, ScoreCache(graph, mesh, opts), frozen=frozen, pairs=True)
    assert paired[POS] == ("d0", "d0", None)
    before = evaluate_strategies(graph, mesh, start, opts).total
    assert evaluate_strategies(graph, mesh, paired, opts).total <= before


def test_swapped_moves_both_ops_off_one_tensor_axis_where_both_cut_it():
    writer, reader = (("d0",), ("d1",), ("e",)), (("b",), ("s",), ("h",))
    pairs = _swapped(writer, reader, ("d0", "e", "d0"), ("b", "h", "b"))
    # rounds 0 and 2 cut axis 0 on both sides, round 1 axis 2: each moves to axis 1, the one
    # axis no round cuts yet
    assert pairs == [(("d1", "e", "d1"), ("s", "h", "s")), (("d0", "d1", "d0"), ("b", "s", "b"))]
    # round 1 cuts nothing on either side: each free axis takes round 0's place, or round 0's
    # and round 1's, or round 1 alone
    pairs = _swapped(writer, reader, ("d0", None), ("b", None))
    assert pairs == [
        (("d1", None), ("s", None)),
        (("d1", "d1"), ("s", "s")),
        (("d0", "d1"), ("b", "s")),
        (("e", None), ("h", None)),
        (("e", "e"), ("h", "h")),
        (("d0", "e"), ("b", "h")),
    ]
    # the two sides cut axis 0 and axis 1 in round 0 (never alike): only round 1 can change
    assert _swapped(writer, reader, ("d0", None), ("s", None)) == [(("d0", "e"), ("s", "h"))]


def test_pair_moves_also_cut_the_rounds_both_ops_leave_idle():
    # BERT-base (1 layer, batch 8) on 12 = 2 x 2 x 3: the optimum cuts the lookup's hidden dim in
    # all three rounds, the round of 3 included, which the batch-cut plan left idle
    # (benchmarks/results/quality.md: 1.050 of the ILP optimum)
    graph, mesh = sp.zoo.build("bert-base", layers=1), sp.parse_mesh("12")
    opts = CostOptions.make()
    start = dict(sp.plan(graph, mesh).strategies)
    start |= {POS: ("d0", "d0", None), ADD: ("d0", "d0", None)}
    before = evaluate_strategies(graph, mesh, start, opts).total
    paired = polish(graph, mesh, start, ScoreCache(graph, mesh, opts), pairs=True)
    assert (paired[POS], paired[ADD]) == (("e", "e", "e"), ("d2", "d2", "d2"))
    assert evaluate_strategies(graph, mesh, paired, opts).total < before * 0.97


def test_the_tail_move_replicates_a_cnns_last_stage():
    # ResNet-50 on 12: layer 4's weights are large and its activations small (7 x 7), so their
    # gradients' all-reduces cost more than computing the whole stage on every device; no op
    # alone can leave (it would gather its input and scatter its output). The ILP optimum
    # replicates layer 4 and the head (benchmarks/results/quality.md: D-Rec 1.088 of it)
    graph, mesh = sp.zoo.build("resnet50"), sp.parse_mesh("12")
    opts = CostOptions.make()
    data = {k: tuple(v) for k, v in sp.plan(graph, mesh, "data-parallel").strategies.items()}
    single = polish(graph, mesh, data, ScoreCache(graph, mesh, opts))
    final = polish(graph, mesh, data, ScoreCache(graph, mesh, opts), pairs=True)
    tail = ["layer4.0.conv1.conv", "layer4.2.conv3.conv", "avgpool", "fc.linear"]
    assert all(single[name] != (None,) * 3 for name in tail)
    assert all(final[name] == (None,) * 3 for name in tail)
    before = evaluate_strategies(graph, mesh, single, opts).total
    after = evaluate_strategies(graph, mesh, final, opts).total
    assert after < before * 0.9
    drec = sp.plan(graph, mesh)
    assert drec.strategies["fc.linear"] == (None,) * 3
    assert drec.cost.total <= after * (1 + 1e-9)


def test_the_run_move_leaves_one_round_unused_on_a_middle_run():
    # AlexNet, batch 60, on 3x5: features.8 cuts its input channels over the axis of 3 and
    # all-reduces its partial sums, so its output is whole there; D-Rec cut the batch again for
    # features.9-12, all-reducing their weights' gradients. No op alone can stop (it would
    # gather its input and scatter its output), and the run is not the graph's tail (the
    # classifier stays cut): the ILP optimum keeps the run whole over the axis of 3 (D-Rec was
    # 1.042 of it; 1.006 with the run move)
    graph, mesh = sp.zoo.build("alexnet", batch=60), sp.parse_mesh("3x5")
    opts = CostOptions.make()
    drec = sp.plan(graph, mesh)
    run = ["features.9.relu", "features.10.conv", "features.11.relu", "features.12.pool"]
    assert all(drec.strategies[name][0] is None for name in run)
    assert drec.strategies["classifier.1.linear"][0] is not None
    start = dict(drec.strategies) | {name: ("d0", "d0") for name in run[::2]}
    start |= {"features.10.conv": ("n", "n"), "features.10.bias_add": ("d0", "d0")}
    start |= {"features.12.pool": ("n", "n"), "flatten": ("r0", "r0")}
    start |= {"classifier.0.dropout": ("d0", "d0")}
    before = evaluate_strategies(graph, mesh, start, opts).total
    single = polish(graph, mesh, start, ScoreCache(graph, mesh, opts))
    assert evaluate_strategies(graph, mesh, single, opts).total == pytest.approx(before)
    final = polish(graph, mesh, start, ScoreCache(graph, mesh, opts), pairs=True)
    assert all(final[name][0] is None for name in run)
    assert evaluate_strategies(graph, mesh, final, opts).total < before * 0.97


def test_the_split_run_cuts_the_token_path_in_a_round_left_unused():
    # One MoE layer, batch 6, sequence 128, on 12 = 2 x 2 x 3: the 8 experts cannot take the
    # round of 3, and cutting attention's batch there all-reduces its weights' gradients, so
    # every variant left the round unused. The ILP optimum cuts the tokens after attention
    # (residual, norm, router, dispatch, loss) over it: no op alone can start that (it would
    # scatter its input and gather its output), nor any whole-round alternative (all or nothing;
    # D-Rec was 1.116 of the optimum, 1.001 with the split run)
    graph, mesh = sp.zoo.build("moe", batch=6, seq=128), sp.parse_mesh("12")
    drec = sp.plan(graph, mesh)
    tokens = ["residual_1", "ln_2.norm", "moe.router.linear", "residual_2", "loss"]
    assert all(drec.strategies[name][2] is not None for name in tokens)
    assert all(drec.strategies[name][2] is None for name in ("attn.q.linear", "moe.expert_fc"))
    exact = sp.plan(graph, mesh, method="ilp", time_limit=120)  # optimal in about 1 s
    assert drec.cost.total <= exact.cost.total * 1.01
