"""Who overlaps what, as data: the Megatron recipe at Megatron-LM's defaults, the step search's
knobs (off by default), each engine menu's defaults, and typed errors for bad values.

Hand graph: x [b, 16] -> fc1 (w1 [32, 16]) -> fc2 (w2 [16, 32]) on a 2x2 mesh of 1 byte/s links
at 1 FLOP/s, fp32: tensor 2 on the inner axis, data 2 on the outer (as test_recipe_knobs).
"""

import pytest

import shardplan as sp
from shardplan import zoo
from shardplan.cost import CostOptions
from shardplan.cost.levers import Levers
from shardplan.cost.overlap import DDP_BUCKET_BYTES, megatron_bucket
from shardplan.cost.step import Recompute
from shardplan.errors import PlanError, ShardplanError
from shardplan.ir import GraphBuilder
from shardplan.mesh import Mesh, parse_mesh
from shardplan.search.step.engine_menus import Overlaps
from shardplan.search.step.menus import MENUS
from shardplan.search.step.recipes import megatron_recipe

MESH = Mesh((2, 2), bandwidth_bytes_per_s=(1.0, 1.0), flops_per_s=1.0, machine="uniform")


def _two(batch: int):
    b = GraphBuilder("two")
    h = b.apply("linear", b.input("x", (batch, 16)), b.param("w1", (32, 16)), name="fc1")
    b.apply("linear", h, b.param("w2", (16, 32)), name="fc2")
    return b.build()


def _gpt(b: int):
    return zoo.build("gpt3", small=True, batch=b)


def test_megatron_bucket_is_megatron_cores_default():
    # max(40000000, 1000000 x dp) parameters (megatron/core/distributed/distributed_data_parallel)
    assert megatron_bucket(8) == 40_000_000 and megatron_bucket(64) == 64_000_000


def test_recipe_overlaps_the_gradient_sync_only_when_asked():
    plain = megatron_recipe(_two, 4, MESH, CostOptions(), 2, 1, 1, "none")
    on = megatron_recipe(_two, 4, MESH, CostOptions(), 2, 1, 1, "none", overlap_grad_reduce=True)
    assert not plain.stages[0].levers.overlap_grad_reduce  # Megatron-LM's default: off
    lv = on.stages[0].levers
    assert lv.overlap_grad_reduce and lv.bucket_elements == 40_000_000
    # 512 gradient elements per device fit one 4e7-parameter bucket: nothing starts before the
    # backward ends, so the all-reduce (2 x 1/2 x 2048 B = 2048 s) stays whole
    assert on.step.sync_s == plain.step.sync_s == pytest.approx(2048)
    assert "gradient reduce overlapped" in on.notes[0]


def test_recipe_overlaps_p2p_on_the_interleaved_schedule_as_megatron_lm_does():
    mesh, opts = parse_mesh("4x2"), CostOptions.make(dtype="bf16")
    flat = megatron_recipe(_gpt, 8, mesh, opts, 2, 2, 1, "selective")
    inter = megatron_recipe(_gpt, 8, mesh, opts, 2, 2, 1, "selective", virtual_stages=2)
    off = megatron_recipe(
        _gpt, 8, mesh, opts, 2, 2, 1, "selective", virtual_stages=2, overlap_p2p=False
    )
    assert {s.levers.overlap_p2p for s in flat.stages} == {False}  # plain 1F1B never overlaps
    assert {s.levers.overlap_p2p for s in inter.stages} == {True}
    assert {s.levers.overlap_p2p for s in off.stages} == {False}
    assert off.step.p2p_hidden_s == 0 and inter.step.p2p_hidden_s > 0
    # what the sends no longer add is what is reported hidden, slot by slot
    assert inter.step.p2p_s + inter.step.p2p_hidden_s == pytest.approx(off.step.p2p_s)
    assert off.step.pipeline_s - inter.step.pipeline_s == pytest.approx(inter.step.p2p_hidden_s)


@pytest.mark.parametrize("knob", ["overlap_grad_reduce", "overlap_p2p"])
def test_bad_overlap_knobs_are_typed_errors(knob):
    with pytest.raises(PlanError, match=f"{knob} must be True or False"):
        megatron_recipe(_gpt, 8, parse_mesh("4x2"), CostOptions(), 2, 2, **{knob: "yes"})


def test_levers_check_their_overlap_fields():
    with pytest.raises(PlanError, match="prefetch must be True or False"):
        Levers(prefetch=1)
    with pytest.raises(PlanError, match="bucket_elements must be a whole number"):
        Levers(bucket_elements=-1)


def test_engine_menus_overlap_what_their_engine_does_by_default():
    tt, mg, ds = MENUS["torchtitan"], MENUS["megatron"], MENUS["deepspeed"]
    # torchtitan: DDP's 25 MiB buckets (bf16 gradients: 2 bytes an element), FSDP2 per unit
    ddp = tt.engine_levers(Levers(Recompute.FULL, 0), 2)
    assert (ddp.overlap_grad_reduce, ddp.bucket_elements, ddp.prefetch) == (
        True,
        DDP_BUCKET_BYTES // 2,
        False,
    )
    fsdp = tt.engine_levers(Levers(Recompute.FULL, 3), 2)
    assert (fsdp.overlap_grad_reduce, fsdp.prefetch, fsdp.bucket_elements) == (True, True, 0)
    assert not tt.engine_levers(Levers(), 2, virtual=2).overlap_p2p
    # Megatron-LM: nothing by default but the interleaved schedule's p2p
    assert not mg.engine_levers(Levers(zero=1), 2).overlaps
    assert mg.engine_levers(Levers(), 2, virtual=2).overlap_p2p
    # DeepSpeed: overlap_comm and prefetch at stage 3 only
    assert not ds.engine_levers(Levers(zero=1), 2).overlaps
    z3 = ds.engine_levers(Levers(zero=3), 2)
    assert z3.overlap_grad_reduce and z3.prefetch and not z3.overlap_p2p


def test_step_search_overlaps_nothing_unless_asked():
    plain = sp.plan(_gpt, "2x2", method="step", batch=8, dtype="bf16", memory="1GB")
    assert not any(s.levers.overlaps for s in plain.stages)
    on = sp.plan(
        _gpt,
        "2x2",
        method="step",
        batch=8,
        dtype="bf16",
        memory="1GB",
        overlap_grad_reduce=True,
        prefetch=True,
    )
    lv = on.stages[0].levers
    assert lv.overlap_grad_reduce and lv.prefetch and not lv.overlap_p2p
    assert on.step.step_s <= plain.step.step_s * (1 + 1e-9)  # hiding never costs time
    with pytest.raises(ShardplanError, match="prefetch must be True or False"):
        sp.plan(_gpt, "2x2", method="step", batch=8, dtype="bf16", prefetch="on")


def test_a_configurations_own_overlap_choice_and_its_engines_bucket():
    from shardplan.importers.engine_config import read_engine_config

    mg = read_engine_config("--tensor-model-parallel-size 2 --overlap-grad-reduce --bf16")
    assert mg.overlap_grad_reduce is True and "--overlap-grad-reduce" not in mg.ignored
    assert read_engine_config("--tensor-model-parallel-size 2").overlap_grad_reduce is None
    on = Overlaps(grad_reduce=True)  # the configuration's own choice
    lv = MENUS["megatron"].with_overlaps(on).engine_levers(Levers(), 2, data=64)
    assert (lv.overlap_grad_reduce, lv.bucket_elements) == (True, 64_000_000)  # 1e6 x dp
    ds = read_engine_config(
        '{"train_batch_size": 8, "zero_optimization": {"stage": 1, "overlap_comm": true}}'
    )
    assert ds.overlap_grad_reduce is True
    lv = MENUS["deepspeed"].with_overlaps(on).engine_levers(Levers(zero=1), 2)
    assert lv.bucket_elements == 500_000_000  # DeepSpeed's reduce_bucket_size
    # its stage-0 engine all-reduces after the backward: overlap_comm there is said, not run
    assert not MENUS["deepspeed"].with_overlaps(on).engine_levers(Levers(zero=0), 2).overlaps
    ds0 = read_engine_config(
        '{"train_batch_size": 8, "zero_optimization": {"stage": 0, "overlap_comm": true}}'
    )
    assert any("overlap_comm at stage 0" in note for note in ds0.notes)
    with pytest.raises(ShardplanError, match="overlap_comm"):
        read_engine_config('{"train_batch_size": 8, "zero_optimization": {"overlap_comm": 1}}')


def test_overlap_levers_round_trip_through_training_json():
    from shardplan.exporters.training_json import from_json, to_dict, to_json

    tp = megatron_recipe(
        _gpt,
        8,
        parse_mesh("4x2"),
        CostOptions.make(dtype="bf16"),
        2,
        2,
        1,
        "full",
        virtual_stages=2,
        overlap_grad_reduce=True,
    )
    stage = to_dict(tp)["stages"][0]
    assert (stage["overlap_grad_reduce"], stage["overlap_p2p"], stage["prefetch"]) == (
        True,
        True,
        False,
    )
    back = from_json(to_json(tp))
    assert [s.levers for s in back.stages] == [s.levers for s in tp.stages]
    assert back.step.step_s == tp.step.step_s and back.step.p2p_hidden_s == tp.step.p2p_hidden_s
    data = to_dict(tp)
    for st in data["stages"]:  # a file written before the overlap levers: read as all off
        for key in ("overlap_grad_reduce", "overlap_p2p", "prefetch", "bucket_elements"):
            del st[key]
    old = from_json(data)
    assert not any(s.levers.overlaps for s in old.stages) and old.step.hidden_s == 0


def test_recipe_overlaps_tensor_parallel_collectives_only_with_sequence_parallelism():
    base = dict(batch=8, dtype="bf16", tensor=2, pipeline=1, recompute="none")
    sp_on = sp.plan(_gpt, "2x2", "megatron-recipe", sequence_parallel=True, **base)
    tpo = sp.plan(
        _gpt, "2x2", "megatron-recipe", sequence_parallel=True, tp_comm_overlap=True, **base
    )
    assert all(s.levers.tp_comm_overlap for s in tpo.stages)
    assert not any(s.levers.tp_comm_overlap for s in sp_on.stages)
    assert tpo.step.step_s < sp_on.step.step_s  # the all-gathers run under their GEMMs
    assert "tensor-parallel collectives overlapped with GEMMs" in tpo.notes[0]
    with pytest.raises(PlanError, match="tp_comm_overlap.*sequence_parallel=True"):
        sp.plan(_gpt, "2x2", "megatron-recipe", tp_comm_overlap=True, **base)


def test_step_search_overlaps_tensor_parallel_collectives_on_sequence_parallel_stages():
    kw = dict(method="step", batch=8, dtype="bf16", memory="1GB")
    plain = sp.plan(_gpt, "2x4", **kw)
    on = sp.plan(_gpt, "2x4", tp_comm_overlap=True, **kw)
    assert not any(s.levers.tp_comm_overlap for s in plain.stages)
    assert any(s.levers.sequence_parallel for s in on.stages)
    for s in on.stages:  # the lever rides sequence parallelism only
        assert s.levers.tp_comm_overlap == s.levers.sequence_parallel
    assert on.step.step_s <= plain.step.step_s * (1 + 1e-9)
    assert any("overlapped with their GEMMs (tp_comm_overlap" in n for n in on.notes)
    assert not any("tp_comm_overlap" in n for n in plain.notes)
    with pytest.raises(ShardplanError, match="tp_comm_overlap must be True or False"):
        sp.plan(_gpt, "2x4", tp_comm_overlap=1, **kw)
