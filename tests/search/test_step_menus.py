"""The engine menus: `--target` never returns a plan its engine cannot express (property over
zoo models, meshes and budgets), fits the budget, and layer detection finds the layers."""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from shardplan import zoo
from shardplan.cli.engines import export_text
from shardplan.cost import CostOptions
from shardplan.cost.step import Levers
from shardplan.errors import ArgumentError, InfeasibleError
from shardplan.exporters import training_json
from shardplan.exporters.engine_layout import read_layout
from shardplan.mesh import parse_mesh
from shardplan.search.step.menus import MENUS, graph_layers, layer_split, plan_for_menu

MODELS = ("gpt2-small", "bert-base", "vit-b16", "mlp", "gpt3", "moe-llm", "mixtral-8x7b")


def test_layer_split_finds_the_repeating_run() -> None:
    # prologue a b, four layers of (x y), epilogue z
    split = layer_split(["a", "b", "x", "y", "x", "y", "x", "y", "x", "y", "z"])
    assert (split.first, split.period, split.layers) == (2, 2, 4)
    assert layer_split(["a", "b", "c"]).layers == 1  # no repeats: one layer


@pytest.mark.parametrize("layers", [2, 3, 6])
def test_graph_layers_counts_transformer_layers(layers: int) -> None:
    g = zoo.build("gpt2-small", small=True, layers=layers)
    assert graph_layers(g).layers == layers


@settings(max_examples=25)
@given(
    model=st.sampled_from(MODELS),
    mesh=st.sampled_from(["8", "2x4", "4x2", "2x2x2", "4x4"]),
    batch=st.sampled_from([8, 16, 32]),
    budget=st.one_of(st.none(), st.floats(2e5, 5e7)),
    engine=st.sampled_from(sorted(MENUS)),
)
def test_target_plans_are_always_expressible(model, mesh, batch, budget, engine) -> None:
    opts = CostOptions.make("shardplan", True, "adam", "bf16")
    m = parse_mesh(mesh)

    def build(b: int):
        return zoo.build(model, small=True, batch=b)

    try:
        tp = plan_for_menu(build, batch, m, opts, budget, MENUS[engine])
    except InfeasibleError:
        event("infeasible")
        return  # nothing of the menu fits: an error, never an inexpressible plan
    event(f"plan: pipeline {tp.pipeline_stages}")
    assert tp.step is not None
    if budget is not None:
        assert tp.step.memory_per_device <= budget
    layout = read_layout(training_json.from_json(training_json.to_json(tp)), MENUS[engine])
    assert layout.tensor * layout.pipeline * layout.data == m.size
    assert layout.micro_batch_size * layout.data * layout.micro_batches == batch
    assert sum(layout.layers) == graph_layers(build(batch)).layers
    data = training_json.to_dict(tp)
    data["model_config"] = {"name": model, "small": True}
    assert export_text(data, engine)  # the exporter writes it (no PlanError)


def test_a_precision_the_engine_lacks_is_an_argument_error() -> None:
    opts = CostOptions.make("shardplan", True, "adam", "fp16")
    with pytest.raises(ArgumentError, match="torchtitan trains in bf16, fp32"):
        plan_for_menu(lambda b: None, 8, parse_mesh("8"), opts, None, MENUS["torchtitan"])


def test_an_engine_without_any_layout_says_why_not_that_nothing_fits():
    from shardplan import zoo
    from shardplan.errors import InfeasibleError

    build = lambda b: zoo.build("bert-base", small=True, batch=b)  # noqa: E731
    opts = CostOptions.make(dtype="fp32")
    with pytest.raises(InfeasibleError, match="deepspeed has no layout of .* on mesh 5 at batch 2"):
        plan_for_menu(build, 2, parse_mesh("5"), opts, None, MENUS["deepspeed"])
    with pytest.raises(InfeasibleError, match=r"fits 10 KB per device on mesh 8 \(\d+ layouts"):
        plan_for_menu(build, 8, parse_mesh("8"), opts, 1e4, MENUS["deepspeed"])


def _every_layout(build, batch, mesh, opts, budget, menu):
    """Every layout the menu can say, priced whole by `layout_plan` (exact, one by one)."""
    from shardplan.errors import PlanError
    from shardplan.search.step.menus import MICRO_BATCH_SIZES, Layout, layout_plan
    from shardplan.search.step.stages import stage_mesh

    probe = build(batch)
    layers = graph_layers(probe).layers
    steps = []
    for n in range(1, mesh.shape[0] + 1):
        if mesh.shape[0] % n or layers % n:
            continue
        for t in menu.tensor_degrees(stage_mesh(mesh, n)):
            data = mesh.size // (n * t)
            for mbs in MICRO_BATCH_SIZES:
                if batch % (data * mbs):
                    continue
                m = batch // (data * mbs)
                vs = [v for v in range(1, layers // n + 1) if v == 1 or menu.virtual]
                for v, sp in [(v, sp) for v in vs for sp in (False, True)]:
                    if sp and not (menu.sequence_parallel and t > 1):
                        continue
                    layout = Layout(t, n, m, Levers(sequence_parallel=sp), v)
                    try:
                        tp = layout_plan(build(batch // m), batch, mesh, opts, layout, menu, budget)
                    except PlanError:  # v chunks that do not divide the layers or m
                        continue
                    if tp is not None and tp.step is not None:
                        steps.append((tp.step.step_s, layout))
    return steps


@pytest.mark.parametrize(
    ("mesh", "budget", "engine"),
    [("4x4", None, "megatron"), ("2x4", 4e9, "torchtitan")],
)
def test_target_plan_is_never_slower_than_a_layout_its_engine_can_say(mesh, budget, engine):
    """Sequence parallelism and interleaved chunks included (on 4x4 Megatron's fastest layout
    interleaves 4 chunks per stage): the menu search's bound prunes soundly and its
    extrapolated chunk profiles pick what the exact ones would."""
    opts = CostOptions.make("shardplan", True, "adam", "bf16")
    m, menu = parse_mesh(mesh), MENUS[engine]

    def build(b: int):
        return zoo.build("gpt3", layers=8, hidden=2048, heads=16, seq=1024, vocab=8192, batch=b)

    every = _every_layout(build, 32, m, opts, budget, menu)
    tp = plan_for_menu(build, 32, m, opts, budget, menu)
    assert tp.step is not None and every
    fastest, layout = min(every, key=lambda x: x[0])
    assert tp.step.step_s <= fastest * (1 + 1e-9), layout
    if engine == "megatron":
        assert tp.virtual_stages == layout.virtual > 1  # what v = 1 search missed


def test_torchtitan_expert_ways_are_fsdp_ways_so_its_layouts_with_them_run_zero3() -> None:
    """torchtitan's expert- and context-parallel ways are FSDP ways: a menu layout with expert
    parallelism takes only ZeRO-3 levers, and its export is accepted (not refused)."""
    from shardplan.exporters.torchtitan import to_torchtitan
    from shardplan.search.step.menus import Layout, layout_plan

    menu = MENUS["torchtitan"]
    assert {lv.zero for lv in menu.levers(1, sharded_ways=True)} == {3}
    assert {lv.zero for lv in menu.levers(1)} == {0, 3}
    opts = CostOptions.make("shardplan", True, "adam", "bf16")
    graph = zoo.build("moe-llm", small=True, batch=8)
    tp = layout_plan(graph, 8, parse_mesh("2x4"), opts, Layout(1, 1, 1, Levers(), expert=2), menu)
    assert tp is not None and all(st.levers.zero == 3 for st in tp.stages)
    assert "expert_parallel_degree = 2" in to_torchtitan(tp)
