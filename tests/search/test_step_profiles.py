"""Long runs of layers are priced from their one- and two-period reductions (search/step/
profiles.py): the extrapolated step equals the exactly profiled plan's, for every layout."""

import math

import pytest

from shardplan import zoo
from shardplan.ir.segments import segments
from shardplan.problem import Problem
from shardplan.search.step.search import Layout, _drec_planner, _Search
from shardplan.search.step.structure import (
    chunk_shape,
    graph_layers,
    reduced_chunk,
    segment_prints,
)
from shardplan.training import at_precision


def _gpt(batch: int):
    return zoo.build("gpt3", batch=batch, layers=8, hidden=128, heads=4, vocab=500, seq=32)


@pytest.mark.parametrize(
    ("stages", "virtual", "micro_batches"), [(1, 1, 1), (1, 1, 4), (2, 1, 4), (4, 1, 8), (2, 2, 4)]
)
def test_extrapolated_profiles_equal_the_exact_ones(stages, virtual, micro_batches):
    _check_layout(_gpt, "4x2", 16, stages, virtual, micro_batches)


@pytest.mark.parametrize(
    ("model", "sizes", "mesh", "stages", "micro_batches"),
    [
        ("vgg16", {}, "8", 4, 1),  # the Megatron expert pairs its convs: plans repeat every 2
        ("vgg16", {}, "4x2", 1, 2),
        ("bert-base", {"layers": 8}, "3x2", 3, 2),
        ("llama3-8b", {"layers": 8}, "4x2", 2, 4),
        ("mixtral-8x7b", {"layers": 6}, "8", 2, 2),
    ],
)
def test_runs_whose_plans_do_not_repeat_are_priced_exactly(
    model, sizes, mesh, stages, micro_batches
):
    def build(b):
        return zoo.build(model, small=True, batch=b, **sizes)

    _check_layout(build, mesh, 8, stages, 1, micro_batches)


def _check_layout(build, mesh, batch, stages, virtual, micro_batches):
    problem = Problem.make(build, mesh, batch=batch, dtype="bf16")
    search = _Search(problem, at_precision(problem.mesh, problem.options), _drec_planner)
    layout = Layout(0.0, stages, virtual, micro_batches, batch // micro_batches)
    choice = search.evaluate(layout, lambda _msg: None)
    assert choice is not None
    exact = search.materialize(choice)  # every stage re-profiled on its real sub-graph
    assert math.isclose(exact.step.step_s, choice.step_s, rel_tol=1e-9)


def test_a_reduced_chunk_keeps_its_ends_and_one_period():
    g = _gpt(4)
    segs = segments(g)
    split = graph_layers(g)
    assert split.layers == 8
    whole = chunk_shape(split, 0, len(segs))  # embeddings, 8 layers, head
    assert whole.periods == 8
    one = reduced_chunk(g, segs, whole, 1, "one")
    assert one is not None
    # the head reads the last kept layer's output: one layer's ops fewer x 7
    per_layer = (len(g.ops) - len(one.ops)) // 7
    assert len(one.ops) + 7 * per_layer == len(g.ops)
    prints = segment_prints(one, segments(one))
    assert (
        prints
        == segment_prints(g, segs)[: split.first + split.period]
        + segment_prints(g, segs)[split.stop :]
    )


@pytest.mark.parametrize(("chunks", "virtual"), [(1, 1), (2, 1), (4, 1), (4, 2), (6, 3)])
def test_pipeline_terms_read_off_the_cut_equal_those_of_the_stage_graphs(chunks, virtual):
    from shardplan.cost import CostOptions
    from shardplan.mesh import parse_mesh
    from shardplan.search.step.stages import stage_graphs, stage_starts
    from shardplan.training import pipeline_cut, pipeline_for

    g = zoo.build("gpt2-small", small=True, batch=8, layers=3)  # tied embedding: a shared sync
    opts = CostOptions.make(dtype="bf16")
    mesh = parse_mesh("6x2")
    starts = stage_starts(g, chunks)
    graphs = stage_graphs(g, starts)
    segs = segments(g)
    bounds = [segs[a].start for a in starts] + [len(g.ops)]
    want = pipeline_for(graphs, [opts] * len(graphs), mesh, 8, 16, virtual)
    assert pipeline_cut(g, bounds, opts, mesh, 8, 16, virtual) == want


def _profiled_sizes(monkeypatch) -> list[int]:
    """The op counts of the graphs `profiles` profiles from now on (a spy on profile_stage)."""
    from shardplan.search.step import profiles

    sizes: list[int] = []
    real = profiles.profile_stage

    def spy(graph, *args, **kwargs):
        sizes.append(len(graph.ops))
        return real(graph, *args, **kwargs)

    monkeypatch.setattr(profiles, "profile_stage", spy)
    return sizes


def test_a_transformer_run_is_extrapolated_not_profiled_whole(monkeypatch):
    """Every family of a GPT stage takes the extrapolation path (full recomputation's blocks
    agree from two periods on), so no profile is as large as the chunk."""
    from shardplan.search.step.stages import stage_mesh

    problem = Problem.make(_gpt, "4x2", batch=16, dtype="bf16")
    mesh = at_precision(problem.mesh, problem.options)
    search = _Search(problem, mesh, _drec_planner)
    prof = search.profiler(8, stage_mesh(mesh, 1))
    sizes = _profiled_sizes(monkeypatch)
    for family in prof.families():
        assert prof.profile(0, len(prof.segs), family) is not None
    assert all(prof.increments[f] is not None for f in prof.families())
    assert sizes and max(sizes) < len(prof.graph.ops)


def _gpt17(batch: int):
    return zoo.build("gpt3", batch=batch, layers=17, hidden=128, heads=4, vocab=500, seq=32)


def test_a_chunk_cut_mid_layer_is_extrapolated_by_its_own_increment(monkeypatch):
    """3 stages of 17 layers start at h.5.ln_2 and h.11.ln_2 (an MLP half first): such a chunk
    checkpoints other blocks than the first chunk, so its increment is its own, confirmed by its
    four-period reduction, not the chunk priced whole; and the step is the exact one."""
    from shardplan.search.step.stages import stage_mesh

    problem = Problem.make(_gpt17, "3x2", batch=12, dtype="bf16")
    mesh = at_precision(problem.mesh, problem.options)
    search = _Search(problem, mesh, _drec_planner)
    prof = search.profiler(3, stage_mesh(mesh, 3))
    starts = search.chunk_starts(3)
    assert prof.graph.ops[prof.segs[starts[1]].start].name == "h.5.ln_2.norm"
    a, e = starts[1], starts[2]
    chunk_ops = prof.segs[e - 1].stop - prof.segs[a].start
    sizes = _profiled_sizes(monkeypatch)
    checked = 0
    for family in prof.families():
        if prof.profile(0, starts[1], family) is None:  # the family's reference increment
            continue  # sequence parallelism with nothing to split: not a distinct family
        sizes.clear()
        if prof.profile(a, e, family) is None:
            continue
        assert sizes and max(sizes) < chunk_ops, family
        checked += 1
    assert checked >= 4
    _check_layout(_gpt17, "3x2", 12, 3, 1, 4)


@pytest.mark.parametrize(("dtype", "width"), [("bf16", 2), ("fp32", 4)])
def test_a_stage_sends_and_keeps_its_activation_at_the_compute_precision(dtype, width):
    """The residual stream crossing a stage boundary (batch x seq x hidden) is an activation:
    sent and kept at the precision's width, not at the declared fp32 of a graph input."""
    from shardplan.cost import CostOptions
    from shardplan.mesh import parse_mesh
    from shardplan.search.step.stages import stage_graphs, stage_starts
    from shardplan.training import pipeline_cut

    g = zoo.build("gpt3", batch=4, layers=4, hidden=64, heads=4, vocab=100, seq=16)
    opts = CostOptions.make(dtype=dtype)
    mesh = parse_mesh("2x2")
    starts = stage_starts(g, 2)
    segs = segments(g)
    bounds = [segs[a].start for a in starts] + [len(g.ops)]
    pipe = pipeline_cut(g, bounds, opts, mesh, 4, 16, 1)
    assert pipe.p2p_bytes == (4 * 16 * 64 * width / 2,)  # sharded over the stage's 2 devices
    second = stage_graphs(g, starts)[1]
    received = [t for t in second.tensors.values() if t.received]
    assert [t.shape for t in received] == [(4, 16, 64)]
    assert opts.element_bytes(received[0]) == width
    ids = g.tensors["input_ids"]
    assert opts.element_bytes(ids) == ids.dtype_bytes  # a true graph input keeps its own


def _profiler(build, mesh_text: str, batch: int, samples: int, stages: int = 1):
    from shardplan.search.step.stages import stage_mesh

    problem = Problem.make(build, mesh_text, batch=batch, dtype="bf16")
    mesh = at_precision(problem.mesh, problem.options)
    search = _Search(problem, mesh, _drec_planner)
    return search.profiler(samples, stage_mesh(mesh, stages))


def test_expert_layers_get_expert_parallel_families():
    def moe(b):
        return zoo.build("mixtral-8x7b", small=True, batch=b, layers=2)

    prof = _profiler(moe, "2x4", 8, 8)
    experts = {(f.tensor, f.expert) for f in prof.families() if f.expert > 1}
    # the small Mixtral has 4 experts: 8 ways (t=1 on 2x4) cannot split them, so no such family
    assert experts == {(1, 2), (1, 4), (2, 2), (2, 4), (4, 2)}
    dense = _profiler(_gpt, "2x4", 8, 8)
    assert not any(f.expert > 1 for f in dense.families())  # no expert layer: no such family


def test_context_parallel_fills_the_ways_the_batch_cannot():
    # 8 devices, t=2: 4 data-parallel ways; 2 samples fill 2 of them, the sequence the other 2
    prof = _profiler(_gpt, "2x4", 2, 2)
    ctx = {(f.tensor, f.context) for f in prof.families() if f.context > 1}
    assert ctx == {(1, 4), (2, 2)}
    assert prof.profile(0, len(prof.segs), [f for f in prof.families() if f.context == 2][0])
    full = _profiler(_gpt, "2x4", 8, 8)  # 8 samples fill every way: no context parallelism
    assert not any(f.context > 1 for f in full.families())


@pytest.mark.parametrize(
    ("model", "knobs"),
    [
        ("mixtral-8x7b", {"tensor": 1, "expert": 4, "micro_batch_size": 1}),
        ("mixtral-8x7b", {"tensor": 2, "expert": 2, "micro_batch_size": 1}),
        ("gpt2-small", {"tensor": 2, "context": 2, "micro_batch_size": 1}),
    ],
)
def test_the_search_is_never_slower_than_an_expert_or_context_parallel_recipe(model, knobs):
    import shardplan as sp

    def build(b):
        return zoo.build(model, small=True, batch=b, layers=2)

    batch = 4 if "context" in knobs else 8
    recipe = sp.plan(build, "1x8", "megatron-recipe", batch=batch, dtype="bf16", pipeline=1,
                     recompute="none", **knobs)  # fmt: skip
    found = sp.plan(build, "1x8", "step", batch=batch, dtype="bf16")
    assert found.step.step_s <= recipe.step.step_s * (1 + 1e-9)


@pytest.mark.parametrize("model", ["gpt3", "resnet50", "mixtral-8x7b"])
def test_a_ranges_fingerprint_is_that_of_its_subgraph(model):
    from shardplan.ir.segments import subgraph
    from shardplan.search.step.structure import fingerprint, range_fingerprint

    kw = dict(batch=4, layers=3, hidden=64, heads=4, vocab=100, seq=16) if model == "gpt3" else {}
    g = zoo.build(model, **kw)
    segs = segments(g)
    for a, b in [*zip(segs, segs, strict=True), *zip(segs, segs[2:], strict=False)]:
        sub = subgraph(g, a.start, b.stop)
        assert range_fingerprint(g, a.start, b.stop) == fingerprint(sub)
    # a different structure prints differently
    assert range_fingerprint(g, segs[0].start, segs[0].stop) != range_fingerprint(
        g, segs[1].start, segs[1].stop
    )


@pytest.mark.parametrize("family_index", [0, 2, 3])
def test_chunks_of_one_structure_share_one_plan_under_their_own_names(family_index):
    from shardplan.cost.step import profile_stage
    from shardplan.search.step.stages import stage_graphs, stage_mesh

    problem = Problem.make(_gpt, "4x2", batch=16, dtype="bf16")
    mesh = at_precision(problem.mesh, problem.options)
    search = _Search(problem, mesh, _drec_planner)
    prof = search.profiler(4, stage_mesh(mesh, 1))
    family = prof.families()[family_index]
    starts = search.chunk_starts(4)
    ends = [*starts[1:], len(prof.segs)]
    subs = stage_graphs(prof.graph, starts)
    plans = [prof.plan(sub, a, e, family) for sub, a, e in zip(subs, starts, ends, strict=True)]
    assert len(prof.plans) < len(subs)  # the middle chunks are alike: planned once
    for sub, a, e, (plan, exact) in zip(subs, starts, ends, plans, strict=True):
        own = prof.strategies(sub, family, range(a, e))  # planned on its own
        assert dict(plan.strategies) == {op.name: tuple(own[op.name]) for op in sub.ops}
        assert [row.name for row in exact.breakdown.ops] == [op.name for op in sub.ops]
        fresh = profile_stage(
            sub, prof.mesh, plan.strategies, prof.opts, sequence_parallel=family.sequence_parallel
        )
        assert fresh == exact


@pytest.mark.parametrize("budget", [None, 2e6, 6e6, 2e7])
def test_choose_levers_skips_only_levers_that_cannot_be_faster(budget):
    """More recomputation at one ZeRO stage only adds time (nothing overlapped): the levers
    `choose_levers` skips never beat the one it keeps; an exhaustive pass agrees."""
    from dataclasses import replace as dc_replace

    from shardplan.cost.step import stage_cost
    from shardplan.search.step.profiles import LEVERS, choose_levers
    from shardplan.search.step.stages import stage_mesh

    problem = Problem.make(_gpt, "4x2", batch=16, dtype="bf16")
    mesh = at_precision(problem.mesh, problem.options)
    search = _Search(problem, mesh, _drec_planner)
    prof = search.profiler(4, stage_mesh(mesh, 2))
    starts = search.chunk_starts(2)
    for family in prof.families():
        p = prof.profile(starts[0], starts[1], family)
        if p is None:
            continue
        got = choose_levers(p, 4, 2, 5, budget)
        every = []
        for lv in LEVERS:
            lv = dc_replace(lv, sequence_parallel=p.sequence_parallel,
                            context_parallel=p.context_parallel)  # fmt: skip
            c = stage_cost(p, lv, 4, 2)
            if budget is None or c.memory_bytes <= budget:
                every.append(5 * (c.fwd_s + c.bwd_s) + c.sync_s + c.optimizer_s)
        assert (got is None) == (not every)
        if got is not None:
            assert got[0] == pytest.approx(min(every), rel=1e-9)


def test_context_parallel_runs_are_extrapolated_despite_rounding_residues(monkeypatch):
    """Context parallelism's forward collectives cancel to ~1e-11 s (the ring exchange's exposed
    part less the all-gather it replaces): their rounding residues (1e-19 s) are not a change of
    increment, so the run is extrapolated, not profiled whole."""
    from shardplan.search.step.stages import stage_mesh

    def wide(batch: int):  # GPT-3 175B's layer: its ring exchange leaves the residues
        return zoo.build("gpt3", batch=batch, layers=6, hidden=12288, heads=96, vocab=500)

    problem = Problem.make(wide, "128x8", batch=768, dtype="bf16")
    mesh = at_precision(problem.mesh, problem.options)
    search = _Search(problem, mesh, _drec_planner)
    prof = search.profiler(384, stage_mesh(mesh, 1))
    context = [f for f in prof.families() if f.context > 1]
    assert context
    sizes = _profiled_sizes(monkeypatch)
    for family in context:
        assert prof.profile(0, len(prof.segs), family) is not None
        assert prof.increments[family] is not None, family
    assert sizes and max(sizes) < len(prof.graph.ops)


def test_periodic_reductions_need_no_four_period_confirmation(monkeypatch):
    """A GPT stage's two- and three-period reductions are cut as one period repeated under
    every family: the increment is taken without building the four-period reduction; with one
    op of the middle period cut otherwise, the reductions are not periodic."""
    from dataclasses import replace

    from shardplan.search.step import profiles
    from shardplan.search.step.stages import stage_mesh

    problem = Problem.make(_gpt, "4x2", batch=16, dtype="bf16")
    mesh = at_precision(problem.mesh, problem.options)
    search = _Search(problem, mesh, _drec_planner)
    prof = search.profiler(8, stage_mesh(mesh, 1))
    periods = []
    real = profiles.reduced_chunk
    monkeypatch.setattr(profiles, "reduced_chunk", lambda *a: periods.append(a[3]) or real(*a))
    for family in prof.families():
        assert prof.profile(0, len(prof.segs), family) is not None
        assert prof.increments[family] is not None
    assert periods and 4 not in periods
    shape = chunk_shape(prof.split, 0, len(prof.segs))
    family = next(f for f in prof.families() if f.method == "megatron")
    assert prof._periodic(shape, family)
    three = max((v for k, v in prof.reduced.items()), key=lambda v: len(v[0].ops))[0]
    key = (id(three), replace(family, sequence_parallel=False))
    cuts = dict(prof.per_sub[key][1])
    middle = three.ops[len(three.ops) // 2].name
    cuts[middle] = tuple("x" if c is None else None for c in cuts[middle])
    prof.per_sub[key] = (three, cuts)
    assert not prof._periodic(shape, family)


def test_a_family_absent_from_the_first_chunk_prices_the_later_ones(monkeypatch):
    """A family that does not apply to the first long chunk priced (D-Rec's plan there has no
    tensor-parallel round for sequence parallelism: its reductions price None) proves no
    increment, and a later chunk where it applies is priced as if first, equal to a fresh
    profiler's price (Llama-3 8B on mesh 9 crashed on None's fields here)."""
    from shardplan.search.step import profiles
    from shardplan.search.step.stages import stage_mesh

    problem = Problem.make(_gpt17, "3x2", batch=12, dtype="bf16")
    mesh = at_precision(problem.mesh, problem.options)
    starts = _Search(problem, mesh, _drec_planner).chunk_starts(2)

    def profiler():
        search = _Search(problem, mesh, _drec_planner)
        return search.profiler(6, stage_mesh(mesh, 1))

    family = profiles.Family("megatron", 2)
    fresh = profiler().profile(starts[1], len(profiler().segs), family)
    assert fresh is not None
    prof = profiler()
    real = profiles.StageProfiler._reduced
    first_chunk = {"calls": 0}

    def absent_first(self, shape, j, fam):  # the first chunk's two reductions: planned (their
        found = real(self, shape, j, fam)  # strategies cut as one period repeated) but priced None
        if fam == family and shape.a == starts[0] and first_chunk["calls"] < 2:
            first_chunk["calls"] += 1
            return None
        return found

    monkeypatch.setattr(profiles.StageProfiler, "_reduced", absent_first)
    prof.profile(starts[0], starts[1], family)
    assert first_chunk["calls"] == 2 and prof.increments[family] is None
    later = prof.profile(starts[1], len(prof.segs), family)
    assert later is not None and math.isclose(later.fwd_compute_s, fresh.fwd_compute_s)
    assert math.isclose(later.activation_bytes, fresh.activation_bytes)


def _gpt12(batch: int):
    return zoo.build("gpt3", batch=batch, layers=12, hidden=128, heads=4, vocab=500, seq=32)


def _two_stage_profiler():
    from shardplan.search.step.stages import stage_mesh

    problem = Problem.make(_gpt12, "4x2", batch=16, dtype="bf16")
    mesh = at_precision(problem.mesh, problem.options)
    search = _Search(problem, mesh, _drec_planner)
    return search.profiler(4, stage_mesh(mesh, 2)), search.chunk_starts(2)


def _close(a, b) -> bool:
    from shardplan.search.step.increments import peaks, same_increment

    return (
        same_increment(a, a, b, b)
        and peaks(a) == peaks(b)
        and all(
            math.isclose(x, y, rel_tol=1e-9, abs_tol=1e-15)
            for x, y in (
                (a.fwd_compute_s, b.fwd_compute_s),
                (a.activation_bytes, b.activation_bytes),
            )
        )
    )


def test_a_later_chunk_cut_as_the_first_chunks_period_is_not_priced_at_three_periods(
    monkeypatch,
):
    """The second stage's six layers are cut, under every family, as the first stage's period
    repeated: its profile is its two-period reduction plus the first stage's increment, no
    three-period reduction of it priced (`_by_structure`), and equal to the profile priced from
    both its reductions."""
    from shardplan.search.step import profiles

    prof, starts = _two_stage_profiler()
    families = prof.families()
    for family in families:
        prof.profile(starts[0], starts[1], family)
    assert all(prof.periods[f] is not None for f in families if prof.increments[f] is not None)
    sizes = _profiled_sizes(monkeypatch)
    shape = chunk_shape(prof.split, starts[1], len(prof.segs))
    two = len(prof._reduced_graph(shape, 2)[0].ops)
    quick, skipped = {}, 0
    for family in families:
        sizes.clear()
        quick[family] = prof.profile(starts[1], len(prof.segs), family)
        if prof.periods[family] is not None and quick[family] is not None:
            assert sizes and max(sizes) == two, family  # only its two-period reduction priced
            skipped += 1
    assert skipped >= 4  # D-Rec, data-parallel, Megatron t=2 with and without SP
    slow, _ = _two_stage_profiler()
    monkeypatch.setattr(profiles.StageProfiler, "_by_structure", lambda *a: None)
    for family in families:
        slow.profile(starts[0], starts[1], family)
        want = slow.profile(starts[1], len(slow.segs), family)
        assert (quick[family] is None) == (want is None), family
        assert want is None or _close(quick[family], want), family


def test_a_later_chunk_cut_otherwise_is_priced_at_three_periods():
    """One op of the second stage's three-period reduction cut otherwise, or a parameter split
    in a round its tensor-parallel rounds did not have (sequence parallelism reads them graph-
    wide): its period is not the first stage's, and `_by_structure` declines."""
    from dataclasses import replace

    prof, starts = _two_stage_profiler()
    family = next(f for f in prof.families() if f.method == "megatron" and f.tensor == 2)
    prof.profile(starts[0], starts[1], family)
    shape = chunk_shape(prof.split, starts[1], len(prof.segs))
    assert prof._by_structure(shape, family) is not None
    three = prof._reduced_graph(shape, 3)[0]
    key = (id(three), replace(family, sequence_parallel=False))
    cuts = dict(prof.per_sub[key][1])
    middle = three.ops[len(three.ops) // 2].name
    cuts[middle] = tuple("x" if c is None else None for c in cuts[middle])
    prof.per_sub[key] = (three, cuts)
    assert prof._by_structure(shape, family) is None
    prof, starts = _two_stage_profiler()
    prof.profile(starts[0], starts[1], family)
    period = prof.periods[family]
    prof.periods[family] = (*period[:3], (*period[3], 99))  # other tensor-parallel rounds
    assert prof._by_structure(shape, family) is None
