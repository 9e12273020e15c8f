"""The engine menus: `--target` never returns a plan its engine cannot express (property over
zoo models, meshes and budgets), fits the budget, and layer detection finds the layers."""

from __future__ import annotations

import tomllib

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
from shardplan.search.step.engine_menus import Overlaps
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
    flags=st.tuples(*[st.sampled_from([None, False, True])] * 4),
)
def test_target_plans_are_always_expressible(model, mesh, batch, budget, engine, flags) -> None:
    """With any overlap flags too: those the engine's configuration cannot say are refused,
    the others give plans its exporter writes (`Menu.with_overlaps`, `read_layout`)."""
    opts = CostOptions.make("shardplan", True, "adam", "bf16")
    m = parse_mesh(mesh)

    def build(b: int):
        return zoo.build(model, small=True, batch=b)

    try:
        menu = MENUS[engine].with_overlaps(Overlaps(*flags))
    except ArgumentError:
        event("overlap flags refused")
        return
    try:
        tp = plan_for_menu(build, batch, m, opts, budget, menu)
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


def test_first_last_layers_balances_the_embedding_and_head_by_hand() -> None:
    """Six unit-cost layers, a free embedding and a head costing one layer: four stages are
    best cut 1-2-2-1 (heaviest 2: the head beside one layer), five 2-1-1-1-1; on three and two
    stages no first / last cut beats the even one (heaviest 3 and 4)."""
    from shardplan.search.step.structure import LayerSplit
    from shardplan.search.step.uneven import first_last_layers

    split = LayerSplit(first=1, period=1, layers=6, segments=8)
    cost = [0.0, 1, 1, 1, 1, 1, 1, 1]
    assert first_last_layers(split, 4, cost) == (1, 2, 2, 1)
    assert first_last_layers(split, 5, cost) == (2, 1, 1, 1, 1)
    assert first_last_layers(split, 3, cost) is None
    assert first_last_layers(split, 2, cost) is None


def test_engines_that_say_uneven_stages_search_them_and_deepspeed_does_not() -> None:
    """Six layers on four pipeline stages: Megatron-LM (first / last counts) and torchtitan
    (module lists) get the uneven cut as a candidate, DeepSpeed (even partition) none."""
    from shardplan.search.step.menus import _candidates

    opts = CostOptions.make("shardplan", True, "adam", "bf16")
    probe = zoo.build("gpt3", layers=6, hidden=256, heads=4, seq=64, vocab=512, batch=16)
    split, mesh = graph_layers(probe), parse_mesh("4x2")
    for engine, expect in [("megatron", True), ("torchtitan", True), ("deepspeed", False)]:
        found = _candidates(probe, split, 16, mesh, opts, MENUS[engine])
        uneven = {c[-1] for c in found if c[1] == 4}
        assert bool(uneven - {()}) == expect, engine
        assert all(sum(layers) == 6 for layers in uneven - {()})
        assert not any(c[1] == 4 and c[-1] == () for c in found)  # 4 does not divide 6


def test_an_uneven_layout_exports_to_megatron_and_torchtitan_but_not_deepspeed() -> None:
    from shardplan.errors import PlanError
    from shardplan.exporters.deepspeed import to_deepspeed
    from shardplan.exporters.megatron import to_megatron
    from shardplan.exporters.torchtitan import to_torchtitan
    from shardplan.search.step.menus import Layout, layout_plan

    opts = CostOptions.make("shardplan", True, "adam", "bf16")
    graph = zoo.build("gpt3", layers=6, hidden=256, heads=4, seq=64, vocab=512, batch=4)
    layout = Layout(1, 4, 4, Levers(), stage_layers=(1, 2, 2, 1))
    tp = layout_plan(graph, 16, parse_mesh("4x2"), opts, layout, MENUS["megatron"])
    assert tp is not None and tp.pipeline_stages == 4
    assert [len(graph_layers_of(st.plan.graph)) for st in tp.stages] == [1, 2, 2, 1]
    flags = to_megatron(tp)
    assert "--decoder-first-pipeline-num-layers 1" in flags
    assert "--decoder-last-pipeline-num-layers 1" in flags
    titan = layout_plan(graph, 16, parse_mesh("4x2"), opts, layout, MENUS["torchtitan"])
    assert titan is not None
    parts = tomllib.loads(to_torchtitan(titan))["parallelism"]["module_fqns_per_model_part"]
    assert [sum(name.startswith("layers.") for name in part) for part in parts] == [1, 2, 2, 1]
    with pytest.raises(PlanError, match="layers per pipeline stage"):
        to_deepspeed(layout_plan(graph, 16, parse_mesh("4x2"), opts, layout, MENUS["deepspeed"]))
    with pytest.raises(PlanError, match="adding up to the model's 6 layers"):
        layout_plan(graph, 16, parse_mesh("4x2"), opts, Layout(1, 4, 4, stage_layers=(1, 2, 2)))


def graph_layers_of(graph) -> list[str]:
    """The distinct transformer layer names (`layers.<i>` / `h.<i>`) a stage's ops belong to."""
    import re

    found = [re.match(r"(?:.*\.)?(?:layers|h|blocks?)\.(\d+)\.", op.name) for op in graph.ops]
    return sorted({m.group(1) for m in found if m})


def test_llama3_405b_on_16_stages_is_cut_as_meta_cut_it() -> None:
    """Llama 3 405B (126 layers) on 16 pipeline stages: the paper's cut (Llama Team, "The Llama
    3 Herd of Models", 2024, section 3.3.2: one layer fewer on the first and the last stage,
    which hold the embedding and the head), 7 + 14 x 8 + 7."""
    from shardplan.ir.segments import segments
    from shardplan.search.step.stages import segment_flops
    from shardplan.search.step.uneven import first_last_layers

    probe = zoo.build("llama3-405b", batch=1)
    split = graph_layers(probe)
    flops = segment_flops(probe, segments(probe))
    assert first_last_layers(split, 16, flops) == (7, *[8] * 14, 7)


def test_context_parallelism_is_searched_where_the_engine_can_say_it() -> None:
    """Batch 2 on 8 devices of one axis (no tensor degree there): only context parallelism
    or pipeline stages fill the ways a sample per rank leaves idle. Megatron-LM and torchtitan
    return a layout with context ways (what the search finds fastest among them), which
    exports; DeepSpeed, whose config has neither, has none."""
    opts = CostOptions.make("shardplan", True, "adam", "bf16")

    def build(b: int):
        return zoo.build("gpt3", layers=2, hidden=256, heads=4, seq=256, vocab=512, batch=b)

    for engine in ("megatron", "torchtitan"):
        tp = plan_for_menu(build, 2, parse_mesh("8"), opts, None, MENUS[engine])
        layout = read_layout(training_json.from_json(training_json.to_json(tp)), MENUS[engine])
        assert layout.context > 1 and layout.data * layout.micro_batch_size <= 2, engine
        assert layout.context * layout.pipeline * layout.data == 8
        assert f"context x{layout.context}" in tp.notes[0]
        data = training_json.to_dict(tp)
        data["model_config"] = {"name": "gpt3"}
        assert export_text(data, engine)
    with pytest.raises(InfeasibleError, match="deepspeed has no layout"):
        plan_for_menu(build, 2, parse_mesh("8"), opts, None, MENUS["deepspeed"])
