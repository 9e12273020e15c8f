"""Sequence, context and expert parallelism and interleaving in the engine exports: read off
Megatron-recipe plans (the construction the step search uses), written as each engine's flags,
accepted by megatron-core's TransformerConfig and parallel_state and by torchtitan's config
manager and ParallelDims, refused by DeepSpeed naming the route."""

from __future__ import annotations

import dataclasses
import importlib.util
from functools import cache
from pathlib import Path

import pytest
from test_engines import run_checks  # tests/exporters is on sys.path (rootdir-less test dir)

from shardplan import zoo
from shardplan.cost import CostOptions
from shardplan.cost.step import Levers, Recompute
from shardplan.errors import PlanError
from shardplan.exporters import deepspeed, megatron, torchtitan, training_json
from shardplan.exporters.engine_layout import architecture, read_layout
from shardplan.mesh import parse_mesh
from shardplan.search.step.menus import MENUS
from shardplan.search.step.recipes import megatron_recipe
from shardplan.training import Stage, TrainingPlan

MESH = parse_mesh("4x8")
BATCH = 32
OPTS = CostOptions.make("shardplan", True, "adam", "bf16")
GPT = ("gpt2-small", {"small": True, "layers": 8})
MOE = ("mixtral-8x7b", {"small": True, "layers": 4})
CASES = {
    # name: (model, recipe knobs); t=2 x pipeline 2 on 4x8 leaves 8 data ways
    "sp-interleaved": (GPT, dict(recompute="selective", sequence_parallel=True, virtual_stages=2,
                                 distributed_optimizer=True)),
    "cp": (GPT, dict(recompute="full", context=2, sequence_parallel=True)),
    "cp-zero1": (GPT, dict(recompute="none", context=2, distributed_optimizer=True)),
    "ep": (MOE, dict(recompute="none", expert=2, sequence_parallel=True)),
    "overlap": (GPT, dict(recompute="full", virtual_stages=2, distributed_optimizer=True,
                          overlap_grad_reduce=True, overlap_p2p=False)),
    "tp-overlap": (GPT, dict(recompute="selective", sequence_parallel=True,
                             tp_comm_overlap=True)),
}  # fmt: skip


@cache
def plan_of(case: str) -> TrainingPlan:
    (name, kw), knobs = CASES[case]
    tp = megatron_recipe(
        lambda b: zoo.build(name, batch=b, **kw), BATCH, MESH, OPTS, 2, 2, 1, **knobs
    )
    return training_json.from_json(training_json.to_json(tp))  # what `export` reads


def arch_of(case: str) -> dict[str, int]:
    (name, kw), _ = CASES[case]
    return architecture(name, True, {"layers": kw["layers"]})


@pytest.mark.parametrize("case", sorted(CASES))
def test_layout_reads_the_plans_levers(case: str) -> None:
    tp = plan_of(case)
    lay = read_layout(tp, MENUS["megatron"])
    knobs = CASES[case][1]
    lv = tp.stages[0].levers
    assert lay.sequence_parallel == lv.sequence_parallel == knobs.get("sequence_parallel", False)
    assert lay.context == knobs.get("context", 1) and (lay.context > 1) == lv.context_parallel
    assert lay.expert == knobs.get("expert", 1)
    assert lay.virtual == tp.virtual_stages == knobs.get("virtual_stages", 1)
    assert len(lay.layers) == lay.pipeline * lay.virtual
    assert lay.data * lay.tensor * lay.context * lay.pipeline == MESH.size
    assert lay.moe == (CASES[case][0] is MOE)
    assert lay.tp_comm_overlap == lv.tp_comm_overlap == knobs.get("tp_comm_overlap", False)


def test_megatron_flags_carry_the_levers() -> None:
    text = {c: megatron.to_megatron(plan_of(c), arch_of(c)) for c in CASES}
    assert "--sequence-parallel" in text["sp-interleaved"]
    assert "--num-virtual-stages-per-pipeline-rank 2" in text["sp-interleaved"]
    assert "--context-parallel-size 2" in text["cp"]
    assert "--sequence-parallel" not in text["cp-zero1"]
    moe = arch_of("ep")
    for part in (
        f"--num-experts {moe['experts']}",
        f"--moe-router-topk {moe['top_k']}",
        f"--moe-ffn-hidden-size {moe['expert_ffn']}",
        "--expert-model-parallel-size 2",
    ):
        assert part in text["ep"]
    assert "--num-experts" not in text["cp"]


def test_megatron_core_accepts_the_levers(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core", reason="megatron-core: pip install 'shardplan[engines]'")
    cases, lays = [], []
    for c in sorted(CASES):
        lay = read_layout(plan_of(c), MENUS["megatron"])
        kw = megatron.megatron_kwargs(lay, arch_of(c))
        ok = {
            "engine": "megatron",
            "repo": str(Path(__file__).resolve().parents[2]),
            "kwargs": kw,
            "world": MESH.size,
            "global_batch_size": BATCH,
            "micro_batch_size": lay.micro_batch_size,
        }
        cases += [ok, {**ok, "world": MESH.size // 2 + kw["tensor_model_parallel_size"] + 1}]
        lays.append(lay)
    res = run_checks(cases, tmp_path)
    for i, lay in enumerate(lays):
        good, bad = res[2 * i : 2 * i + 2]
        assert good["ok"], good
        assert (good["dp"], good["micro_batches"]) == (lay.data, lay.micro_batches)
        assert (good["cp"], good["ep"]) == (lay.context, lay.expert)
        assert good["vpp"] == (lay.virtual if lay.virtual > 1 else None)
        assert good["sequence_parallel"] == lay.sequence_parallel
        assert good["tp_comm_overlap"] == lay.tp_comm_overlap
        assert (good["num_moe_experts"] is not None) == lay.moe
        assert not bad["ok"], bad


def test_torchtitan_accepts_the_levers(tmp_path: Path) -> None:
    if importlib.util.find_spec("torchtitan") is None:
        pytest.skip("torchtitan: pip install 'shardplan[engines]'")
    pytest.importorskip("tyro", reason="torchtitan's config manager needs tyro")
    cases, lays = [], []
    for i, c in enumerate(("sp-interleaved", "cp", "tp-overlap")):
        tp = _at_zero3(plan_of(c))
        path = tmp_path / f"job{i}.toml"
        path.write_text(torchtitan.to_torchtitan(tp, arch_of(c)))
        cases.append({"engine": "torchtitan", "world": MESH.size, "path": str(path)})
        lays.append(read_layout(tp, MENUS["torchtitan"]))
    res = run_checks(cases, tmp_path)
    for got, lay in zip(res, lays, strict=True):
        assert got["ok"], got
        assert (got["tp"], got["pp"], got["cp"], got["dp"]) == (
            lay.tensor, lay.pipeline, lay.context, lay.data
        )  # fmt: skip
        assert got["schedule"] == ("Interleaved1F1B" if lay.virtual > 1 else "1F1B")
        assert len(got["module_fqns_per_model_part"]) == lay.pipeline * lay.virtual
        assert got["async_tp"] == lay.tp_comm_overlap
        if lay.tp_comm_overlap:  # torchtitan runs async TP only on a compiled model
            assert got["compile"] and "model" in got["compile_components"]


def _at_zero3(tp: TrainingPlan) -> TrainingPlan:
    """`tp` with ZeRO-3 and full recomputation on every stage (torchtitan's FSDP and AC modes),
    its sends not overlapped (torchtitan's schedules wait each send)."""
    stages = tuple(
        Stage(
            s.plan,
            dataclasses.replace(s.levers, zero=3, recompute=Recompute.FULL, overlap_p2p=False),
        )
        for s in tp.stages
    )
    return dataclasses.replace(tp, stages=stages, step=None)


def test_torchtitan_refuses_context_parallelism_on_replicated_parameters() -> None:
    with pytest.raises(PlanError, match="context parallelism x2 with ZeRO-0"):
        torchtitan.to_torchtitan(
            dataclasses.replace(
                plan_of("cp"),
                stages=tuple(
                    Stage(s.plan, dataclasses.replace(s.levers, recompute=Recompute.NONE))
                    for s in plan_of("cp").stages
                ),
                step=None,
            )
        )


@pytest.mark.parametrize("case", ["sp-interleaved", "cp", "ep"])
def test_deepspeed_refuses_what_its_config_cannot_say(case: str) -> None:
    with pytest.raises(PlanError, match="--to megatron"):
        deepspeed.to_deepspeed(plan_of(case))


def test_megatron_refuses_an_expert_model_without_its_expert_count() -> None:
    lay = read_layout(plan_of("ep"), MENUS["megatron"])
    with pytest.raises(PlanError, match="--num-experts"):
        megatron.megatron_flags(lay, {})
    with pytest.raises(PlanError, match="shared"):
        megatron.megatron_kwargs(lay, {**arch_of("ep"), "shared": 1})


def test_a_context_lever_without_context_cuts_is_refused() -> None:
    tp = plan_of("sp-interleaved")
    stages = tuple(
        Stage(s.plan, dataclasses.replace(s.levers, context_parallel=True)) for s in tp.stages
    )
    with pytest.raises(PlanError, match="context-parallel lever is on"):
        read_layout(dataclasses.replace(tp, stages=stages, step=None), MENUS["megatron"])


def test_overlap_levers_round_trip_and_become_megatron_flags() -> None:
    tp = plan_of("overlap")  # read back from its JSON
    lv = tp.stages[0].levers
    # data ways 8: megatron-core's default bucket max(4e7, 1e6 x 8) parameters
    assert (lv.overlap_grad_reduce, lv.overlap_p2p, lv.bucket_elements) == (True, False, 40_000_000)
    lay = read_layout(tp, MENUS["megatron"])
    assert (lay.overlap_grad_reduce, lay.overlap_p2p) == (True, False)
    flags = megatron.megatron_flags(lay, arch_of("overlap"))
    assert "--overlap-grad-reduce" in flags
    # Megatron-LM requires the p2p overlap of an interleaved schedule at pipeline 2
    assert "--no-overlap-p2p-communication" not in flags
    assert megatron.megatron_kwargs(lay, arch_of("overlap"))["overlap_p2p_comm"] is True
    deeper = dataclasses.replace(lay, pipeline=4, layers=lay.layers * 2)
    assert "--no-overlap-p2p-communication" in megatron.megatron_flags(deeper)
    assert megatron.megatron_kwargs(deeper)["overlap_p2p_comm"] is False
    # the search's plans (no overlap) on a plain schedule: no overlap flag at all
    plain = megatron.megatron_flags(read_layout(plan_of("cp"), MENUS["megatron"]))
    assert not any("overlap" in f for f in plain)


def test_deepspeed_writes_overlap_comm_at_zero_stages_that_have_it() -> None:
    lay = read_layout(plan_of("overlap"), MENUS["megatron"])
    zero1 = dataclasses.replace(lay, virtual=1, layers=(4, 4), overlap_p2p=False)
    assert deepspeed.deepspeed_config(zero1)["zero_optimization"] == {
        "stage": 1,
        "overlap_comm": True,
    }
    zero0 = dataclasses.replace(zero1, zero=0, overlap_grad_reduce=False)
    assert deepspeed.deepspeed_config(zero0)["zero_optimization"] == {"stage": 0}


def test_tp_comm_overlap_becomes_megatron_flags_and_kwargs() -> None:
    tp = plan_of("tp-overlap")  # read back from its JSON
    assert {s.levers.tp_comm_overlap for s in tp.stages} == {True}
    lay = read_layout(tp, MENUS["megatron"])
    flags = megatron.megatron_flags(lay, arch_of("tp-overlap"))
    assert "--tp-comm-overlap" in flags and "--sequence-parallel" in flags
    kw = megatron.megatron_kwargs(lay, arch_of("tp-overlap"))
    assert kw["tp_comm_overlap"] is True and kw["sequence_parallel"] is True
    for case in ("sp-interleaved", "overlap"):  # plans without the lever: no flag
        other = read_layout(plan_of(case), MENUS["megatron"])
        assert "--tp-comm-overlap" not in megatron.megatron_flags(other, arch_of(case))
        assert "tp_comm_overlap" not in megatron.megatron_kwargs(other, arch_of(case))


def test_tp_comm_overlap_becomes_torchtitan_async_tp_with_compile(tmp_path: Path) -> None:
    text = torchtitan.to_torchtitan(_at_zero3(plan_of("tp-overlap")), arch_of("tp-overlap"))
    assert "enable_async_tensor_parallel = true" in text
    assert '[compile]\nenable = true\ncomponents = ["model", "loss"]' in text
    plain = torchtitan.to_torchtitan(_at_zero3(plan_of("cp")), arch_of("cp"))
    assert "async_tensor_parallel" not in plain and "[compile]" not in plain
    if importlib.util.find_spec("torchtitan") is None:
        return
    pytest.importorskip("tyro", reason="torchtitan's config manager needs tyro")
    path = tmp_path / "no-compile.toml"  # torchtitan's own check refuses async TP uncompiled
    path.write_text(text.replace("enable = true\ncomponents", "enable = false\ncomponents"))
    (res,) = run_checks([{"engine": "torchtitan", "world": MESH.size, "path": str(path)}], tmp_path)
    assert not res["ok"] and "Async TP requires" in res["error"], res


def test_deepspeed_refuses_tp_comm_overlap_naming_the_lever() -> None:
    with pytest.raises(PlanError, match="tp_comm_overlap.*re-plan without it"):
        deepspeed.to_deepspeed(plan_of("tp-overlap"))
    lay = read_layout(plan_of("tp-overlap"), MENUS["megatron"])  # a layout read for Megatron
    with pytest.raises(PlanError, match="tp_comm_overlap.*re-plan without it"):
        deepspeed.deepspeed_config(lay)
    with pytest.raises(PlanError, match="tp_comm_overlap.*re-plan without it"):
        deepspeed.megatron_deepspeed_flags(lay, arch_of("tp-overlap"))


@pytest.mark.parametrize("engine", ["megatron", "torchtitan"])
def test_tp_comm_overlap_on_some_stages_only_is_refused(engine: str) -> None:
    tp = plan_of("tp-overlap")
    mixed = (tp.stages[0], Stage(tp.stages[1].plan, Levers(Recompute.SELECTIVE, 0, True)))
    with pytest.raises(PlanError, match=r"tp_comm_overlap on stage\(s\) \[0\] but not on \[1\]"):
        read_layout(dataclasses.replace(tp, stages=mixed, step=None), MENUS[engine])


def test_engine_menus_keep_tp_comm_overlap_only_where_the_engine_says_it() -> None:
    assert (MENUS["megatron"].tp_comm_overlap, MENUS["torchtitan"].tp_comm_overlap) == (True, True)
    assert not MENUS["deepspeed"].tp_comm_overlap
    on = Levers(Recompute.FULL, 1, sequence_parallel=True, tp_comm_overlap=True)
    assert MENUS["megatron"].engine_levers(on, 2).tp_comm_overlap
    assert MENUS["torchtitan"].engine_levers(on, 2).tp_comm_overlap
    assert not MENUS["deepspeed"].engine_levers(on, 2).tp_comm_overlap
    no_sp = dataclasses.replace(on, sequence_parallel=False)
    assert not MENUS["megatron"].engine_levers(no_sp, 2).tp_comm_overlap
    # the menus' own searches never turn it on (every engine's default is off)
    assert not any(
        MENUS[e].engine_levers(lv, 2).tp_comm_overlap for e in MENUS for lv in MENUS[e].levers(1)
    )
