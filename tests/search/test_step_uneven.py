"""Uneven pipeline stages with interleaving (search/step/uneven.py): each stage's layers in v
equal chunks as megatron-core lays them out, the first / last cut balanced by hand, searched by
the engines that can say it, exported and read back."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardplan import zoo
from shardplan.cli.main import main
from shardplan.cost import CostOptions
from shardplan.cost.step import Levers
from shardplan.errors import PlanError
from shardplan.exporters.megatron import to_megatron
from shardplan.exporters.torchtitan import to_torchtitan
from shardplan.mesh import parse_mesh
from shardplan.search.step.menus import MENUS, Layout, _candidates, graph_layers, layout_plan
from shardplan.search.step.structure import LayerSplit
from shardplan.search.step.uneven import (
    chunk_layers,
    chunk_starts,
    first_last_layers,
    stage_counts,
)

OPTS = CostOptions.make("shardplan", True, "adam", "bf16")


def test_chunk_layers_follow_megatron_cores_interleaved_offsets():
    """megatron-core (`get_transformer_layer_offset`, uneven interleaved branch): virtual stage
    j holds f/v layers on the first stage, k/v on each middle one, l/v on the last, in stage
    order, then virtual stage j + 1 the same again."""
    assert chunk_layers((4, 2, 2, 4), 2) == (2, 1, 1, 2, 2, 1, 1, 2)
    assert chunk_layers((3, 2, 1), 1) == (3, 2, 1)
    assert stage_counts((2, 1, 1, 2, 2, 1, 1, 2), 4) == (4, 2, 2, 4)
    with pytest.raises(PlanError, match="divisible"):
        chunk_layers((3, 2, 2, 3), 2)


def test_first_last_layers_with_two_chunks_per_stage_by_hand():
    """Ten unit-cost layers, a free embedding and a head costing one layer, four stages.
    Two chunks per stage: every count even, so the middle stages hold 2 each (4 each leaves
    too few) and the first and last 6 between them: 4-2-2-2 costs 4, 3 on the head's stage,
    where 2-2-2-4 costs 5 there; no even cut (10 is not 4 x 2 x k). One chunk per stage:
    2-3-3-2 costs 3 (the head's stage 2 + 1), the least any cut reaches, found first in
    (k, f) order. Five chunks per stage need 20 layers."""
    split = LayerSplit(first=1, period=1, layers=10, segments=12)
    cost = [0.0, *[1.0] * 10, 1.0]
    assert first_last_layers(split, 4, cost, 2) == (4, 2, 2, 2)
    assert first_last_layers(split, 4, cost) == (2, 3, 3, 2)
    assert first_last_layers(split, 4, cost, 5) is None


def test_engines_that_say_uneven_stages_search_them_interleaved():
    """Ten layers on four pipeline stages (batch 16: micro-batch counts that are multiples of
    4): Megatron-LM and torchtitan get uneven cuts with two chunks per stage as candidates,
    each stage's chunks equal; DeepSpeed (even partition, no interleaving) none."""
    probe = zoo.build("gpt3", layers=10, hidden=256, heads=4, seq=64, vocab=512, batch=16)
    split, mesh = graph_layers(probe), parse_mesh("4x2")
    for engine, expect in [("megatron", True), ("torchtitan", True), ("deepspeed", False)]:
        found = _candidates(probe, split, 16, mesh, OPTS, MENUS[engine])
        interleaved = {c[-1] for c in found if c[1] == 4 and c[4] == 2 and c[-1]}
        assert bool(interleaved) == expect, engine
        for layers in interleaved:
            assert layers == chunk_layers(stage_counts(layers, 4), 2)
            assert sum(layers) == 10


def test_an_uneven_interleaved_layout_exports_and_reads_back(tmp_path, capsys):
    """4-2-2-2 layers in two chunks per stage: Megatron-LM's flags say the first stage's 4 with
    --num-virtual-stages-per-pipeline-rank 2, torchtitan's TOML eight module lists; each
    --from-config scores the step exported."""
    graph = zoo.build("gpt2-small", small=True, layers=10, batch=32 // 8)
    layout = Layout(1, 4, 8, Levers(), 2, stage_layers=chunk_layers((4, 2, 2, 2), 2))
    plan = ["plan", "gpt2-small", "--small", "--layers", "10", "--batch", "32", "--mesh", "4x4"]
    plan += ["--dtype", "bf16", "-q"]
    for engine, export, name in [
        ("megatron", to_megatron, "flags.sh"),
        ("torchtitan", to_torchtitan, "job.toml"),
    ]:
        tp = layout_plan(graph, 32, parse_mesh("4x4"), OPTS, layout, MENUS[engine])
        assert tp is not None and tp.step is not None and tp.virtual_stages == 2
        text = export(tp)
        if engine == "megatron":
            assert "--decoder-first-pipeline-num-layers 4" in text
            assert "--num-virtual-stages-per-pipeline-rank 2" in text
            assert "--decoder-last-pipeline-num-layers" not in text  # the middle's 2
        path = tmp_path / name
        path.write_text(text)
        out = path.with_suffix(".json")
        assert main([*plan, "--from-config", str(path), "--json", str(out)]) == 0, engine
        capsys.readouterr()
        data = json.loads(out.read_text())
        assert "layers per chunk [2, 1, 1, 1, 2, 1, 1, 1]" in data["notes"][0], data["notes"]
        assert abs(data["step"]["step_s"] - tp.step.step_s) <= 1e-9 * tp.step.step_s, engine
    flags = tmp_path / "odd.sh"
    flags.write_text(
        "--pipeline-model-parallel-size 4 --num-virtual-stages-per-pipeline-rank 2 "
        "--decoder-first-pipeline-num-layers 3 --decoder-last-pipeline-num-layers 3 --bf16\n"
    )
    assert main([*plan, "--from-config", str(flags)]) == 5  # 3 is not 2 equal chunks
    assert "do not split into 2 equal chunks" in capsys.readouterr().err


def _oracle(costs: list[float], stages: int, virtual: int) -> float | None:
    """The least heaviest-stage cost over every first / middle / last cut (multiples of
    `virtual`, the middle even, the even cut included), each layer placed by walking megatron-
    core's interleaved order directly: virtual round j, stage s, its count / v layers."""
    layers = len(costs) - 2
    best = None
    for first in range(virtual, layers + 1, virtual):
        for last in range(virtual, layers - first + 1, virtual):
            middle, rest = stages - 2, layers - first - last
            if (middle == 0 and rest) or (middle and (rest % (middle * virtual) or rest == 0)):
                continue
            counts = [first, *[rest // middle] * middle, last] if middle else [first, last]
            load = [0.0] * stages
            load[0], load[-1] = costs[0], costs[-1]  # the embedding and the head
            layer = 1
            for _ in range(virtual):
                for s, count in enumerate(counts):
                    for _ in range(count // virtual):
                        load[s] += costs[layer]
                        layer += 1
            best = max(load) if best is None else min(best, max(load))
    return best


@settings(deadline=None)
@given(
    layers=st.integers(2, 14),
    stages=st.integers(2, 5),
    virtual=st.integers(1, 3),
    seed=st.lists(st.integers(1, 9), min_size=16, max_size=16),
)
def test_first_last_layers_is_the_best_first_last_cut(layers, stages, virtual, seed):
    """Against an oracle walking every cut Megatron-LM can say: the cut found (or the even one
    when none is returned) has the least heaviest stage, and its counts are sayable."""
    costs = [float(seed[0] % 3), *map(float, seed[1 : layers + 1]), float(seed[-1])]
    split = LayerSplit(first=1, period=1, layers=layers, segments=layers + 2)
    found = first_last_layers(split, stages, costs, virtual)
    best = _oracle(costs, stages, virtual)
    if found is None:  # no cut at all, or none beats the even one
        if best is None:
            return
        assert layers % (stages * virtual) == 0
        found = (layers // stages,) * stages
    assert sum(found) == layers and all(c % virtual == 0 and c >= virtual for c in found)
    assert len(set(found[1:-1])) <= 1
    starts = chunk_starts(split, stages * virtual, chunk_layers(found, virtual))
    ends = [*starts[1:], len(costs)]
    chunk = [sum(costs[a:e]) for a, e in zip(starts, ends, strict=True)]
    heaviest = max(sum(chunk[s::stages]) for s in range(stages))
    assert best is not None and heaviest == pytest.approx(best)
