"""verify_plan: plans run sharded on 8 fake XLA devices agree with the unsharded program, and the
collectives XLA inserts match the cost model's bytes or differ for a documented cause.

Numerics are checked in float64 (the default of `verify_plan`) at rtol 1e-9, atol 1e-12; the
collectives are read from the float32 program, the plan's dtype.

The default run verifies a representative subset of (zoo model, plan, forward/training step)
chosen to finish in a few minutes on two CPU cores; `SHARDPLAN_VERIFY_ALL=1` runs every zoo
model x {drec, data-parallel, megatron, drec under half its memory} x {forward, training} (136
cases; the CNN training steps take 20-120 s each to compile).
"""

from __future__ import annotations

import os

import pytest

jax = pytest.importorskip("jax")  # fixture devices8: tests/conftest.py

from shardplan import zoo  # noqa: E402
from shardplan.cost.collectives import CollectiveKind  # noqa: E402
from shardplan.errors import BackendError, InfeasibleError  # noqa: E402
from shardplan.exporters.plan_json import from_json, to_json  # noqa: E402
from shardplan.fidelity import measure as m  # noqa: E402
from shardplan.fidelity import run as r  # noqa: E402
from shardplan.fidelity import verify as v  # noqa: E402
from shardplan.fidelity.hlo import parse_collectives  # noqa: E402
from shardplan.search import plan  # noqa: E402

METHODS = ("drec", "data-parallel", "megatron", "drec-memory")
"""drec-memory: D-Rec with half the memory its unconstrained plan needs — at these small sizes
the unconstrained plan often replicates everything (communication costs more than the compute
it saves), so a budget makes D-Rec split and the verification exercise its layouts."""
FULL = os.environ.get("SHARDPLAN_VERIFY_ALL") == "1"

# (model, method, train) verified in the default run: every method in both modes, every model
# family (MLP, CNN with batch norm, encoder, decoder, ViT, MoE, recommender) at least once.
DEFAULT = (
    ("mlp", "drec", True), ("mlp", "data-parallel", True), ("mlp", "megatron", True),
    ("mlp", "megatron", False), ("sapp-mlp", "drec", True), ("wide-deep", "megatron", True),
    ("gpt2-small", "drec", True), ("gpt2-small", "data-parallel", True),
    ("gpt2-small", "megatron", True), ("gpt2-small", "megatron", False),
    ("bert-base", "megatron", False), ("vit-b16", "data-parallel", True),
    ("moe", "drec", True), ("moe", "megatron", False), ("alexnet", "drec", False),
    ("alexnet", "megatron", False), ("resnet50", "data-parallel", False),
    ("resnet50", "drec", True), ("gpt2-small", "drec-memory", True),
    ("moe", "drec-memory", True), ("resnet50", "drec-memory", False),
)  # fmt: skip
ALL = tuple((m, meth, t) for m in zoo.MODELS for meth in METHODS for t in (False, True))


# Known gaps of the explainer, found by the drec-memory plans (numerics pass in both): strict, so
# a fix shows up as an unexpected pass.
KNOWN = {
    ("wide-deep", "drec-memory", True): "144 B of all-to-all measured, none predicted; not traced",
}


def _cases():
    for case in ALL:
        if case in KNOWN and FULL:
            yield pytest.param(
                *case,
                id=f"{case[0]}-{case[1]}-{'train' if case[2] else 'fwd'}",
                marks=pytest.mark.xfail(strict=True, reason=KNOWN[case]),
            )
        elif case in DEFAULT or FULL:
            yield pytest.param(*case, id=f"{case[0]}-{case[1]}-{'train' if case[2] else 'fwd'}")
        else:
            yield pytest.param(
                *case,
                id=f"{case[0]}-{case[1]}-{'train' if case[2] else 'fwd'}",
                marks=pytest.mark.skip(
                    reason="not in the default subset; set SHARDPLAN_VERIFY_ALL=1 to run it"
                ),
            )


def _graph(name: str):
    return zoo.build(name, small=True, batch=8)


def _plan(name: str, method: str, train: bool):
    graph = _graph(name)
    if method != "drec-memory":
        return plan(graph, "8", method, train=train)
    free = plan(graph, "8", "drec", train=train)
    for share in (0.5, 0.75, 0.9):  # the tightest budget D-Rec can meet
        budget = free.cost.memory_per_device * share
        try:
            p = plan(graph, "8", "drec", train=train, memory=budget)
        except InfeasibleError:
            continue
        assert p.cost.memory_per_device <= budget
        break
    else:
        p = free  # already as lean as D-Rec gets (an MLP the free plan splits anyway)
    assert any(any(c is not None for c in s) for s in p.strategies.values())
    return p


def _assert_explained(report: v.VerifyReport) -> None:
    for k in report.kinds:
        if k.within:
            continue
        assert k.causes, f"{k.kind}: predicted {k.predicted} vs measured {k.measured}, no cause"
        assert set(k.causes) <= set(v.CAUSES), k.causes
    bad = [d for d in report.differences if not d.explained]
    assert report.explained, "unexplained differences:\n" + "\n".join(
        f"  {d.op} {d.kind}: predicted {d.predicted:.0f} measured {d.measured:.0f} "
        f"(unexplained {d.unexplained_bytes:.0f} B)"
        for d in bad
    )


@pytest.mark.parametrize(("name", "method", "train"), list(_cases()))
def test_zoo_plan_verifies(devices8, name, method, train):
    p = _plan(name, method, train)
    report = v.verify_plan(p, train=train)
    print(f"max error {report.max_error:.3g} ({report.worst_tensor})")  # shown by pytest -rP
    failures = [t for t in report.tensors if not t.ok]
    _assert_explained(report)
    assert report.dtype == "float64" and report.rtol == 1e-9 and report.atol == 1e-12
    assert report.numerics_ok, (
        f"numerics: {failures[:3]} (max error {report.max_error:.3g}) {report.numerics_note}"
    )
    assert report.tensors and report.max_error <= report.rtol
    if train:
        assert "loss" in {t.name for t in report.tensors}
        assert {f"grad {t.name}" for t in p.graph.parameters} <= {t.name for t in report.tensors}
    assert report.predicted_total == pytest.approx(
        sum(
            getattr(p.cost.comm, f)
            for f in ("all_reduce_bytes", "all_gather_bytes", "all_to_all_bytes", "halo_bytes")
        )
        if train == p.options.train
        else report.predicted_total
    )


def test_data_parallel_mlp_matches_the_model_exactly(devices8):
    """Pure data parallel: one gradient all-reduce per parameter (combined by XLA), 2(q-1)/q."""
    g = _graph("mlp")
    p = plan(g, "8", "data-parallel")
    report = v.verify_plan(p)
    ar = report.kind("all-reduce")
    assert ar.predicted == pytest.approx(2 * 7 / 8 * (g.param_bytes + 4), rel=1e-6)
    assert ar.measured == pytest.approx(ar.predicted, rel=1e-6)
    assert report.differences == ()
    assert all(k.within for k in report.kinds)


def test_fsdp_collectives_match_the_prediction(devices8):
    # the engine constrains each parameter where it is read (all-gathered from its sharded
    # home), so XLA reduces every gradient once, as predicted; unconstrained, it used to reduce
    # them in two sub-group steps (1.2x the bytes, cause "gradient-in-steps")
    p = plan(_graph("mlp"), "8", "fsdp")
    report = v.verify_plan(p)
    assert report.numerics_ok
    assert report.kind("all-reduce").within and report.kind("all-reduce").measured > 0
    assert report.kind("all-gather").within and report.kind("all-gather").measured > 0
    _assert_explained(report)


def test_inference_of_a_training_plan_is_re_predicted(devices8):
    p = plan(_graph("mlp"), "8", "data-parallel", train=True)
    report = v.verify_plan(p, train=False)
    assert report.numerics_ok and not report.train
    assert report.kind("all-reduce").predicted < 100  # only the scalar loss, no gradients
    assert {t.name for t in report.tensors} == {"output loss"}


def test_compile_only_and_plan_json_round_trip(devices8):
    p = plan(_graph("gpt2-small"), "2x4", "megatron")
    q = from_json(to_json(p))
    report = v.verify_plan(q, check_numerics=False)
    assert report.tensors == () and report.numerics_ok
    assert report.mesh == "2x4" and report.method == "megatron"
    data = report.to_dict()
    assert data["numerics"]["tensors_checked"] == 0
    assert {k["kind"] for k in data["communication"]["kinds"]} == set(CollectiveKind)
    assert set(data["causes"]) <= set(v.CAUSES)


def test_float64_numerics_keep_the_float32_bytes(devices8):
    """The numerics run in float64; the bytes are those of the float32 program either way."""
    p = plan(_graph("mlp"), "2x4", "megatron")
    f64 = v.verify_plan(p)
    f32 = v.verify_plan(p, dtype="float32")
    assert f64.numerics_ok and f64.max_error < 1e-12 and f64.dtype == "float64"
    assert f32.numerics_ok and f32.rtol == 1e-4 and "(float32)" in f32.tolerance
    assert 1e-9 < f32.max_error < 1e-4  # float32 rounding, far above float64's
    assert [(k.kind, k.measured, k.count) for k in f64.kinds] == [
        (k.kind, k.measured, k.count) for k in f32.kinds
    ]
    assert f64.to_dict()["numerics"]["dtype"] == "float64"
    with pytest.raises(BackendError, match="dtype 'float16' is not supported"):
        v.verify_plan(p, dtype="float16")


def test_too_many_devices_is_a_backend_error_naming_xla_flags():
    p = plan(zoo.build("mlp", small=True, batch=64), "64", "data-parallel")
    with pytest.raises(BackendError, match="XLA_FLAGS=--xla_force_host_platform_device_count=64"):
        v.verify_plan(p)


def test_tolerance_is_relative_to_the_largest_magnitude():
    ok = r.tensor_error("t", [1.0, 100.0 + 5e-3], [1.0, 100.0], 1e-4, 1e-6)
    assert ok.ok and ok.relative_error == pytest.approx(5e-5, rel=1e-3)
    bad = r.tensor_error("t", [1.0 + 0.02, 100.0], [1.0, 100.0], 1e-4, 1e-6)
    assert not bad.ok and bad.relative_error == pytest.approx(2e-4, rel=1e-3)
    tiny = r.tensor_error("t", [1e-9], [0.0], 1e-4, 1e-6)  # exactly-zero gradients: atol
    assert tiny.ok
    assert not r.tensor_error("t", [float("nan")], [0.0], 1e-4, 1e-6).ok


# -- the byte convention and the HLO reader -------------------------------------------------------


def test_sent_bytes_follow_the_ring_convention():
    assert m.sent_bytes("all-reduce", 800, 8) == pytest.approx(2 * 7 / 8 * 800)
    assert m.sent_bytes("all-gather", 800, 4) == pytest.approx(3 / 4 * 800)
    assert m.sent_bytes("reduce-scatter", 100, 4) == pytest.approx(300)
    assert m.sent_bytes("all-to-all", 800, 2) == pytest.approx(400)
    assert m.sent_bytes("collective-permute", 64, 6) == 64
    assert m.sent_bytes("all-reduce", 800, 1) == 0
    with pytest.raises(BackendError):
        m.sent_bytes("broadcast", 1, 2)


_HLO = "\n".join([
    "HloModule jit_step, is_scheduled=true, num_partitions=8",
    "ENTRY %main {",
    "  %ar = (f32[], f32[512,784]{1,0}) all-reduce(%a, %b), channel_id=1, "
    "replica_groups=mesh['axis_0'=8,'axis_1'=1] {'axis_0'}, to_apply=%add, "
    'metadata={op_name="jit(step)/(jvp(loss)/reduce_sum:transpose(jvp(fc0.linear))/dot_general)"}',
    '  %gte = f32[] get-tuple-element(%ar), index=0, metadata={op_name="jit(step)/jvp(loss)/'
    'reduce_sum"}',
    "  %gte.1 = f32[512,784]{1,0} get-tuple-element(%ar), index=1, "
    'metadata={op_name="jit(step)/transpose(jvp(fc0.linear))/dot_general"}',
    "  %ag = f32[8,512]{1,0} all-gather(%c), channel_id=2, replica_groups=mesh['axis_0'=2,"
    "'axis_1'=4], device_ids=([4,2]T(1,0)) {'axis_0'}, dimensions={0}, "
    'metadata={op_name="jit(step)/jvp(relu0)/max"}',
    "  %rs = f32[16]{0} reduce-scatter(%d), replica_groups=[2,4]<=[8], dimensions={0}, "
    'to_apply=%add, metadata={op_name="jit(step)/jvp(nothing)/x"}',
    "}",
])  # fmt: skip


def test_measure_splits_tuples_and_attributes_operators():
    g = _graph("mlp")
    got = m.measure(_HLO, g)
    assert [(m.kind, m.shape, m.group_size, m.op, m.backward) for m in got] == [
        ("all-reduce", "f32[]", 8, "loss", False),
        ("all-reduce", "f32[512,784]", 8, "fc0.linear", True),
        ("all-gather", "f32[8,512]", 2, "relu0", False),
        ("reduce-scatter", "f32[16]", 4, "", False),
    ]
    assert got[1].sent_bytes == pytest.approx(2 * 7 / 8 * 512 * 784 * 4)
    assert got[2].sent_bytes == pytest.approx(0.5 * 8 * 512 * 4)
    assert got[3].sent_bytes == pytest.approx(3 * 16 * 4)
    # the device_ids form of mesh replica groups (fixed in parse_collectives)
    assert parse_collectives(_HLO)[1].group_size == 2


def test_float_buffers_are_counted_at_the_plan_width():
    """A float64 program verifying a float32 plan: f64 buffers count 4 bytes an element."""
    g = _graph("mlp")
    assert m.plan_element_bytes(g, "float64") == {"f64": 4}
    assert m.plan_element_bytes(g, "float32") == {"f32": 4}
    want = [(m.kind, m.sent_bytes, m.buffer_bytes) for m in m.measure(_HLO, g)]
    hlo64 = _HLO.replace("f32[", "f64[")
    got = [(m.kind, m.sent_bytes, m.buffer_bytes) for m in m.measure(hlo64, g, {"f64": 4})]
    assert got == want
    assert m.measure(hlo64, g)[1].buffer_bytes == 2 * want[1][2]  # HLO widths otherwise


def test_every_cause_is_documented():
    doc = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "verification.md")
    if not os.path.exists(doc):
        pytest.skip("docs/verification.md is not in this checkout")
    text = open(doc, encoding="utf-8").read()
    missing = [c for c in v.CAUSES if f"`{c}`" not in text]
    assert not missing, f"causes without a section in docs/verification.md: {missing}"
