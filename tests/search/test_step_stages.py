"""search.step.stages: Megatron-LM's equal-layer cut, used by the recipe and tried by the search."""

from __future__ import annotations

import shardplan as sp
from shardplan import zoo
from shardplan.ir.segments import segments
from shardplan.problem import Problem
from shardplan.search.step.search import _drec_planner, _Search
from shardplan.search.step.stages import aligned_starts, stage_starts
from shardplan.search.step.structure import layer_split, segment_prints
from shardplan.training import at_precision


def _gpt(batch: int, layers: int = 8):
    return zoo.build("gpt3", batch=batch, layers=layers, hidden=128, heads=4, vocab=5000, seq=32)


def _first_ops(graph, starts):
    segs = segments(graph)
    return [graph.ops[segs[k].start].name for k in starts]


def test_equal_whole_layers_per_chunk_with_the_ends_on_the_first_and_last():
    g = _gpt(4)
    split = layer_split(segment_prints(g, segments(g)))
    assert _first_ops(g, aligned_starts(split, 4)) == [
        "tok_emb", "h.2.ln_1.norm", "h.4.ln_1.norm", "h.6.ln_1.norm"
    ]  # fmt: skip
    assert aligned_starts(split, 3) is None  # 8 layers do not divide into 3
    assert aligned_starts(split, 16) is None  # more chunks than layers


def test_the_recipe_cuts_as_megatron_and_the_search_tries_that_cut():
    build = _gpt  # a large vocabulary: the FLOP-balanced cut moves a half-layer off the head
    g = build(8)
    balanced = stage_starts(g, 2)
    assert _first_ops(g, balanced)[1].endswith("ln_2.norm")  # the DP's cut is mid-layer
    recipe = sp.plan(build, "2x2", method="megatron-recipe", batch=8, dtype="bf16", pipeline=2,
                     tensor=2)  # fmt: skip
    assert [st.plan.graph.ops[0].name for st in recipe.stages] == ["tok_emb", "h.4.ln_1.norm"]
    problem = Problem.make(build, "2x2", batch=8, dtype="bf16")
    search = _Search(problem, at_precision(problem.mesh, problem.options), _drec_planner)
    cuts = search.chunk_cuts(2)
    assert [aligned for aligned, _ in cuts] == [False, True]
    assert _first_ops(g, cuts[1][1]) == ["tok_emb", "h.4.ln_1.norm"]
    tp = sp.plan(build, "2x2", method="step", batch=8, dtype="bf16")
    assert tp.step.step_s <= recipe.step.step_s * (1 + 1e-9)
