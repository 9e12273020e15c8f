"""The memory-aware layout bound (search/step/bounds.py): its byte floors are below what the step
model keeps under any plan, and pruning by it never changes the search's result."""

import re

import pytest

import shardplan as sp
from shardplan import zoo
from shardplan.cost import CostOptions
from shardplan.cost.step import profile_stage
from shardplan.ir.segments import segments
from shardplan.mesh import parse_mesh
from shardplan.search import experts
from shardplan.search.step import search as step_search
from shardplan.search.step.bounds import chunk_floors
from shardplan.search.step.layouts import boundary_items
from shardplan.search.step.stages import stage_graphs, stage_starts


def _gpt(batch: int):
    return zoo.build("gpt3", batch=batch, layers=4, hidden=64, heads=4, vocab=200, seq=32)


@pytest.mark.parametrize("chunks", [1, 2, 3])
@pytest.mark.parametrize("plan", ["data-parallel", "megatron"])
def test_chunk_floors_are_below_every_plans_kept_bytes(chunks, plan):
    graph, opts, mesh = _gpt(8), CostOptions.make(dtype="bf16"), parse_mesh("2x2")
    starts = stage_starts(graph, chunks)
    floors = chunk_floors(graph, segments(graph), starts, opts)
    for sub, floor in zip(stage_graphs(graph, starts), floors, strict=True):
        if plan == "megatron":
            strategies = experts.megatron(sub, mesh, 2)
        else:
            strategies = experts.data_parallel(sub, mesh)
        p = profile_stage(sub, mesh, strategies, opts)
        assert floor.kept_none / mesh.size <= p.activation_bytes * (1 + 1e-12)
        kept_selective = p.activation_bytes - p.selective_bytes
        assert floor.kept_selective / mesh.size <= kept_selective * (1 + 1e-12)
        assert 0 < floor.kept_selective < floor.kept_none  # attention scores are dropped
        for param_bytes in (p.param_bytes, *(z.param_bytes for z in p.zero)):  # ZeRO 0-3
            assert floor.weights / mesh.size <= param_bytes


def _activation_heavy(batch: int):
    return zoo.build("gpt3", batch=batch, layers=8, hidden=512, heads=8, vocab=1000, seq=512)


def test_pruning_by_the_memory_bound_keeps_the_search_result(monkeypatch):
    def search():
        return sp.plan(
            _activation_heavy, "4x2", method="step", batch=64, dtype="bf16", memory="160MB"
        )

    sharp = search()
    monkeypatch.setattr(step_search._Search, "refined_bound", lambda self, layout: layout.bound)
    plain = search()
    assert sharp.step.step_s == plain.step.step_s
    assert [(s.plan.strategies, s.levers) for s in sharp.stages] == [
        (s.plan.strategies, s.levers) for s in plain.stages
    ]
    evaluated = [int(re.search(r"(\d+) of \d+ layouts", tp.notes[-1])[1]) for tp in (sharp, plain)]
    assert evaluated[0] < evaluated[1]  # layouts that must recompute fully were bounded out


@pytest.mark.parametrize("memory", ["120MB", "160MB"])
def test_every_layouts_sharpened_bound_is_below_its_step(memory):
    # each layout's own bound (its v, bubble and in-flight count), interleaved ones included:
    # a group of layouts goes back in line by the least of them, never by its v = 1 twin's
    from shardplan.problem import Problem
    from shardplan.search.step.layouts import layouts as all_layouts
    from shardplan.search.step.search import _drec_planner, _Search
    from shardplan.training import at_precision

    opts = CostOptions.make(dtype="bf16")
    mesh = parse_mesh("4x2")
    probe = _activation_heavy(64)
    problem = Problem(probe, mesh, opts, float(memory[:-2]) * 1e6, None, 64, _activation_heavy)
    search = _Search(problem, at_precision(problem.mesh, opts), _drec_planner)
    sends = boundary_items(probe, opts)  # exposed sends: the bound counts them
    layouts = all_layouts(probe, search.probe_split, search.mesh, 64, None, search.chunk_cuts,
                          search.ideal, sends)  # fmt: skip
    assert any(c.sends > 0 for c in layouts)
    checked = 0
    for layout in layouts:
        choice = search.evaluate(layout, lambda _m: None)
        if choice is not None:
            assert search.refined_bound(layout) <= choice.step_s * (1 + 1e-9)
            checked += 1
    assert checked >= 5 and any(c.virtual > 1 for c in layouts)


def test_the_step_floor_is_below_every_layouts_step_and_every_fitting_recipe():
    # the floor certifies the plan: no layout's best plan (evaluated here without pruning) and
    # no Megatron recipe that fits steps faster; the search's step lies at or above it
    from shardplan.errors import InfeasibleError
    from shardplan.problem import Problem
    from shardplan.search.step.layouts import layouts as all_layouts
    from shardplan.search.step.search import _drec_planner, _Search
    from shardplan.training import at_precision

    budget = 160e6
    tp = sp.plan(_activation_heavy, "4x2", method="step", batch=64, dtype="bf16", memory=budget)
    floor = tp.step_floor_s
    assert floor is not None and 0.0 < floor <= tp.step.step_s
    assert "steps faster than" in tp.notes[-1]
    opts = CostOptions.make(dtype="bf16")
    problem = Problem(_activation_heavy(64), parse_mesh("4x2"), opts, budget, None, 64,
                      _activation_heavy)  # fmt: skip
    search = _Search(problem, at_precision(problem.mesh, opts), _drec_planner)
    found = all_layouts(problem.graph, search.probe_split, search.mesh, 64, None,
                        search.chunk_cuts, search.ideal,
                        boundary_items(problem.graph, opts))  # fmt: skip
    steps = [c.step_s for c in (search.evaluate(x, lambda _m: None) for x in found) if c]
    assert len(steps) >= 5 and min(steps) >= floor * (1 - 1e-9)
    recipes = 0
    for t in (1, 2):
        for p in (1, 2, 4):
            for mbs in (1, 2, 4):
                try:
                    r = sp.plan(_activation_heavy, "4x2", method="megatron-recipe",
                                batch=64, dtype="bf16", tensor=t, pipeline=p,
                                micro_batch_size=mbs)  # fmt: skip
                except InfeasibleError:
                    continue
                if r.step.memory_per_device <= budget:
                    assert r.step.step_s >= floor * (1 - 1e-9)
                    recipes += 1
    assert recipes >= 3


def test_the_widest_boundary_is_a_floor_of_the_pipelines_sends():
    from shardplan.cost.pipeline import cut_terms

    g, opts = _activation_heavy(8), CostOptions.make(dtype="bf16")
    segs = segments(g)
    items = boundary_items(g, opts)
    for stages in (2, 3, 4):
        bounds = [segs[s].start for s in stage_starts(g, stages)] + [len(g.ops)]
        p2p, _ = cut_terms(g, bounds, opts, 1, 1.0)
        assert 0 < items.widest(bounds) <= max(p2p) * (1 + 1e-12)


def test_a_group_bounded_by_its_v1_twin_is_still_searched_by_its_interleaved_bounds():
    # GPT-3 175B on 8x8 (MLSys'23): with tensor-parallel overlap the best layout is 8 stages x 6
    # chunks, whose v = 1 twin's bound lies above a 4-stage step found first; ordering groups by
    # that twin bounded the whole group out. The full search is never worse than one of its S.
    def gpt3(b: int):
        return zoo.build("gpt3", batch=b, layers=96, hidden=12288, heads=96, vocab=51200,
                         seq=2048, max_positions=2048)  # fmt: skip

    kw = dict(method="step", batch=64, dtype="bf16", memory=80e9, tp_comm_overlap=True)
    full = sp.plan(gpt3, "8x8", **kw)
    eight = sp.plan(gpt3, "8x8", stages=(8,), **kw)
    assert full.step.step_s <= eight.step.step_s * (1 + 1e-9)
