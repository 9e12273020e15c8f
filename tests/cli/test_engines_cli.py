"""`plan --target`, `plan --from-config` and `shardplan export --to` on the command line."""

import json
import tomllib

from shardplan.cli.main import main

PLAN = ["plan", "gpt2-small", "--small", "--layers", "4", "--batch", "32", "--mesh", "4x4"]
PLAN += ["--dtype", "bf16", "-q"]


def test_target_plan_exports_to_each_engine(tmp_path, capsys):
    for engine in ("megatron", "deepspeed", "torchtitan"):
        plan = tmp_path / f"{engine}.json"
        assert main([*PLAN, "--target", engine, "--json", str(plan)]) == 0
        out = capsys.readouterr().out
        assert f"{engine} layout: tensor x" in out
        assert "unrestricted plan: step" in out  # the step against the unrestricted search's
        data = json.loads(plan.read_text())
        assert data["method"] == f"target-{engine}"
        assert data["model_config"] == {
            "name": "gpt2-small",
            "small": True,
            "overrides": {"layers": 4},
        }
        conf = tmp_path / f"{engine}.conf"
        assert main(["export", str(plan), "--to", engine, "-o", str(conf)]) == 0
        text = conf.read_text()
        if engine == "megatron":
            assert "--global-batch-size 32" in text and "--num-layers 4" in text
        elif engine == "deepspeed":
            assert json.loads(text)["train_batch_size"] == 32
        else:
            assert tomllib.loads(text)["training"]["global_batch_size"] == 32


def test_export_to_stdout_and_megatron_core_kwargs(tmp_path, capsys):
    plan = tmp_path / "p.json"
    assert main([*PLAN, "--target", "megatron", "--json", str(plan)]) == 0
    capsys.readouterr()
    assert main(["export", str(plan), "--to", "megatron-core"]) == 0
    kw = json.loads(capsys.readouterr().out)
    assert kw["num_layers"] == 4 and kw["hidden_size"] == 64 and kw["num_attention_heads"] == 4
    assert main(["export", str(plan), "--to", "megatron-deepspeed"]) == 0
    assert "--deepspeed_config ds_config.json" in capsys.readouterr().out


def test_exporting_an_unrestricted_plan_names_the_construct(tmp_path, capsys):
    plan = tmp_path / "free.json"
    assert main([*PLAN, "--json", str(plan)]) == 0
    capsys.readouterr()
    assert main(["export", str(plan), "--to", "megatron"]) == 5
    err = capsys.readouterr().err
    assert "PlanError: megatron cannot express stage" in err and "--target megatron" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_from_config_scores_a_megatron_flag_file(tmp_path, capsys):
    flags = tmp_path / "flags.sh"
    flags.write_text(
        "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 \\\n"
        "--micro-batch-size 1 --global-batch-size 32 --recompute-granularity full --bf16 \\\n"
        "--lr 1e-4\n"
    )
    plan = tmp_path / "scored.json"
    assert main([*PLAN, "--from-config", str(flags), "--json", str(plan)]) == 0
    out = capsys.readouterr().out
    assert "tensor x2, pipeline x2, 8 micro-batches, full" in out
    assert "flags not modelled: --lr" in out and "best megatron layout" in out
    data = json.loads(plan.read_text())
    assert data["method"] == "config-megatron" and data["micro_batches"] == 8


def test_target_needs_dtype_and_a_known_engine(tmp_path, capsys):
    args = ["plan", "gpt2-small", "--small", "--mesh", "2x2"]
    assert main([*args, "--target", "megatron"]) == 9
    assert "add --dtype bf16" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "missing.json"), "--to", "megatron"]) == 2
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["export", str(bad), "--to", "deepspeed"]) == 5
    assert "not a shardplan training plan" in capsys.readouterr().err


def test_target_notes_unfused_attention_and_exports_a_fused_plan(tmp_path, capsys):
    # a zoo transformer planned unfused for an engine that runs fused attention gets the note;
    # planned with --attention fused it does not, and the option travels with the plan file
    assert main([*PLAN, "--target", "torchtitan"]) == 0
    assert "--attention fused" in capsys.readouterr().out
    plan = tmp_path / "fused.json"
    assert main([*PLAN, "--target", "torchtitan", "--attention", "fused", "--json", str(plan)]) == 0
    assert "priced unfused" not in capsys.readouterr().out
    overrides = json.loads(plan.read_text())["model_config"]["overrides"]
    assert overrides == {"layers": 4, "attention": "fused"}
    assert main(["export", str(plan), "--to", "torchtitan", "-o", str(tmp_path / "t.toml")]) == 0


def _recipe(**knobs):
    import shardplan as sp
    from shardplan import zoo

    def build(b):
        return zoo.build("gpt2-small", small=True, layers=4, batch=b)

    return sp.plan(build, "4x4", "megatron-recipe", batch=32, dtype="bf16", **knobs)


def _scored(path, text, capsys):
    """The training JSON of `plan --from-config` on a file holding `text`."""
    path.write_text(text)
    plan = path.with_suffix(".scored.json")
    assert main([*PLAN, "--from-config", str(path), "--json", str(plan)]) == 0
    capsys.readouterr()
    return json.loads(plan.read_text())


def test_from_config_scores_the_levers_an_export_says_as_the_recipe_does(tmp_path, capsys):
    """Sequence parallelism, interleaving, context parallelism and tp_comm_overlap survive the
    round trip export -> --from-config: the config scores the step of the plan exported."""
    from shardplan.exporters.megatron import to_megatron

    cases = [
        dict(virtual_stages=2, sequence_parallel=True, tp_comm_overlap=True),
        dict(virtual_stages=2, context=2, recompute="selective"),
    ]
    for knobs in cases:
        tp = _recipe(tensor=2, pipeline=2, micro_batch_size=1, **knobs)
        data = _scored(tmp_path / "flags.sh", to_megatron(tp), capsys)
        assert "2 chunks per stage" in data["notes"][0] and data["virtual_stages"] == 2
        # every flag the export wrote is read: the levers, and the sizes checked against the model
        assert not any(n.startswith("flags not modelled") for n in data["notes"]), data["notes"]
        assert abs(data["step"]["step_s"] - tp.step.step_s) <= 1e-9 * tp.step.step_s, knobs


def test_from_config_refuses_what_the_engine_refuses(tmp_path, capsys):
    flags = tmp_path / "flags.sh"
    flags.write_text("--tensor-model-parallel-size 2 --tp-comm-overlap --bf16\n")
    assert main([*PLAN, "--from-config", str(flags)]) != 0
    assert "add --sequence-parallel" in capsys.readouterr().err
    titan = tmp_path / "titan.toml"
    titan.write_text(
        "[parallelism]\ntensor_parallel_degree = 2\nenable_async_tensor_parallel = true\n"
    )
    assert main([*PLAN, "--from-config", str(titan)]) != 0
    assert "[compile]" in capsys.readouterr().err
    for text, says in [
        ("--num-layers 8", "says --num-layers 8, but gpt2-small has layers 4"),
        ("--num-virtual-stages-per-pipeline-rank 2", "need pipeline > 1"),
        ("--pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 3", "4 layers"),
    ]:
        flags.write_text(text + " --bf16\n")
        assert main([*PLAN, "--from-config", str(flags)]) == 5
        assert says in capsys.readouterr().err


def test_torchtitan_config_scores_its_sequence_parallel_interleaved_layout(tmp_path, capsys):
    """torchtitan's tensor parallelism always shards the norms over the sequence, and its
    Interleaved1F1B parts say the chunks: the TOML of such a layout scores that layout."""
    from shardplan import zoo
    from shardplan.cost import CostOptions
    from shardplan.cost.step import Levers
    from shardplan.exporters.torchtitan import to_torchtitan
    from shardplan.mesh import parse_mesh
    from shardplan.search.step.menus import MENUS, Layout, layout_plan

    opts = CostOptions.make("shardplan", True, "adam", "bf16")
    graph = zoo.build("gpt2-small", small=True, layers=4, batch=32 // 8)
    layout = Layout(2, 2, 8, Levers(), virtual=2)
    tp = layout_plan(graph, 32, parse_mesh("4x4"), opts, layout, MENUS["torchtitan"])
    assert tp is not None and tp.step is not None and tp.stages[0].levers.sequence_parallel
    data = _scored(tmp_path / "job.toml", to_torchtitan(tp), capsys)
    assert "sequence parallel, 2 chunks per stage" in data["notes"][0]
    assert abs(data["step"]["step_s"] - tp.step.step_s) <= 1e-9 * tp.step.step_s


def test_from_config_reads_uneven_stages_back(tmp_path, capsys):
    """Megatron-LM's --decoder-first/last-pipeline-num-layers and torchtitan's module lists per
    part survive the round trip export -> --from-config: the config scores the uneven layout."""
    from shardplan import zoo
    from shardplan.cost import CostOptions
    from shardplan.cost.step import Levers
    from shardplan.exporters.megatron import to_megatron
    from shardplan.exporters.torchtitan import to_torchtitan
    from shardplan.mesh import parse_mesh
    from shardplan.search.step.menus import MENUS, Layout, layout_plan

    opts = CostOptions.make("shardplan", True, "adam", "bf16")
    graph = zoo.build("gpt2-small", small=True, layers=6, batch=32 // 8)
    layout = Layout(1, 4, 8, Levers(), stage_layers=(2, 1, 1, 2))
    plan = [*PLAN[:4], "6", *PLAN[5:]]
    for engine, export, name in [
        ("megatron", to_megatron, "flags.sh"),
        ("torchtitan", to_torchtitan, "job.toml"),
    ]:
        tp = layout_plan(graph, 32, parse_mesh("4x4"), opts, layout, MENUS[engine])
        assert tp is not None and tp.step is not None
        path = tmp_path / name
        path.write_text(export(tp))
        out = path.with_suffix(".json")
        assert main([*plan, "--from-config", str(path), "--json", str(out)]) == 0, engine
        capsys.readouterr()
        data = json.loads(out.read_text())
        assert "layers per chunk [2, 1, 1, 2]" in data["notes"][0], data["notes"]
        assert abs(data["step"]["step_s"] - tp.step.step_s) <= 1e-9 * tp.step.step_s, engine


def test_from_config_refuses_first_last_counts_that_do_not_add_up(tmp_path, capsys):
    flags = tmp_path / "flags.sh"
    plan = [*PLAN[:4], "6", *PLAN[5:]]
    for text, says in [
        ("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 2", "other 3 pipe"),
        ("--decoder-first-pipeline-num-layers 2", "need pipeline stages"),
        (
            "--pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 2 "
            "--decoder-last-pipeline-num-layers 2",
            "other 2 of the model's 6 layers",
        ),
    ]:
        flags.write_text(text + " --bf16\n")
        assert main([*plan, "--from-config", str(flags)]) == 5, text
        assert says in capsys.readouterr().err, text


def test_megatron_fsdp_zero3_round_trips_and_is_searched(tmp_path, capsys):
    """Megatron-LM says ZeRO-2 / 3 as Megatron-FSDP (--use-megatron-fsdp with its sharding
    strategy), without pipeline stages: its menu has them, the export writes them and
    --from-config reads them back to the step exported."""
    from shardplan import zoo
    from shardplan.cost import CostOptions
    from shardplan.cost.step import Levers, Recompute
    from shardplan.exporters.megatron import to_megatron
    from shardplan.mesh import parse_mesh
    from shardplan.search.step.menus import MENUS, Layout, layout_plan

    menu = MENUS["megatron"]
    assert {lv.zero for lv in menu.levers(1)} == {0, 1, 2, 3}
    assert {lv.zero for lv in menu.levers(2)} == {0, 1}
    opts = CostOptions.make("shardplan", True, "adam", "bf16")
    graph = zoo.build("gpt2-small", small=True, layers=4, batch=32 // 4)
    for zero, strategy in [(2, "optim_grads"), (3, "optim_grads_params")]:
        layout = Layout(2, 1, 4, Levers(Recompute.FULL, zero))
        tp = layout_plan(graph, 32, parse_mesh("4x4"), opts, layout)
        assert tp is not None and tp.step is not None
        flags = to_megatron(tp)
        assert f"--data-parallel-sharding-strategy {strategy}" in flags
        assert "--use-megatron-fsdp" in flags
        data = _scored(tmp_path / "flags.sh", flags, capsys)
        assert f"ZeRO-{zero}" in data["notes"][0]
        assert not any(n.startswith("flags not modelled") for n in data["notes"]), data["notes"]
        assert abs(data["step"]["step_s"] - tp.step.step_s) <= 1e-9 * tp.step.step_s, zero
    flags = tmp_path / "bad.sh"
    flags.write_text("--data-parallel-sharding-strategy optim_grads --bf16\n")
    assert main([*PLAN, "--from-config", str(flags)]) == 2
    assert "with --use-megatron-fsdp" in capsys.readouterr().err


def test_torchtitan_parts_of_another_model_are_refused(tmp_path, capsys):
    """Equal parts whose layers do not add up to the model's: the config trains another model
    (never scored as the model's own even cut)."""
    parts = [[f"layers.{2 * s}", f"layers.{2 * s + 1}"] for s in range(4)]  # 8 layers
    titan = tmp_path / "job.toml"
    titan.write_text(
        "[parallelism]\npipeline_parallel_degree = 4\n"
        f"module_fqns_per_model_part = {json.dumps(parts)}\n"
    )
    plan = [*PLAN[:4], "12", *PLAN[5:]]
    assert main([*plan, "--from-config", str(titan)]) == 5
    assert "hold 8 layers" in capsys.readouterr().err
