"""Engine exports: accepted by torchtitan / megatron-core / DeepSpeed's own configuration code
for the plan's world size, rejected by it for another world size or batch; inexpressible plans
are typed errors; configs read back score the same step."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from shardplan import zoo
from shardplan.cost import CostOptions
from shardplan.cost.step import Levers, Recompute
from shardplan.errors import PlanError
from shardplan.exporters import deepspeed, megatron, torchtitan, training_json
from shardplan.exporters.engine_layout import architecture, read_layout
from shardplan.importers.engine_config import read_engine_config
from shardplan.mesh import parse_mesh
from shardplan.search.step.menus import MENUS, Layout, layout_plan
from shardplan.search.step.search import plan_training
from shardplan.training import Stage, TrainingPlan

REPO = Path(__file__).resolve().parents[2]
CHECKS = Path(__file__).with_name("engine_checks.py")
MODEL = {"small": True, "layers": 4}
BATCH = 64
MESH = parse_mesh("4x8")
OPTS = CostOptions.make("shardplan", True, "adam", "bf16")
ARCH = architecture("gpt2-small", True, {"layers": 4})
N, S, F = Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL


def build(b: int):
    return zoo.build("gpt2-small", batch=b, **MODEL)


@cache
def plan_of(t: int, n: int, m: int, rc: Recompute, z: int) -> TrainingPlan:
    tp = layout_plan(build(BATCH // m), BATCH, MESH, OPTS, Layout(t, n, m, Levers(rc, z)))
    assert tp is not None
    return training_json.from_json(training_json.to_json(tp))  # what `export` reads


def run_checks(cases: list[dict], tmp_path: Path) -> list[dict]:
    path = tmp_path / "cases.json"
    path.write_text(json.dumps(cases))
    out = subprocess.run(
        [sys.executable, str(CHECKS), str(path)], capture_output=True, text=True, timeout=600
    )
    line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, out.stderr[-3000:]
    return json.loads(line[-1][len("RESULT ") :])


MEGATRON = [(2, 2, 4, S, 1), (4, 4, 8, F, 0), (1, 1, 2, N, 0)]
TITAN = [(1, 2, 4, F, 3), (1, 1, 2, N, 0), (1, 4, 8, N, 0)]
DEEPSPEED = [(2, 2, 4, F, 1), (1, 1, 2, N, 3), (4, 1, 2, N, 2)]


def test_megatron_core_accepts_exports_and_rejects_mismatches(tmp_path: Path) -> None:
    pytest.importorskip("megatron.core", reason="megatron-core: pip install 'shardplan[engines]'")
    cases, expect = [], []
    for knobs in MEGATRON:
        lay = read_layout(plan_of(*knobs), MENUS["megatron"])
        kw = megatron.megatron_kwargs(lay, ARCH)
        base = {"engine": "megatron", "repo": str(REPO), "kwargs": kw}
        ok = {
            **base,
            "world": MESH.size,
            "global_batch_size": BATCH,
            "micro_batch_size": lay.micro_batch_size,
        }
        cases += [
            ok,
            {**ok, "world": MESH.size + kw["tensor_model_parallel_size"] * 3 + 1},  # world off
            {**ok, "global_batch_size": BATCH + lay.data // 2 + 1},  # batch off
        ]
        expect.append((lay.data, lay.micro_batches))
    res = run_checks(cases, tmp_path)
    for i, (dp, m) in enumerate(expect):
        good, bad_world, bad_batch = res[3 * i : 3 * i + 3]
        assert good["ok"], good
        assert (good["dp"], good["micro_batches"], good["num_layers"]) == (dp, m, 4)
        assert not bad_world["ok"] and "divisible" in bad_world["error"], bad_world
        assert not bad_batch["ok"] and "divisible" in bad_batch["error"], bad_batch


def test_megatron_flags_carry_the_layout() -> None:
    flags = megatron.megatron_flags(read_layout(plan_of(2, 2, 4, S, 1), MENUS["megatron"]), ARCH)
    text = " ".join(flags)
    for part in (
        "--tensor-model-parallel-size 2",
        "--pipeline-model-parallel-size 2",
        "--micro-batch-size 2",  # 64 / 4 micro-batches / 8 data ways
        "--global-batch-size 64",
        "--recompute-granularity selective",
        "--use-distributed-optimizer",
        "--bf16",
        "--num-layers 4",
        "--num-attention-heads 4",
    ):
        assert part in text


def test_deepspeed_accepts_exports_and_rejects_mismatches(tmp_path: Path) -> None:
    pytest.importorskip("deepspeed", reason="deepspeed: pip install 'shardplan[engines]'")
    pytest.importorskip("megatron.core", reason="the DeepSpeed check uses megatron's mpu groups")
    cases, expect = [], []
    for knobs in DEEPSPEED:
        lay = read_layout(plan_of(*knobs), MENUS["deepspeed"])
        cfg = deepspeed.deepspeed_config(lay)
        kw = {
            "tensor_model_parallel_size": lay.tensor,
            "pipeline_model_parallel_size": lay.pipeline,
        }
        ok = {"engine": "deepspeed", "world": MESH.size, "config": cfg, "kwargs": kw}
        cases += [
            ok,
            {**ok, "world": 2 * MESH.size},  # twice the data ways: the batch no longer adds up
            {**ok, "config": {**cfg, "train_batch_size": BATCH + 1}},
        ]
        expect.append((lay.data, lay.micro_batches, lay.zero))
    res = run_checks(cases, tmp_path)
    for i, (dp, m, z) in enumerate(expect):
        good, bad_world, bad_batch = res[3 * i : 3 * i + 3]
        assert good["ok"], good
        assert (good["dp"], good["gradient_accumulation_steps"], good["zero_stage"]) == (dp, m, z)
        assert good["train_batch_size"] == BATCH
        for bad in (bad_world, bad_batch):
            assert not bad["ok"] and "batch" in bad["error"], bad


def test_torchtitan_accepts_exports_and_rejects_world_mismatch(tmp_path: Path) -> None:
    if importlib.util.find_spec("torchtitan") is None:  # its __init__ needs Triton: not imported
        pytest.skip("torchtitan: pip install 'shardplan[engines]'")
    pytest.importorskip("tyro", reason="torchtitan's config manager needs tyro")
    cases, expect = [], []
    for i, knobs in enumerate(TITAN):
        lay = read_layout(plan_of(*knobs), MENUS["torchtitan"])
        path = tmp_path / f"job{i}.toml"
        path.write_text(torchtitan.to_torchtitan(plan_of(*knobs), ARCH))
        ok = {"engine": "torchtitan", "world": MESH.size, "path": str(path)}
        cases += [ok, {**ok, "world": MESH.size + 8}]
        expect.append(lay)
    res = run_checks(cases, tmp_path)
    for i, lay in enumerate(expect):
        good, bad = res[2 * i : 2 * i + 2]
        assert good["ok"], good
        assert (good["dp"], good["tp"], good["pp"]) == (lay.data, lay.tensor, lay.pipeline)
        assert good["ac_mode"] == lay.recompute.value
        # torchtitan's Trainer: accumulation = global / (local x dp); its pipeline schedule
        # splits the local batch into local / microbatch_size micro-batches
        local, glob = good["local_batch_size"], good["global_batch_size"]
        assert glob == BATCH and glob % (local * good["dp"]) == 0
        steps = (
            glob
            // (local * good["dp"])
            * (local // good["pipeline_microbatch_size"] if lay.pipeline > 1 else 1)
        )
        assert steps == lay.micro_batches
        if lay.pipeline > 1:
            parts = good["module_fqns_per_model_part"]
            assert len(parts) == lay.pipeline and parts[0][0] == "tok_embeddings"
            assert sum(p[0] != "tok_embeddings" or len(p) > 1 for p in parts) == lay.pipeline
        assert not bad["ok"] and "WORLD_SIZE" in bad["error"], bad


@pytest.mark.parametrize("engine", ["torchtitan", "megatron", "deepspeed"])
def test_unrestricted_plan_is_refused_with_stage_op_and_target(engine: str) -> None:
    tp = plan_training(build, BATCH, MESH, OPTS, None)
    tp = training_json.from_json(training_json.to_json(tp))
    with pytest.raises(PlanError) as e:
        read_layout(tp, MENUS[engine])
    msg = str(e.value)
    assert f"--target {engine}" in msg and "stage" in msg


def test_levers_differing_between_stages_are_refused() -> None:
    tp = plan_of(2, 2, 4, S, 1)
    mixed = dataclasses.replace(
        tp, stages=(tp.stages[0], Stage(tp.stages[1].plan, Levers(F, 1))), step=None
    )
    with pytest.raises(PlanError, match="levers differ between stages"):
        read_layout(mixed, MENUS["megatron"])
    with pytest.raises(PlanError, match="selective recomputation with ZeRO-1"):
        read_layout(tp, MENUS["deepspeed"])  # DeepSpeed has no selective recomputation


def test_a_lever_without_a_mapping_is_refused_by_name() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Future(Levers):
        offload: bool = False

    tp = plan_of(1, 1, 2, N, 0)
    plain = dataclasses.replace(tp, stages=(Stage(tp.stages[0].plan, Future()),))
    read_layout(plain, MENUS["megatron"])  # at its default the field changes nothing
    on = dataclasses.replace(tp, stages=(Stage(tp.stages[0].plan, Future(offload=True)),))
    with pytest.raises(PlanError, match="Future.offload = True"):
        read_layout(on, MENUS["megatron"])


def test_torchtitan_refuses_tensor_parallelism_without_sequence_parallel() -> None:
    with pytest.raises(PlanError, match="without sequence parallelism"):
        torchtitan.to_torchtitan(plan_of(2, 2, 4, S, 1))


@pytest.mark.parametrize(
    ("engine", "knobs"),
    [
        ("megatron", (2, 2, 4, S, 1)),
        ("torchtitan", (1, 2, 4, F, 3)),
        ("deepspeed", (1, 2, 4, F, 1)),
    ],
)
def test_round_trip_scores_the_same_step(engine: str, knobs: tuple) -> None:
    tp = plan_of(*knobs)
    text = {
        "megatron": lambda: megatron.to_megatron(tp, ARCH),
        "torchtitan": lambda: torchtitan.to_torchtitan(tp, ARCH),
        "deepspeed": lambda: deepspeed.to_deepspeed(tp),
    }[engine]()
    cfg = read_engine_config(text)
    assert cfg.engine == engine and cfg.batch == BATCH
    layout = cfg.layout(MESH, BATCH)
    assert layout == Layout(*knobs[:3], Levers(*knobs[3:]))
    again = layout_plan(build(BATCH // layout.micro_batches), BATCH, MESH, OPTS, layout)
    assert again is not None and again.step is not None and tp.step is not None
    assert again.step.step_s == tp.step.step_s


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(("zero", "prefetch"), [(1, False), (3, False), (3, True)])
def test_deepspeed_runs_a_step_under_the_export_on_gloo(
    tmp_path: Path, zero: int, prefetch: bool
) -> None:
    """2 gloo processes: DeepSpeed takes one optimizer step after the plan's micro-batches; a
    ZeRO-3 plan priced without the prefetch runs with DeepSpeed's prefetch bucket at 0."""
    pytest.importorskip("deepspeed", reason="deepspeed: pip install 'shardplan[engines]'")
    mesh = parse_mesh("2")
    graph = zoo.build("gpt2-small", batch=8, **MODEL)
    levers = Levers(N, zero, prefetch=prefetch)
    tp = layout_plan(graph, 16, mesh, OPTS, Layout(1, 1, 2, levers))
    assert tp is not None
    cfg = tmp_path / "ds.json"
    cfg.write_text(deepspeed.to_deepspeed(training_json.from_json(training_json.to_json(tp))))
    port, script = _free_port(), Path(__file__).with_name("deepspeed_step.py")
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(r), "2", str(port), str(cfg)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    results = []
    for out, err in outs:
        line = [x for x in out.splitlines() if x.startswith("RESULT ")]
        assert line, err[-3000:]
        results.append(json.loads(line[-1][len("RESULT ") :]))
    for r in results:
        assert r["optimizer_steps"] == 1 and r["zero_stage"] == zero
        assert r["train_batch_size"] == 16 and r["gradient_accumulation_steps"] == 2
        assert (r["prefetch_bucket_size"] == 0) is (zero == 3 and not prefetch)


_FIRST, _LAST = "num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage"
_VPP = "virtual_pipeline_model_parallel_size"


@pytest.mark.parametrize(
    ("layers", "virtual", "counts", "expect", "bad_first"),
    [
        # 1-2-2-1 by the menu; first 2 leaves 3 layers over the 2 middle stages
        (6, 1, (1, 2, 2, 1), {_FIRST: 1, _LAST: 1}, 2),
        # 4-2-2-2 in two chunks per stage (`uneven.chunk_layers`); a first 3 is no 2 equal chunks
        (10, 2, (4, 2, 2, 2), {_FIRST: 4, _LAST: None, _VPP: 2}, 3),
    ],
)
def test_megatron_core_accepts_an_uneven_cut(
    tmp_path: Path, layers: int, virtual: int, counts: tuple, expect: dict, bad_first: int
) -> None:
    """An uneven first / last cut, plain and interleaved: megatron-core's own TransformerConfig
    accepts the exported counts at the plan's world and rejects a first count it cannot lay
    out."""
    pytest.importorskip("megatron.core", reason="megatron-core: pip install 'shardplan[engines]'")
    from shardplan.search.step.uneven import chunk_layers

    graph = zoo.build("gpt2-small", batch=BATCH // 8, small=True, layers=layers)
    layout = Layout(1, 4, 8, Levers(N, 1), virtual, stage_layers=chunk_layers(counts, virtual))
    tp = layout_plan(graph, BATCH, MESH, OPTS, layout, MENUS["megatron"])
    assert tp is not None
    lay = read_layout(training_json.from_json(training_json.to_json(tp)), MENUS["megatron"])
    kw = megatron.megatron_kwargs(lay, architecture("gpt2-small", True, {"layers": layers}))
    assert {k: kw.get(k) for k in expect} == expect
    ok = {"engine": "megatron", "repo": str(REPO), "kwargs": kw, "world": MESH.size}
    ok |= {"global_batch_size": BATCH, "micro_batch_size": lay.micro_batch_size}
    bad = {**ok, "kwargs": {**kw, _FIRST: bad_first}}
    good, rejected = run_checks([ok, bad], tmp_path)
    assert good["ok"], good
    assert not rejected["ok"], rejected
