"""Folding repeated layers: the runs found, the exact score, and plans equal to the full search."""

from __future__ import annotations

import random

import pytest

import shardplan as sp
from shardplan.cost import CostOptions, evaluate_strategies
from shardplan.search.drec.fold import find_fold
from shardplan.search.drec.search import _variants, drec
from shardplan.sharding import cut_problem, local_extents

OPTS = CostOptions.make()


def _deep(name: str, layers: int) -> sp.Graph:
    return sp.zoo.build(name, small=True, layers=layers)


def test_a_deep_gpt_folds_to_four_blocks():
    graph = _deep("gpt3", 9)
    fold = find_fold(graph)
    assert fold is not None
    assert fold.count >= 8  # the run may start on the embedding's add, which matches a residual
    assert len(fold.reduced.ops) == len(graph.ops) - (fold.count - 4) * fold.period
    names = {op.name for op in fold.reduced.ops}
    assert "h.0.attn.q.linear" in names and "h.8.attn.q.linear" in names
    assert "h.5.attn.q.linear" not in names


def test_shallow_or_irregular_graphs_do_not_fold():
    assert find_fold(_deep("gpt3", 2)) is None
    assert find_fold(sp.zoo.build("alexnet", small=True)) is None


def test_a_residual_stream_through_many_blocks_is_not_folded():
    """ResNet's add/relu chain joins heavy ops many blocks apart: folding would change what an
    op sees, so the full graph is searched (and the plan is the full search's)."""
    graph = sp.zoo.build("resnet152", small=True)
    fold = find_fold(graph)
    assert fold is not None
    assert fold.flex_graph() is None


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_an_imported_llama_folds_and_plans_as_the_full_search(model_type):
    """A Hugging Face Llama / Qwen2 imports its RMSNorm decomposed (pow, mean, rsqrt, mul): the
    final norm's walks run along the residual adds many layers back. Its suffix (norm and head)
    is lighter than one layer, so those walks stop at the kept blocks and the run folds; the
    plan is the full search's, op for op."""
    pytest.importorskip("transformers")
    from transformers import AutoConfig

    from shardplan.importers.hf_config import from_hf
    from shardplan.search.drec.search import drec_folded

    arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[model_type]
    config = AutoConfig.for_model(
        model_type, architectures=[arch], hidden_size=64, intermediate_size=128,
        num_hidden_layers=12, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
    )  # fmt: skip
    graph = from_hf(config, batch=4, seq=32)
    fold = find_fold(graph)
    assert fold is not None and fold.count == 12 and fold.flex_graph() is not None
    for mesh in ("8", "2x4"):
        folded, used = drec_folded(graph, sp.parse_mesh(mesh), OPTS)
        assert used is not None  # the fold was searched, its interior uniform
        assert folded == drec(graph, sp.parse_mesh(mesh), OPTS, fold=False)


def _random_plan(graph, mesh, rng):
    plan = {}
    for op in graph.ops:
        strategy: list[str | None] = []
        for r, rnd in enumerate(mesh.rounds):
            extents = local_extents(
                op, tuple(strategy) + (None,) * (len(mesh.rounds) - r), mesh.rounds, r
            )
            valid = [None] + [
                d.name
                for d in op.signature.loop_dims
                if cut_problem(op, d.name, extents[d.name], rnd.q) is None
            ]
            strategy.append(rng.choice(valid))
        plan[op.name] = tuple(strategy)
    return plan


def _folded(model: str, mesh: str, train: bool):
    """An 8-layer `model`, its mesh, options and fold."""
    graph = _deep(model, 8)
    fold = find_fold(graph)
    assert fold is not None
    return graph, sp.parse_mesh(mesh), CostOptions.make(train=train), fold


def _uniform_plan(fold, mesh, rng: random.Random) -> dict:
    """A random plan of the reduced graph whose block 2 decides as block 1 (a uniform interior)."""
    plan = _random_plan(fold.reduced, mesh, rng)
    ops, first = fold.full.ops, fold.start + fold.period
    for j in range(fold.period):
        plan[ops[first + fold.period + j].name] = plan[ops[first + j].name]
    return plan


@pytest.mark.parametrize(
    ("model", "mesh", "train"), [("gpt3", "2x4", True), ("bert-base", "6", False)]
)
def test_the_folded_score_is_the_evaluator_on_the_expanded_plan(model, mesh, train):
    graph, mesh, opts, fold = _folded(model, mesh, train)
    rng = random.Random(3)
    for _ in range(4):
        plan = _uniform_plan(fold, mesh, rng)
        assert fold.uniform(plan)
        full = fold.expand(plan)
        cost = evaluate_strategies(graph, mesh, full, opts)
        for lam in (0.0, 1e-9):
            want = cost.total + lam * cost.memory_per_device
            assert fold.score(mesh, plan, opts, lam) == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize(
    ("model", "layers", "mesh"),
    [("gpt3", 8, "8"), ("gpt3", 7, "2x4"), ("bert-base", 6, "12"), ("vit-b16", 6, "8")],
)
def test_folded_search_finds_the_full_search_plan(model, layers, mesh):
    graph = _deep(model, layers)
    mesh = sp.parse_mesh(mesh)
    fold = find_fold(graph)
    assert fold is not None
    flex = fold.flex_graph()
    assert flex is not None
    assert _variants(fold.reduced, mesh, OPTS, 0.0, fold, flex) is not None  # the fold is used
    assert drec(graph, mesh, OPTS) == drec(graph, mesh, OPTS, fold=False)


@pytest.mark.parametrize(
    ("preset", "train", "lam"),
    [("mindspore", True, 0), ("shardplan", False, 0), ("shardplan", True, 4)],
)
def test_folded_search_matches_under_other_presets_and_memory_pressure(preset, train, lam):
    graph, mesh = _deep("gpt3", 8), sp.parse_mesh("2x4")
    opts = CostOptions.make(preset, train)
    base = evaluate_strategies(graph, mesh, drec(graph, mesh, opts, fold=False), opts)
    memory_lambda = lam * base.total / max(base.memory_per_device, 1.0)
    assert drec(graph, mesh, opts, memory_lambda) == drec(
        graph, mesh, opts, memory_lambda, fold=False
    )


@pytest.mark.parametrize(
    ("model", "mesh", "train"), [("gpt3", "4x8", True), ("bert-base", "12", False)]
)
def test_the_folded_total_with_parameter_layouts_is_the_evaluator(model, mesh, train):
    """FSDP's parameter storage (a layout from the shape alone) on the reduced graph: the
    weighted rows are the evaluator's total of the expanded plan stored the same way."""
    from shardplan.search import experts

    graph, m = _deep(model, 8), sp.parse_mesh(mesh)
    opts = CostOptions.make(train=train)
    fold = find_fold(graph)
    assert fold is not None
    reduced = experts.data_parallel(fold.reduced, m)
    assert fold.uniform(reduced)
    layouts = experts.fsdp_param_layouts(graph, m)
    want = evaluate_strategies(graph, m, fold.expand(reduced), opts, layouts).total
    got = fold.total(m, reduced, opts, experts.fsdp_param_layouts(fold.reduced, m))
    assert got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize(
    ("model", "mesh", "train"),
    [("gpt3", "2x4", True), ("bert-base", "6", False), ("llama3-8b", "4x2", True)],
)
def test_the_full_breakdown_read_off_the_reduced_rows_is_the_evaluator(model, mesh, train):
    """`Fold.repeats`' rows give the full graph's breakdown equal, field by field and row by row,
    to the evaluator walking every op (random uniform plans and D-Rec's), and refuse a plan
    that is not an expansion or a ZeRO pricing."""
    from dataclasses import replace

    from shardplan.cost import ScoreCache

    graph, mesh, opts, fold = _folded(model, mesh, train)
    rng = random.Random(5)
    ops = fold.full.ops
    plans = [drec(graph, mesh, opts)]
    plans += [fold.expand(_uniform_plan(fold, mesh, rng)) for _ in range(3)]
    for full in plans:
        cache = ScoreCache(graph, mesh, opts)
        rows = fold.repeats(mesh, full, opts, cache)
        assert rows is not None
        assert evaluate_strategies(graph, mesh, full, opts, None, cache, rows) == (
            evaluate_strategies(graph, mesh, full, opts)
        )
    cut = next(p for p in plans if any(any(p[op.name]) for op in ops))  # a plan cutting ops
    block4 = ops[fold.start + 4 * fold.period : fold.start + 5 * fold.period]  # not kept
    moved = next(op.name for op in block4 if any(cut[op.name]))
    other = {**cut, moved: (None,) * len(mesh.rounds)}  # block 4 unlike block 2
    cache = ScoreCache(graph, mesh, opts)
    assert fold.repeats(mesh, other, opts, cache) is None
    zero = replace(opts, zero=1)
    assert fold.repeats(mesh, plans[0], zero, ScoreCache(graph, mesh, zero)) is None
