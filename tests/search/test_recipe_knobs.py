"""The Megatron recipe's published knobs: the distributed optimizer (ZeRO-1) by hand, sequence
parallelism and interleaving as recorded levers, and typed errors for knobs that do not fit.

Hand graph: x [b, 16] -> fc1 (w1 [32, 16]) -> fc2 (w2 [16, 32]), fp32 + Adam (4 + 4 + 8 bytes per
element), on a 2x2 mesh of 1 byte/s links: tensor 2 on the inner axis, data 2 on the outer.
"""

import pytest

from shardplan import zoo
from shardplan.cost import CostOptions
from shardplan.cost.step import Recompute
from shardplan.errors import PlanError
from shardplan.ir import GraphBuilder
from shardplan.mesh import Mesh, parse_mesh
from shardplan.search.step.recipes import megatron_recipe

MESH = Mesh((2, 2), bandwidth_bytes_per_s=(1.0, 1.0), flops_per_s=1e6, machine="uniform")


def _two(batch: int):
    b = GraphBuilder("two")
    x = b.input("x", (batch, 16))
    h = b.apply("linear", x, b.param("w1", (32, 16)), name="fc1")
    b.apply("linear", h, b.param("w2", (16, 32)), name="fc2")
    return b.build()


def test_distributed_optimizer_is_zero1_over_the_data_parallel_group_by_hand():
    plain = megatron_recipe(_two, 4, MESH, CostOptions(), 2, 1, 1, "none")
    dist = megatron_recipe(
        _two, 4, MESH, CostOptions(), 2, 1, 1, "none", distributed_optimizer=True
    )
    assert dist.distributed_optimizer and not plain.distributed_optimizer
    assert [s.levers.zero for s in dist.stages] == [1]
    # tensor 2 halves each weight: 256 + 256 = 512 elements per device
    assert plain.step.stages[0].param_bytes == 512 * (4 + 4 + 8)  # 8192
    # ZeRO-1: Adam's 8 bytes split over the 2 data-parallel ways
    assert dist.step.stages[0].param_bytes == 512 * (4 + 4 + 8 / 2)  # 6144
    # once per step: reduce-scatter of the 2048 B gradient (1/2 x 2048) + all-gather of the
    # updated weights (1024) = the plain all-reduce's 2 x 1/2 x 2048 = 2048 s at 1 B/s
    assert dist.step.sync_s == pytest.approx(1024 + 1024)
    assert plain.step.sync_s == pytest.approx(2048)


def _gpt(b: int):
    return zoo.build("gpt3", small=True, batch=b)


def test_sequence_parallel_and_interleaving_are_recorded_and_priced():
    mesh = parse_mesh("4x2")
    opts = CostOptions.make(dtype="bf16")
    base = megatron_recipe(_gpt, 8, mesh, opts, 2, 2, 1, "selective")
    sp = megatron_recipe(_gpt, 8, mesh, opts, 2, 2, 1, "selective", sequence_parallel=True)
    assert sp.sequence_parallel and not base.sequence_parallel
    assert sp.step.memory_per_device < base.step.memory_per_device
    # the small gpt3 has 9 segments: 4 chunks over 2 stages, 2 per device
    inter = megatron_recipe(_gpt, 8, mesh, opts, 2, 2, 1, "selective", virtual_stages=2)
    assert inter.virtual_stages == 2 and inter.pipeline_stages == 2
    assert len(inter.stages) == 4
    # bubble (S - 1)/v = 1/2 slot instead of S - 1 = 1 slot
    slot_i = inter.step.bubble_s / (1 / 2)
    slot_b = base.step.bubble_s / 1
    assert inter.step.bubble_s < base.step.bubble_s
    assert slot_i == pytest.approx(inter.step.pipeline_s / (inter.micro_batches + 0.5))
    assert slot_b == pytest.approx(base.step.pipeline_s / (base.micro_batches + 1))


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"recompute": "some"}, "recompute must be one of"),
        ({"sequence_parallel": "yes"}, "sequence_parallel must be True or False"),
        ({"virtual_stages": 0}, "virtual_stages must be a positive integer"),
        ({"virtual_stages": 2, "pipeline": 1}, "needs pipeline > 1"),
        ({"context": 3}, "context=3 must divide the 2 ways left by tensor x pipeline"),
        ({"context": 2, "expert": 2}, "context and expert parallelism together"),
        ({"expert": 3}, "expert=3 must divide the 2 data-parallel ways"),
        ({"expert": 2}, "has no op whose parameter and activation share a parallel dim"),
        ({"distributed_optimizer": 1}, "distributed_optimizer must be True or False"),
        ({"tensor": 1, "sequence_parallel": True}, "needs tensor > 1"),
        ({"micro_batch_size": 3}, "not a multiple of data-parallel ways"),
    ],
)
def test_bad_knobs_are_typed_errors(knobs, message):
    args = {"tensor": 2, "pipeline": 2, **knobs}
    tensor, pipeline = args.pop("tensor"), args.pop("pipeline")
    with pytest.raises(PlanError, match=message):
        megatron_recipe(_gpt, 8, parse_mesh("4x2"), CostOptions(), tensor, pipeline, **args)


def test_unknown_knob_is_a_type_error_and_recompute_takes_strings():
    with pytest.raises(TypeError):
        megatron_recipe(_gpt, 8, parse_mesh("4x2"), CostOptions(), 2, 2, sequence=True)
    tp = megatron_recipe(_gpt, 8, parse_mesh("4x2"), CostOptions(), 2, 2, 1, "full")
    assert {s.levers.recompute for s in tp.stages} == {Recompute.FULL}


def test_knobs_round_trip_through_training_json():
    from shardplan.exporters.training_json import from_json, to_json

    tp = megatron_recipe(
        _gpt,
        8,
        parse_mesh("4x2"),
        CostOptions.make(dtype="bf16"),
        2,
        2,
        1,
        "selective",
        sequence_parallel=True,
        virtual_stages=2,
        distributed_optimizer=True,
    )
    back = from_json(to_json(tp))
    assert back.virtual_stages == 2 and back.sequence_parallel and back.distributed_optimizer
    assert back.step.step_s == tp.step.step_s
    assert back.step.memory_per_device == tp.step.memory_per_device


def _moe(b: int):
    return zoo.build("moe", batch=b, seq=16, hidden=32, heads=4, experts=4, ffn=64)


def test_expert_parallelism_in_a_training_stage_by_hand():
    # one MoE layer, 4 experts, fp32 + Adam, on 2x2: tensor 2 inside, data 2 outside; expert=2
    # splits the experts over the 2 data-parallel ways
    plain = megatron_recipe(_moe, 2, parse_mesh("2x2"), CostOptions(), 2, 1, 1, "none")
    ep = megatron_recipe(_moe, 2, parse_mesh("2x2"), CostOptions(), 2, 1, 1, "none", expert=2)
    strategies = ep.stages[0].plan.strategies
    assert strategies["moe.expert_fc"] == ("e", "n") and strategies["moe.expert_proj"] == ("e", "k")
    assert strategies["moe.dispatch"] == ("g", None)  # routing stays data-parallel
    # the dispatched tokens [e 4, g 2, c 8, m 32] fp32 = 8192 B move from split by group to split
    # by expert and back (4 all-to-alls: 2 forward, 2 for their gradients), each device sending
    # (q-1)/q of its half: 1/2 x 8192/2 = 2048 B each
    assert plain.stages[0].plan.cost.comm.all_to_all_bytes == 0.0
    assert ep.stages[0].plan.cost.comm.all_to_all_bytes == pytest.approx(4 * 2048)
    # expert weights [4, 64, 32] and [4, 32, 64]: 16384 elements, halved by tensor 2 = 8192 per
    # device at 16 B (fp32 weight + grad + Adam); expert=2 halves them again: 65536 B less
    assert plain.step.stages[0].param_bytes - ep.step.stages[0].param_bytes == 8192 * 16 / 2
    assert "expert parallel x2" in ep.notes[0]


def test_context_parallel_recipe_splits_the_sequence_and_prices_the_ring():
    opts = CostOptions.make(dtype="bf16")
    tp = megatron_recipe(_gpt, 8, parse_mesh("2x4"), opts, 2, 1, 1, "none", context=2)
    assert [s.levers.context_parallel for s in tp.stages] == [True]
    assert "context parallel x2" in tp.notes[0] and "data x2" in tp.notes[0]
    strategies = tp.stages[0].plan.strategies
    # rounds: node (2, data), gpu 2 (context: innermost outside tensor), gpu 2 (tensor)
    assert strategies["h.0.attn.scores"][1] == "m"  # queries split along the sequence
    assert strategies["h.0.ln_1.norm"][1] == "d1"  # every op splits the sequence there
    from shardplan.exporters.training_json import from_json, to_json

    back = from_json(to_json(tp))
    assert back.stages[0].levers.context_parallel
    assert back.step.step_s == tp.step.step_s
