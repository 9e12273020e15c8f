"""One front door: SPMD and training-step plans through `shardplan.plan` / `solve`, each
carrying the Problem it was solved for (budget included), and re-planning keeping it."""

import pytest

import shardplan as sp
from shardplan.errors import ArgumentError, InfeasibleError, SolverError
from shardplan.exporters import plan_json, training_json
from shardplan.search.explain import replan
from shardplan.search.recipes import megatron_recipe
from shardplan.search.scale import plan_training
from shardplan.training import TrainingPlan


def gpt(batch):
    return sp.zoo.build("gpt3", small=True, batch=batch)


def test_step_and_recipe_through_the_front_door_carry_their_budget():
    tp = sp.plan(gpt, "2x2", method="step", batch=8, dtype="bf16", memory="1GB")
    assert isinstance(tp, TrainingPlan) and tp.problem.budget == 1e9
    assert tp.step.memory_per_device <= 1e9
    recipe = sp.plan(
        gpt, "2x2", method="megatron-recipe", batch=8, dtype="bf16", tensor=2, pipeline=2,
        memory="1GB",
    )
    assert recipe.method == "megatron-recipe" and recipe.problem.budget == 1e9
    assert recipe.pipeline_stages == 2 and recipe.micro_batches == 8  # data 1 x size 1


def test_the_old_entry_points_give_the_same_plans():
    from shardplan.cost import CostOptions
    from shardplan.mesh import parse_mesh

    opts = CostOptions.make("shardplan", True, "adam", "bf16")
    mesh = parse_mesh("2x2")
    old = plan_training(gpt, 8, mesh, opts, 1e9)
    new = sp.plan(gpt, "2x2", method="step", batch=8, dtype="bf16", memory="1GB")
    assert old.stages == new.stages and old.step.step_s == new.step.step_s
    old_r = megatron_recipe(gpt, 8, mesh, opts, 2, 2)
    new_r = sp.plan(
        gpt, mesh, method="megatron-recipe", batch=8, dtype="bf16", tensor=2, pipeline=2
    )
    assert old_r.stages == new_r.stages and old_r.step.step_s == new_r.step.step_s


def test_a_recipe_over_the_budget_is_refused():
    with pytest.raises(InfeasibleError, match="over the"):
        sp.plan(gpt, "2x2", method="megatron-recipe", batch=8, dtype="bf16", memory="100KB")


def test_training_methods_check_their_problem():
    with pytest.raises(ArgumentError, match="needs the global batch"):
        sp.plan(gpt, "2x2", method="step", dtype="bf16")
    with pytest.raises(SolverError, match="chooses the ZeRO stage per pipeline stage"):
        sp.plan(gpt, "2x2", method="step", batch=8, zero=1)
    with pytest.raises(SolverError, match="needs train=True"):
        sp.plan(gpt, "2x2", method="step", batch=8, train=False)
    with pytest.raises(SolverError, match="has no option"):
        sp.plan(gpt, "2x2", method="step", batch=8, tensor=2)
    with pytest.raises(ArgumentError, match="recompute"):
        sp.plan(gpt, "2x2", method="megatron-recipe", batch=8, recompute="some")


def test_spmd_plans_carry_their_problem_and_replanning_keeps_the_budget():
    g = sp.zoo.build("gpt2-small", small=True)
    p = sp.plan(g, "2x4", memory="30MB")
    assert p.problem.budget == 30e6 and p.problem.graph is g
    back = plan_json.from_json(plan_json.to_json(p))
    assert back == p and back.problem.budget == 30e6
    again = replan(back, {"h.0.mlp.fc.linear": ("n", None, None)})
    assert again.problem.budget == 30e6 and again.cost.memory_per_device <= 30e6
    # a plan file of schema /1 (no problem) still reads, with no budget
    old = plan_json.to_dict(p)
    old["schema"] = "shardplan.plan/1"
    del old["problem"]
    assert plan_json.from_json(old).problem.budget is None


def test_training_plan_json_stores_its_problem():
    tp = sp.plan(gpt, "2x2", method="step", batch=8, dtype="bf16", memory="1GB")
    back = training_json.from_json(training_json.to_json(tp))
    assert back.problem.budget == 1e9 and back.problem.batch == 8
    assert back.step.step_s == tp.step.step_s


def test_a_mesh_axis_crossing_nodes_is_named_with_the_split_that_prices_the_node():
    g = sp.zoo.build("mlp", batch=64)
    crossing = [n for n in sp.plan(g, "16").notes if "crosses nodes" in n]
    assert len(crossing) == 1 and "mesh 2x8" in crossing[0] and "25 GB/s" in crossing[0]
    inner = [n for n in sp.plan(g, "2x16").notes if "crosses nodes" in n]
    assert len(inner) == 1 and "'gpu'" in inner[0] and "mesh 2x2x8" in inner[0]
    # nodes x GPUs, a mesh inside one node, a size no node divides, the user's own links: silent
    for mesh in ("2x8", "8", "6", "12", sp.Mesh((16,), bandwidth_bytes_per_s=(50e9,))):
        assert not [n for n in sp.plan(g, mesh).notes if "crosses nodes" in n], mesh
    said: list[str] = []
    tp = sp.plan(gpt, "16", method="step", batch=16, dtype="bf16", progress=said.append)
    assert any("mesh 2x8" in n for n in tp.notes)
    assert "mesh 2x8" in said[0]  # told before the search, which such a mesh can make slow
