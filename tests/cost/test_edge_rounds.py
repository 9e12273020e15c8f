"""An edge's redistribution over several rounds against hand counts (`edge_redistribution`).

Mesh "8" is three rounds of 2 on one link; `TWO_NODES` (2 nodes of 4 GPUs: a 2x4 mesh whose
outer axis crosses nodes) is one round of 2 on the slow inter-node link then two rounds of 2 on
the fast intra-node link (mesh text "2x4" lies in one 8-GPU node: both axes fast). A tensor of
N fp32 elements, |T| = 4N bytes;
split in all three rounds a device holds its eighth, L = |T|/8.
"""

from __future__ import annotations

import pytest

import shardplan as sp
from shardplan.cost import CostOptions
from shardplan.cost.terms import edge_redistribution
from shardplan.sharding import REPLICATED as R

A100 = sp.hardware.MACHINES["a100"]
TWO_NODES = sp.Mesh(
    (2, 4), ("node", "gpu"), (A100.inter_node_bytes_per_s, A100.intra_node_bytes_per_s)
)
N = 1 << 20
T = 4 * N
L = T / 8


def _edge(src, dst, mesh, train=False, grad=False):
    rounds = sp.parse_mesh(mesh).rounds
    return edge_redistribution(src, dst, N, 4, rounds, grad, CostOptions.make("shardplan", train))


def test_three_rounds_of_all_to_all_are_one_all_to_all_over_eight():
    # one all-to-all over 8 devices: keep 1/8 of L, send 7/8 L (per round: 3 * 1/2 L = 1.5 L)
    terms = _edge((0, 0, 0), (1, 1, 1), "8")
    assert terms.all_to_all_bytes == pytest.approx(7 / 8 * L)
    bandwidth = sp.parse_mesh("8").rounds[0].bandwidth_bytes_per_s
    assert terms.redistribution_fwd == pytest.approx(7 / 8 * L / bandwidth)
    assert terms.all_gather_bytes == 0 and terms.redistribution_bwd == 0


def test_two_moved_rounds_among_three_send_three_quarters_of_the_eighth():
    # round 0 keeps its split (no traffic); rounds 1, 2 move: one all-to-all over 4 devices
    assert _edge((0, 1, 1), (0, 0, 0), "8").all_to_all_bytes == pytest.approx(3 / 4 * L)


def test_training_moves_the_gradient_back_the_same_way():
    terms = _edge((0, 0, 0), (1, 1, 1), "8", train=True, grad=True)
    assert terms.all_to_all_bytes == pytest.approx(2 * 7 / 8 * L)
    assert terms.redistribution_bwd == pytest.approx(terms.redistribution_fwd)


def test_all_to_all_over_a_slow_and_a_fast_link_prices_each_byte_at_its_slowest_link():
    # 2x4: the 4 devices in the other node get 4/8 L = 1/2 L over the slow link; the 3 others
    # in this node get 3/8 L over the fast one (round 1: 1/2 * L/2, round 2: 1/2 * L/4).
    mesh = TWO_NODES
    slow, fast = (r.bandwidth_bytes_per_s for r in mesh.rounds[:2])
    assert slow < fast
    terms = _edge((0, 0, 0), (1, 1, 1), TWO_NODES)
    assert terms.all_to_all_bytes == pytest.approx(7 / 8 * L)
    assert terms.redistribution_fwd == pytest.approx(L / 2 / slow + 3 / 8 * L / fast)


def test_a_gather_over_several_rounds_telescopes_to_one_all_gather():
    # (q-1)/q of growing pieces: 1/2 |T|/4 + 1/2 |T|/2 + 1/2 |T| = 7/8 |T|, one all-gather over 8
    assert _edge((0, 0, 0), (R, R, R), "8").all_gather_bytes == pytest.approx(7 / 8 * T)
    # different links: the slow round moves the smallest piece first (|T|/8 over the slow link)
    mesh = TWO_NODES
    slow, fast = (r.bandwidth_bytes_per_s for r in mesh.rounds[:2])
    terms = _edge((0, 0, 0), (R, R, R), TWO_NODES)
    assert terms.all_gather_bytes == pytest.approx(7 / 8 * T)
    assert terms.redistribution_fwd == pytest.approx(T / 8 / slow + 3 / 4 * T / fast)


def test_the_symbolic_preset_keeps_its_per_round_count():
    # MindSpore's constants: 16 x the local size per mismatched round, no grouping
    rounds = sp.parse_mesh("8").rounds
    opts = CostOptions.make("mindspore", False)
    terms = edge_redistribution((0, 0, 0), (1, 1, 1), N, 4, rounds, False, opts)
    assert terms.redistribution_fwd == pytest.approx(3 * opts.preset.redis_coef * N / 4)
