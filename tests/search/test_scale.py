"""The training-step search, the stage boundaries, segments, the recipe and TrainingPlan JSON."""

import pytest

from shardplan import zoo
from shardplan.cost import CostOptions
from shardplan.cost.step import Recompute
from shardplan.errors import InfeasibleError, PlanError
from shardplan.exporters import training_json
from shardplan.ir.op import Role
from shardplan.ir.segments import segments, subgraph
from shardplan.mesh import parse_mesh
from shardplan.search.step.recipes import megatron_recipe
from shardplan.search.step.search import micro_batch_options, plan_training
from shardplan.search.step.stages import balanced_stages

BF16 = CostOptions.make(dtype="bf16")


def _gpt(batch: int):
    return zoo.build("gpt2-small", small=True, batch=batch)


def test_segments_cut_where_one_activation_crosses():
    g = _gpt(4)
    segs = segments(g)
    # tok_emb | pos_emb+emb | (attention half, MLP half) x 2 layers | ln_f | lm_head | loss
    assert len(segs) == 3 + 2 * 2 + 2
    assert segs[0].start == 0 and segs[-1].stop == len(g.ops)
    for before, after in zip(segs, segs[1:], strict=False):
        assert before.stop == after.start
        crossing = {
            t
            for t, p in g.producer.items()
            if p < after.start
            and g.tensors[t].role is Role.ACTIVATION
            and any(i >= after.start for i, _ in g.consumers.get(t, ()))
        }
        assert crossing == {after.entry}


def test_subgraph_turns_incoming_activations_into_inputs_that_keep_their_gradient():
    g = _gpt(4)
    seg = segments(g)[3]
    sub = subgraph(g, seg.start, seg.stop)
    assert sub.tensors[seg.entry].role is Role.INPUT
    assert seg.entry in sub.requires_grad
    assert [op.name for op in sub.ops] == [op.name for op in g.ops[seg.start : seg.stop]]


@pytest.mark.parametrize(
    ("costs", "stages", "starts"),
    [
        ([1, 1, 1, 1, 4], 2, [0, 4]),  # 4 | 4
        ([3, 1, 1, 1, 3], 3, [0, 1, 4]),  # 3 | 3 | 3
        ([5, 1, 1, 1, 1, 1], 2, [0, 1]),  # 5 | 5
        ([1, 2, 3], 3, [0, 1, 2]),
    ],
)
def test_stage_boundaries_minimise_the_heaviest_stage(costs, stages, starts):
    assert balanced_stages(costs, stages) == starts


def test_micro_batch_options_fill_the_stage_devices_first():
    mesh = parse_mesh("4x2")
    # one sample per device of the whole mesh (8), then per way of the outer axis (4)
    assert micro_batch_options(16, mesh) == [4, 2]
    assert micro_batch_options(3, parse_mesh("2x2")) == [1]


def test_unconstrained_search_turns_no_lever_on():
    tp = plan_training(_gpt, 16, parse_mesh("2x4"), BF16, None)
    # no recomputation; ZeRO-1 only where it is faster: it shards the optimizer step over the
    # data-parallel group (the distributed optimizer), its collectives cost the all-reduce's
    assert all(s.levers.recompute is Recompute.NONE and s.levers.zero <= 1 for s in tp.stages)
    assert all("faster under the model" in n for n in tp.notes if "ZeRO" in n)
    assert tp.step is not None and tp.step.step_s > 0


def test_a_tight_budget_is_met_with_levers_and_the_notes_say_which():
    mesh = parse_mesh("2x4")
    free = plan_training(_gpt, 16, mesh, BF16, None, stages=[1])
    assert free.step is not None
    # 2x4 lies in one 8-GPU node (both axes NVLink): the Megatron stage plan alone fits 0.4 of
    # the free plan's memory, so the budget that needs a lever is tighter
    budget = 0.3 * free.step.memory_per_device
    tp = plan_training(_gpt, 16, mesh, BF16, budget)
    assert tp.step is not None and tp.step.memory_per_device <= budget
    assert any(s.levers.recompute is not Recompute.NONE or s.levers.zero for s in tp.stages) or (
        tp.pipeline_stages > 1 or tp.micro_batches > free.micro_batches
    )
    assert any("that fit" in n or "pipeline" in n or "micro-batches" in n for n in tp.notes)


def test_an_impossible_budget_is_an_infeasible_error_with_the_leanest_need():
    with pytest.raises(InfeasibleError, match=r"no training plan of 'gpt2-small' fits.*leanest"):
        plan_training(_gpt, 16, parse_mesh("2x4"), BF16, 1e3)


def test_pipeline_stages_cover_the_graph_in_order_and_json_round_trips():
    tp = plan_training(_gpt, 16, parse_mesh("4x2"), BF16, None, stages=[2])
    assert tp.pipeline_stages == 2
    names = [op.name for s in tp.stages for op in s.plan.graph.ops]
    assert names == [op.name for op in _gpt(16 // tp.micro_batches).ops]
    assert tp.axes[0].startswith("node axis: pipeline x2")
    back = training_json.from_json(training_json.to_json(tp))
    assert back.step is not None and tp.step is not None
    assert back.step.step_s == pytest.approx(tp.step.step_s)
    assert back.micro_batches == tp.micro_batches
    assert [s.levers for s in back.stages] == [s.levers for s in tp.stages]


def test_training_plan_rejects_stages_that_do_not_divide_the_outer_axis():
    tp = plan_training(_gpt, 16, parse_mesh("4x2"), BF16, None, stages=[2])
    data = training_json.to_dict(tp)
    data["mesh"]["shape"] = [3, 2]
    with pytest.raises(PlanError, match="2 pipeline stages must divide"):
        training_json.from_json(data)


def test_megatron_recipe_structure():
    mesh = parse_mesh("4x2")
    tp = megatron_recipe(_gpt, 16, mesh, BF16, tensor=2, pipeline=2)
    assert tp.pipeline_stages == 2
    assert tp.micro_batches == 16 // (2 * 1)  # data-parallel ways 2, micro-batch size 1
    assert tp.axes == ("node axis: pipeline x2 + data x2", "gpu axis: tensor x2")
    assert all(s.levers.recompute is Recompute.FULL for s in tp.stages)
    with pytest.raises(PlanError, match="does not divide"):
        megatron_recipe(_gpt, 16, mesh, BF16, tensor=2, pipeline=3)


def test_a_stage_is_segmented_like_the_model():
    # a stage cut mid-layer: its incoming activation counts as live, so no one-op segments
    g = _gpt(4)
    segs = segments(g)
    start, stop = segs[3].start + 2, segs[-1].stop  # inside the first layer's MLP half
    sub = subgraph(g, start, stop)
    inner = [(s.start - start, s.stop - start) for s in segs if s.start >= start]
    got = [(s.start, s.stop) for s in segments(sub)]
    assert got[1:] == inner  # after the partial first segment, the model's own cuts
    assert got[0] == (0, inner[0][0])


def test_stage_boundaries_match_every_cut_tried_by_brute_force():
    import itertools
    import random

    rng = random.Random(7)
    for _ in range(200):
        k = rng.randint(1, 9)
        stages = rng.randint(1, k)
        costs = [rng.choice([0.0, 1.0, 2.0, 5.0, rng.random()]) for _ in range(k)]
        starts = balanced_stages(costs, stages)
        assert starts[0] == 0 and len(starts) == stages and starts == sorted(set(starts))

        best = min(
            _heaviest(costs, [0, *rest])
            for rest in itertools.combinations(range(1, k), stages - 1)
        )
        assert _heaviest(costs, starts) == pytest.approx(best, abs=1e-12)


def _heaviest(costs, cut):
    bounds = [*cut, len(costs)]
    return max(sum(costs[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
