"""The engine menus: `--target` never returns a plan its engine cannot express (property over
zoo models, meshes and budgets), fits the budget, and layer detection finds the layers."""

from __future__ import annotations

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from shardplan import zoo
from shardplan.cost import CostOptions
from shardplan.errors import ArgumentError, InfeasibleError
from shardplan.exporters import training_json
from shardplan.exporters.engine_layout import read_layout
from shardplan.mesh import parse_mesh
from shardplan.search.step.menus import MENUS, graph_layers, layer_split, plan_for_menu

MODELS = ("gpt2-small", "bert-base", "vit-b16", "mlp", "gpt3")


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
