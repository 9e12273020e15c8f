"""`--target X` with the user's overlap flags: priced as the engine will run them, refused where
its configuration has no switch, exported and read back (search/step/engine_menus.py
`Menu.with_overlaps`, exporters/engine_layout.py `_check_overlaps`)."""

from __future__ import annotations

import json

import pytest

from shardplan import zoo
from shardplan.cli.main import main
from shardplan.cost import CostOptions
from shardplan.cost.step import Levers, Recompute
from shardplan.errors import ArgumentError, PlanError
from shardplan.exporters.deepspeed import deepspeed_config, deepspeed_layout
from shardplan.exporters.engine_layout import read_layout
from shardplan.exporters.megatron import to_megatron
from shardplan.importers.engine_config import read_engine_config
from shardplan.mesh import parse_mesh
from shardplan.search.step.engine_menus import MENUS, Overlaps
from shardplan.search.step.menus import Layout, gradient_width, layout_plan, plan_for_menu

PLAN = ["plan", "gpt2-small", "--small", "--layers", "4", "--batch", "32", "--mesh", "4x4"]
PLAN += ["--dtype", "bf16", "-q"]
OPTS = CostOptions.make("shardplan", True, "adam", "bf16")


def test_a_users_overlaps_apply_where_the_engines_configuration_can_say_them():
    """Megatron-LM switches --overlap-grad-reduce at every ZeRO stage, DeepSpeed's overlap_comm
    only at stages 1-3 (its stage-0 engine all-reduces after the backward); torchtitan always
    overlaps, so asking for it changes nothing."""
    on = Overlaps(grad_reduce=True)
    assert MENUS["megatron"].with_overlaps(on).overlap_grad_reduce == (0, 1, 2, 3)
    assert MENUS["deepspeed"].with_overlaps(on).overlap_grad_reduce == (1, 2, 3)
    assert MENUS["torchtitan"].with_overlaps(on) == MENUS["torchtitan"]
    off = MENUS["deepspeed"].with_overlaps(Overlaps(grad_reduce=False))
    assert off.overlap_grad_reduce == ()  # overlap_comm false at stage 3 too
    assert MENUS["megatron"].with_overlaps(Overlaps(p2p=False)).overlap_p2p is False
    assert MENUS["megatron"].with_overlaps(Overlaps()) == MENUS["megatron"]


@pytest.mark.parametrize(
    ("engine", "chosen", "said"),
    [
        ("torchtitan", Overlaps(grad_reduce=False), "--no-overlap-grad-reduce: torchtitan always"),
        ("torchtitan", Overlaps(p2p=True), "--overlap-p2p: torchtitan never"),
        ("deepspeed", Overlaps(p2p=True), "--overlap-p2p: deepspeed never"),
        ("deepspeed", Overlaps(tp_comm=True), "--tp-comm-overlap: deepspeed never"),
        ("megatron", Overlaps(prefetch=True), "add --overlap-grad-reduce"),
    ],
)
def test_an_overlap_the_engine_cannot_say_is_an_argument_error(engine, chosen, said):
    with pytest.raises(ArgumentError, match=said):
        MENUS[engine].with_overlaps(chosen)


def test_target_with_overlaps_is_never_slower_and_says_what_it_hid():
    """Each layout's levers gain the overlaps (they only hide communication), so the best
    layout's step cannot grow; the plan's levers and note carry them."""
    build = lambda b: zoo.build("gpt3", small=True, batch=b)  # noqa: E731
    mesh = parse_mesh("4x2")
    menu = MENUS["megatron"]
    plain = plan_for_menu(build, 16, mesh, OPTS, 80e9, menu)
    chosen = menu.with_overlaps(Overlaps(grad_reduce=True, tp_comm=True))
    hid = plan_for_menu(build, 16, mesh, OPTS, 80e9, chosen)
    assert plain.step is not None and hid.step is not None
    assert hid.step.step_s <= plain.step.step_s * (1 + 1e-12)
    assert all(stage.levers.overlap_grad_reduce for stage in hid.stages)
    assert "overlapped: gradient sync" in hid.notes[0]
    assert "overlapped: nothing" in plain.notes[0] or "pipeline sends" in plain.notes[0]


def test_megatron_fsdp_prefetch_exports_and_reads_back(tmp_path, capsys):
    """ZeRO-3 with --overlap-grad-reduce and --prefetch (Megatron-FSDP's --overlap-param-gather):
    the export says both and --from-config scores the step exported; the gather without the
    gradient-sync overlap is refused as Megatron-LM refuses it."""
    graph = zoo.build("gpt2-small", small=True, layers=4, batch=32 // 4)
    mesh = parse_mesh("4x4")
    menu = MENUS["megatron"].with_overlaps(Overlaps(grad_reduce=True, prefetch=True))
    steps = {}
    for m in (menu, MENUS["megatron"]):
        levers = m.engine_levers(Levers(Recompute.FULL, 3), gradient_width(graph, OPTS), 1, 8)
        tp = layout_plan(graph, 32, mesh, OPTS, Layout(2, 1, 4, levers))
        assert tp is not None and tp.step is not None
        steps[m is menu] = tp.step.step_s
        flags = to_megatron(tp)
        assert ("--overlap-param-gather" in flags) is (m is menu)
        assert ("--overlap-grad-reduce" in flags) is (m is menu)
        path = tmp_path / "flags.sh"
        path.write_text(flags)
        out = tmp_path / "scored.json"
        assert main([*PLAN, "--from-config", str(path), "--json", str(out)]) == 0
        capsys.readouterr()
        scored = json.loads(out.read_text())["step"]["step_s"]
        assert abs(scored - tp.step.step_s) <= 1e-9 * tp.step.step_s
    assert steps[True] < steps[False]  # ZeRO-3's gathers and the gradient sync hidden
    with pytest.raises(ArgumentError, match="add --overlap-grad-reduce"):
        read_engine_config("--use-megatron-fsdp --overlap-param-gather --bf16\n")
    zero1 = "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --bf16\n"
    assert read_engine_config(zero1).ignored == ("--overlap-param-gather",)  # not modelled there


def test_deepspeed_no_prefetch_exports_a_zero_bucket_and_reads_back(tmp_path, capsys):
    """DeepSpeed prefetches at ZeRO-3 unless stage3_prefetch_bucket_size is 0 (its coordinator
    prefetches only while the bucket is > 0): --no-prefetch is priced with the gathers exposed,
    exported as that 0, and --from-config scores the step exported; a positive bucket keeps the
    default and below stage 3 the field is noted as unused."""
    graph = zoo.build("gpt2-small", small=True, layers=4, batch=32 // 2)  # 2 micro-batches
    mesh = parse_mesh("4x4")
    off = MENUS["deepspeed"].with_overlaps(Overlaps(prefetch=False))
    assert off.prefetch == () and MENUS["deepspeed"].prefetch == (3,)
    steps = {}
    for m in (off, MENUS["deepspeed"]):
        levers = m.engine_levers(Levers(Recompute.FULL, 3), gradient_width(graph, OPTS), 1, 16)
        assert levers.prefetch is (m is not off)
        tp = layout_plan(graph, 32, mesh, OPTS, Layout(1, 1, 2, levers))
        assert tp is not None and tp.step is not None
        steps[m is off] = tp.step.step_s
        cfg = deepspeed_config(deepspeed_layout(tp))
        bucket = cfg["zero_optimization"].get("stage3_prefetch_bucket_size")
        assert bucket == (0 if m is off else None)
        path = tmp_path / "ds.json"
        path.write_text(json.dumps(cfg))
        out = tmp_path / "scored.json"
        assert main([*PLAN, "--from-config", str(path), "--json", str(out)]) == 0
        capsys.readouterr()
        scored = json.loads(out.read_text())["step"]["step_s"]
        assert abs(scored - tp.step.step_s) <= 1e-9 * tp.step.step_s
    assert steps[True] > steps[False]  # the gathers exposed
    on = {"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": 5e7}}
    assert read_engine_config(json.dumps(on)).prefetch is None
    low = {"zero_optimization": {"stage": 1, "stage3_prefetch_bucket_size": 0}}
    assert any("unused at stage 1" in n for n in read_engine_config(json.dumps(low)).notes)
    bad = {"zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": -1}}
    with pytest.raises(ArgumentError, match="stage3_prefetch_bucket_size = -1"):
        read_engine_config(json.dumps(bad))


def test_a_plan_priced_with_an_overlap_the_engine_does_not_run_is_not_exported():
    """Sends overlapped on a plain 1F1B pipeline (Megatron-LM overlaps only interleaved sends,
    torchtitan none): the run would be slower than the plan says."""
    graph = zoo.build("gpt2-small", small=True, layers=4, batch=32 // 4)
    layout = Layout(1, 2, 4, Levers(overlap_p2p=True))
    tp = layout_plan(graph, 32, parse_mesh("4x4"), OPTS, layout)
    assert tp is not None
    for engine in ("megatron", "torchtitan", "deepspeed"):
        with pytest.raises(PlanError, match="pipeline sends under compute"):
            read_layout(tp, MENUS[engine])


def test_cli_target_takes_overlap_flags_and_from_config_refuses_them(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main([*PLAN, "--target", "megatron", "--overlap-grad-reduce", "--json", str(plan)]) == 0
    capsys.readouterr()
    data = json.loads(plan.read_text())
    assert "overlapped: gradient sync" in data["notes"][0]
    assert all(stage["overlap_grad_reduce"] for stage in data["stages"])
    assert main(["export", str(plan), "--to", "megatron"]) == 0
    assert "--overlap-grad-reduce" in capsys.readouterr().out
    assert main([*PLAN, "--target", "torchtitan", "--overlap-p2p"]) == 2
    assert "torchtitan never overlaps pipeline sends" in capsys.readouterr().err
    flags = tmp_path / "flags.sh"
    flags.write_text("--tensor-model-parallel-size 2 --bf16\n")
    assert main([*PLAN, "--from-config", str(flags), "--overlap-grad-reduce"]) == 9
    assert "--from-config prices what the config overlaps" in capsys.readouterr().err
