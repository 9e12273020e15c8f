"""The memory driver picks the lowest ZeRO stage that fits, and `zero=N` forces one.

The graph: x [192, 48] -> fc1 (w1 [12, 48]) -> fc2 (w2 [48, 12]), fp32, Adam, on 4 devices (two
rounds of q = 2 on one 1 byte/s link; 1 FLOP/s, so compute dwarfs communication and D-Rec plans
data parallel). By hand, per device:
  parameters 1152 elements: stage 0 16 B each = 18,432 B; stage 1 4 + 4 + 8/4 = 10 B = 11,520;
  stage 2 4 + 4/4 + 8/4 = 7 B = 8,064; stage 3 16/4 = 4 B = 4,608;
  activations (x, fc1, fc2 outputs, batch split 4 ways): (2304 + 576 + 2304) * 4 B = 20,736;
  memory: stage 0 39,168, stage 1 32,256, stage 2 28,800, stage 3 25,344.
  compute: 2 * 192 * 48 * 12 = 221,184 FLOPs per linear, / 4 devices, x 3 for training = 331,776 s;
  gradient all-reduce 2 * 3/4 * 4608 B = 6912 s (stages 0-2); stage 3 adds one gather, 3456 s.
The memory penalty's plans all need more (the model-parallel cuts replicate the activations), so
the search falls through to ZeRO.
"""

import pytest

from shardplan.errors import InfeasibleError, PlanError
from shardplan.ir import GraphBuilder
from shardplan.mesh import Mesh
from shardplan.search import plan

COMPUTE = 331_776.0
ALL_REDUCE = 6912.0


def _mlp():
    b = GraphBuilder("mlp")
    x = b.input("x", (192, 48))
    h = b.apply("linear", x, b.param("w1", (12, 48)), name="fc1")
    b.apply("linear", h, b.param("w2", (48, 12)), name="fc2")
    mesh = Mesh((4,), bandwidth_bytes_per_s=(1.0,), flops_per_s=1.0, machine="uniform")
    return b.build(), mesh


def test_without_memory_pressure_the_plan_is_stage_0_data_parallel():
    g, mesh = _mlp()
    p = plan(g, mesh, memory=39_168)
    assert p.zero == 0 and not p.notes
    assert set(p.strategies.values()) == {("m", "m")}
    assert p.cost.memory_per_device == 39_168
    assert p.cost.total == pytest.approx(COMPUTE + ALL_REDUCE)


@pytest.mark.parametrize(
    ("budget", "zero", "memory", "extra"),
    [
        (32_256, 1, 32_256, 0.0),  # stage 1 suffices
        (30_000, 2, 28_800, 0.0),  # stage 1 needs 32,256: stage 2
        (26_000, 3, 25_344, 3456.0),  # stage 2 needs 28,800: stage 3, one more all-gather
    ],
)
def test_the_lowest_stage_that_fits_is_chosen(budget, zero, memory, extra):
    g, mesh = _mlp()
    p = plan(g, mesh, memory=budget)
    assert p.zero == zero
    assert p.cost.memory_per_device == memory
    assert p.cost.total == pytest.approx(COMPUTE + ALL_REDUCE + extra)
    assert f"ZeRO stage {zero} on the unpenalised D-Rec plan makes it fit" in p.notes[-1]
    if zero > 1:
        assert "stage 1 needs 32.3 KB" in p.notes[-1]


def test_below_stage_3_it_is_infeasible_saying_by_how_much():
    g, mesh = _mlp()
    with pytest.raises(InfeasibleError, match=r"needs 25.3 KB even at ZeRO stage 3 \(over by 344"):
        plan(g, mesh, memory=25_000)


def test_a_forced_stage_reprices_the_plan_of_any_method():
    g, mesh = _mlp()
    free = plan(g, mesh)
    forced = plan(g, mesh, zero=2)
    assert forced.zero == 2 and dict(forced.strategies) == dict(free.strategies)
    assert forced.cost.memory_per_device == 28_800
    dp = plan(g, mesh, "data-parallel", zero=3)
    assert dp.zero == 3 and dp.cost.param_memory == 4608
    with pytest.raises(InfeasibleError, match="a ZeRO stage \\(--zero\\)"):
        plan(g, mesh, "data-parallel", zero=1, memory=30_000)


def test_a_forced_stage_limits_the_fallback_to_that_stage():
    g, mesh = _mlp()
    assert plan(g, mesh, memory=32_256, zero=2).zero == 2
    with pytest.raises(InfeasibleError, match="even at ZeRO stage 1"):
        plan(g, mesh, memory=30_000, zero=1)


def test_bad_zero_arguments_are_plan_errors():
    g, mesh = _mlp()
    with pytest.raises(PlanError, match="ZeRO stage must be 0, 1, 2 or 3, got 4"):
        plan(g, mesh, zero=4)
    with pytest.raises(PlanError, match="inference does not have"):
        plan(g, mesh, train=False, zero=2)
    with pytest.raises(PlanError, match="'shardplan' cost preset only"):
        plan(g, mesh, preset="mindspore", zero=1)


def test_a_cheaper_zero_stage_beats_a_penalised_plan_that_fits():
    from shardplan import zoo
    from shardplan.plans import with_zero

    # batch 16: at batch 8 the penalised plan (6.552 ms) undercuts ZeRO-1 (6.557 ms) once each
    # op's backward is priced by its own work, and then it rightly wins
    g = zoo.build("gpt2-small", batch=16, seq=256)
    free = plan(g, "8")
    p = plan(g, "8", memory=free.cost.memory_per_device * 0.9)
    assert p.zero == 1 and dict(p.strategies) == dict(free.strategies)
    assert p.cost.total == with_zero(free, 1).cost.total
    assert "memory penalty lambda=4^0*cost/budget made it fit" in p.notes
    value, unit = p.notes[-1].rsplit("the penalised stage-0 plan that fits costs ", 1)[1].split()
    penalised = float(value) * {"s": 1.0, "ms": 1e-3, "µs": 1e-6}[unit]  # 3 digits (units.py)
    assert p.cost.total < penalised * (1 - 0.005)  # cheaper by more than the rounding


def test_inference_and_the_symbolic_preset_fall_back_to_stored_shards():
    g, mesh = _mlp()
    # inference: weights 1152 * 4 B = 4608, plus the largest working set (fc2: h 576 + y 2304
    # elements of 4 B) = 16,128; stage 3 stores 4608 / 4 = 1152 B of weights: 12,672
    free = plan(g, mesh, train=False)
    assert free.cost.memory_per_device == 16_128
    p = plan(g, mesh, train=False, memory=13_000)
    assert p.zero == 3 and p.cost.memory_per_device == 12_672
    # the symbolic preset has no ZeRO prices: stage 3's storage as parameter layouts (the
    # former fallback, unchanged: 27,648 B and cost 10,512 elements before this change too)
    q = plan(g, mesh, preset="mindspore", memory=30_000)
    assert q.zero == 0 and dict(q.param_layouts) == {"w1": (1, 1), "w2": (0, 0)}
    assert q.cost.memory_per_device == 27_648
    assert "ZeRO stages are priced in the 'shardplan' preset only" in q.notes[-1]
