"""`shardplan plan ... --dtype bf16` / `--method step|megatron-recipe`: the training step.

The plan is a TrainingPlan from the same front door as every plan (`shardplan.plan`, a
`Problem` through the solver registry): method "step" (the search: pipeline stages over the
outermost mesh axis, micro-batches, per-stage recomputation and ZeRO, D-Rec stage plans) or
"megatron-recipe" (the hand recipe with `--tensor`, `--pipeline`, ... as its typed options).
Zoo models and --hf models are rebuilt at each micro-batch size; graphs from other sources
(--torch, --onnx) run with one micro-batch. Flags that only mean something for one SPMD plan
(`--force`, `--plot`, `--top`, `--zero`) are refused in one line rather than ignored.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from shardplan import units, zoo
from shardplan.cli.models import hf_rebuilder, load_graph, model_label
from shardplan.cli.options import progress_of, zoo_overrides
from shardplan.errors import SolverError
from shardplan.exporters import training_json
from shardplan.ir.graph import Graph
from shardplan.problem import graph_batch
from shardplan.training import TrainingPlan

TRAINING_METHODS = ("step", "megatron-recipe")
RECIPE_FLAGS = (
    "tensor",
    "pipeline",
    "micro_batch_size",
    "recompute",
    "sequence_parallel",
    "virtual_stages",
    "context",
    "distributed_optimizer",
    "expert",
)
OVERLAP_FLAGS = ("overlap_grad_reduce", "overlap_p2p", "prefetch", "tp_comm_overlap")
"""Overlap knobs (on / off; None: the method's default): the step search takes all four, the
Megatron recipe all but prefetch (its ZeRO is the distributed optimizer, nothing to prefetch);
tp_comm_overlap applies to the stages that run sequence parallelism."""


def wants_training_plan(args: argparse.Namespace) -> bool:
    """`--dtype` or a training-step method asks for a TrainingPlan."""
    return bool(getattr(args, "dtype", None)) or args.method in TRAINING_METHODS


def _refuse_spmd_flags(args: argparse.Namespace) -> None:
    """One line for each flag a training plan cannot honour (never silently ignored)."""
    if args.method not in (*TRAINING_METHODS, "drec"):
        raise SolverError(
            f"--dtype plans a training step (--method step or megatron-recipe), not "
            f"--method {args.method}; drop --dtype for a single SPMD plan"
        )
    refused = [
        (getattr(args, "force", None), "--force pins one op of a single SPMD plan"),
        (getattr(args, "plot", None), "--plot draws a single SPMD plan"),
        (getattr(args, "top", 0), "--top lists one SPMD plan's costliest ops (use --ops all)"),
        (
            getattr(args, "zero", None) is not None,
            "--zero sets the ZeRO stage of a single SPMD plan (training plans choose it per "
            "pipeline stage under --memory)",
        ),
        (args.train is False, "--infer: a training step has a backward pass"),
        (args.preset != "shardplan", "--preset: the step model prices the shardplan preset"),
    ]
    for given_, why in refused:
        if given_:
            raise SolverError(f"{why}; it does not apply to a training plan: drop it")
    if args.method != "megatron-recipe":
        knobs = [f"--{k.replace('_', '-')}" for k in RECIPE_FLAGS if _knob(args, k) is not None]
        if knobs:
            raise SolverError(
                f"{', '.join(knobs)} set the Megatron recipe's knobs: add --method "
                "megatron-recipe (the step search chooses them itself)"
            )
    overlap = [f"--{k.replace('_', '-')}" for k in OVERLAP_FLAGS if _overlap(args, k) is not None]
    if overlap and args.from_config:
        raise SolverError(
            f"{', '.join(overlap)}: --from-config prices what the config overlaps (its own "
            "flags, else the engine's defaults; docs/engines.md); drop the flag"
        )
    if args.method == "megatron-recipe" and _overlap(args, "prefetch") is not None:
        raise SolverError(
            "--prefetch overlaps ZeRO-3's gathers; the Megatron recipe's ZeRO is the distributed "
            "optimizer (ZeRO-1), which gathers nothing per micro-batch: drop it"
        )


def _knob(args: argparse.Namespace, name: str) -> Any:
    value = getattr(args, name, None)
    return None if value is False else value


def _overlap(args: argparse.Namespace, name: str) -> bool | None:
    """An overlap flag as given (--X: True, --no-X: False), None when left out."""
    value = getattr(args, name, None)
    return value if isinstance(value, bool) else None


def builder_of(args: argparse.Namespace, graph: Graph, batch: int) -> Any:
    """The model at each batch: zoo and --hf models are rebuilt (an --hf config re-imported on
    the meta device); other graphs exist at one batch."""
    if args.model and not (args.torch or args.hf or args.onnx):
        overrides = zoo_overrides(args, batch=False)
        small = getattr(args, "small", False)
        return lambda b: zoo.build(args.model, small=small, batch=b, **overrides)
    if args.hf:
        rebuild = hf_rebuilder(args)
        return lambda b: graph if b == batch else rebuild(b)
    return graph


def run_training_plan(args: argparse.Namespace) -> int:
    from shardplan.cli.render import make_console, print_plan
    from shardplan.search import plan

    _refuse_spmd_flags(args)
    if args.mesh is None:
        raise SolverError("a training plan needs --mesh (e.g. --mesh 128x8)")
    method = args.method if args.method in TRAINING_METHODS else "step"
    progress = progress_of(args)
    graph = load_graph(args, progress)
    batch = graph_batch(graph)
    options: dict[str, Any] = {}
    if method == "step":
        options["progress"] = progress.update
        progress.update(f"searching stages x micro-batches for {graph.name} on {args.mesh} ...")
    else:
        options = {k: _knob(args, k) for k in RECIPE_FLAGS if _knob(args, k) is not None}
    options.update((k, _overlap(args, k)) for k in OVERLAP_FLAGS if _overlap(args, k) is not None)
    if args.from_config or args.target:
        tp = _engine_plan(args, graph, batch, progress.note, progress.update)
    else:
        tp = plan(
            builder_of(args, graph, batch),
            args.mesh,
            method,
            memory=args.memory,
            optimizer=args.optimizer,
            machine=args.machine,
            dtype=args.dtype,
            batch=batch,
            **options,
        )
    console = make_console()
    print_training_plan(console, tp)
    if args.ops == "all":
        for s, stage in enumerate(tp.stages):
            console.print(f"[bold]stage {s}[/] operators")
            print_plan(console, stage.plan, "heavy")
    if args.json:
        data = training_json.to_dict(tp)
        data["model"] = model_label(args)
        if args.model and not (args.torch or args.hf or args.onnx):
            overrides = zoo_overrides(args, batch=False)
            data["model_config"] = {  # the exporters' model sizes (exporters/engine_layout)
                "name": args.model,
                "small": bool(getattr(args, "small", False)),
                "overrides": {k: v for k, v in overrides.items() if v is not None},
            }
        Path(args.json).write_text(json.dumps(data, indent=1))
        console.print(f"training plan written to {args.json}")
    return 0


def _engine_plan(
    args: argparse.Namespace, graph: Graph, batch: int, say: Any, detail: Any
) -> TrainingPlan:
    """`--target` / `--from-config` (cli/engines.py) on the Problem of these arguments."""
    from shardplan.cli.engines import engine_plan
    from shardplan.problem import Problem

    if args.method not in ("drec", "step"):
        raise SolverError(
            f"--target and --from-config choose the layout: drop --method {args.method}"
        )
    problem = Problem.make(
        builder_of(args, graph, batch),
        args.mesh,
        memory=args.memory,
        optimizer=args.optimizer,
        machine=args.machine,
        dtype=args.dtype,
        batch=batch,
    )
    build = problem.build

    def rebuild(b: int) -> Graph | None:  # imported graphs exist at one batch only
        return problem.graph if b == batch else build(b) if build is not None else None

    mesh, opts, budget = problem.mesh, problem.options, problem.budget
    return engine_plan(args, rebuild, batch, mesh, opts, budget, say, detail)


def reprint_training_plan(args: argparse.Namespace) -> bool:
    """`shardplan plan train.json`: print a saved training plan (True), or False when the
    argument is not one. Re-planning flags are refused (re-plan from the model instead)."""
    from shardplan.cli.models import is_plan_file
    from shardplan.cli.render import make_console

    if not is_plan_file(args.model) or args.torch or args.hf or args.onnx:
        return False
    path = Path(args.model)
    try:
        data = json.loads(path.read_text()) if path.is_file() else None
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return False  # the plan reader reports what is wrong with the file
    if not training_json.is_training_json(data):
        return False
    if getattr(args, "force", None) or getattr(args, "plot", None):
        raise SolverError(
            f"{args.model} is a training plan: --force and --plot work on one SPMD plan; plan "
            "the model again with --dtype to change it"
        )
    tp = training_json.from_json(data)
    if args.mesh is not None and tp.mesh.text() != args.mesh.strip():
        raise SolverError(f"{args.model} is a plan for mesh {tp.mesh.text()}, not {args.mesh}")
    print_training_plan(make_console(), tp)
    return True


def print_training_plan(console: Console, tp: TrainingPlan) -> None:
    """One row per stage, then the step summary; every number through `shardplan.units`, the
    stage table in under 100 columns (an op range prints first and last op on two lines)."""
    step = tp.step
    assert step is not None
    stages = "1 stage" if tp.pipeline_stages == 1 else f"{tp.pipeline_stages} stages"
    if tp.virtual_stages > 1:
        stages += f" (interleaved 1F1B, {tp.virtual_stages} chunks per device)"
    mbs = "1 micro-batch" if tp.micro_batches == 1 else f"{tp.micro_batches} micro-batches"
    table = Table(
        title=f"{tp.model} on mesh {tp.mesh.text()}: {stages}, {mbs} of "
        f"{tp.batch // tp.micro_batches}",
        caption="time per micro-batch; memory per device: weights = params+grads+optimizer, "
        "act = activations (micro-batches in flight)",
    )
    for col in ("stage", "ops", "mesh", "recompute", "ZeRO", "fwd+bwd", "weights", "act", "memory"):
        table.add_column(col, overflow="fold", no_wrap=col not in ("ops", "act"))
    n, v = tp.pipeline_stages, tp.virtual_stages
    for s, cost in enumerate(step.stages):  # interleaved: device group s holds chunks s, s + S, ..
        chunks = tp.stages[s::n]
        first, last = chunks[0].plan.graph.ops[0], chunks[-1].plan.graph.ops[-1]
        count = sum(len(c.plan.graph.ops) for c in chunks)
        held = f", {v} chunks" if v > 1 else ""
        levers = sorted({(c.levers.recompute.value, c.levers.zero) for c in chunks})
        table.add_row(
            str(s),
            f"{first.name} ..\n{last.name} ({count}{held})",
            chunks[0].plan.mesh.text(),
            "/".join(r for r, _ in levers),
            "/".join(str(z) for _, z in levers),
            units.seconds(cost.fwd_s + cost.bwd_s),
            units.nbytes(cost.param_bytes),
            f"{units.nbytes(cost.activation_bytes)} ({cost.in_flight:.3g})",  # interleaved: a mean
            units.nbytes(cost.memory_bytes),
        )
    console.print(table)
    summary = Table(title="training step (predicted)", show_header=False)
    summary.add_column("item", no_wrap=True)
    summary.add_column("value")
    from shardplan.cli.render import machine_line

    summary.add_row("machine", machine_line(tp.mesh))
    for axis in tp.axes:
        summary.add_row("mesh", axis)
    sec = units.seconds
    rows = (
        ("step time", sec(step.step_s)),
        (f"  pipeline ({'m + S - 1' if v == 1 else 'm + (S - 1)/v'} slots)", sec(step.pipeline_s)),
        ("    of which bubble", f"{sec(step.bubble_s)} ({step.bubble_s / step.step_s:.1%})"),
        ("    of which p2p sends", sec(step.p2p_s)),
        *_hidden(step.p2p_hidden_s, "      p2p hidden under compute (not counted)"),
        ("    of which recomputation", sec(step.recompute_s)),
        *_hidden(step.zero_hidden_s, "    ZeRO collectives hidden under compute (not counted)"),
        ("  gradient sync (once per step)", sec(step.sync_s)),
        *_hidden(step.sync_hidden_s, "    hidden under the backward (not counted)"),
        ("  optimizer step (once per step)", sec(step.optimizer_s)),
        (
            "throughput",
            f"{units.rate(step.samples_per_s, 'samples')}, "
            f"{units.rate(step.tokens_per_s, 'tokens')}",
        ),
        (
            "model FLOP/s per device",
            f"{units.flop_rate(step.tflops_per_device * 1e12)} ({step.peak_fraction:.1%} of peak)",
        ),
        ("  with recomputation", units.flop_rate(step.hardware_tflops_per_device * 1e12)),
        ("memory per device (max)", units.nbytes(step.memory_per_device)),
        ("search time", sec(tp.search_seconds)),
    )
    for item, value in rows:
        summary.add_row(item, value)
    for note in tp.notes:
        summary.add_row("note", note)
    console.print(summary)
    _warn_stages(tp)


def _warn_stages(tp: TrainingPlan) -> None:
    """A stage (a chunk, interleaved) that splits nothing says so on stderr; one whose ZeRO
    lever, chosen under the budget, splits the state of whole weights is not told to shard."""
    from shardplan.cli.render import warn_split

    unit = "chunk" if tp.virtual_stages > 1 else "stage"
    for s, stage in enumerate(tp.stages):
        prefix = f"{unit} {s}: " if len(tp.stages) > 1 else ""
        warn_split(stage.plan, prefix, state_sharded=stage.levers.zero > 0)


def _hidden(seconds: float, label: str) -> list[tuple[str, str]]:
    """A row for what the engine's overlap hid of a term (cost/overlap.py), when it hid any."""
    return [(label, units.seconds(seconds))] if seconds > 0 else []


def add_dtype_argument(p: argparse.ArgumentParser) -> None:
    """--dtype and the Megatron recipe's knobs (`--method megatron-recipe`)."""
    p.add_argument(
        "--dtype",
        default=None,
        choices=("bf16", "fp16", "fp32"),
        help="plan a whole training step in this precision (bf16/fp16: mixed precision with fp32 "
        "master weights): pipeline stages, micro-batches, recomputation and ZeRO chosen to fit "
        "--memory (see docs/scale.md)",
    )
    p.add_argument(
        "--target",
        default=None,
        choices=("torchtitan", "megatron", "deepspeed"),
        help="with --dtype: search only the layouts this engine can run (one tensor x pipeline x "
        "data layout, even layers per stage, the engine's recomputation and ZeRO), compared "
        "with the unrestricted plan; export it with `shardplan export` (docs/engines.md)",
    )
    p.add_argument(
        "--from-config",
        default=None,
        metavar="FILE",
        help="with --dtype: score an engine configuration (torchtitan TOML, DeepSpeed JSON or "
        "Megatron flags) with the step model and compare it with the best plan of that engine",
    )
    g = p.add_argument_group("Megatron recipe knobs (--method megatron-recipe)")
    for flag, kind, what in (
        ("tensor", int, "tensor-parallel ways (default: the innermost mesh axis)"),
        ("pipeline", int, "pipeline stages over the outermost axis (default 1)"),
        ("micro-batch-size", int, "samples per micro-batch (default 1)"),
        ("virtual-stages", int, "model chunks per device (interleaved 1F1B)"),
        ("context", int, "context-parallel ways (attention split along the sequence)"),
        ("expert", int, "expert-parallel ways (MoE)"),
    ):
        g.add_argument(f"--{flag}", type=kind, default=None, metavar="N", help=what)
    g.add_argument(
        "--recompute",
        choices=("full", "selective", "none"),
        default=None,
        help="activation recomputation (default full)",
    )
    g.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism")
    g.add_argument(
        "--distributed-optimizer",
        action="store_true",
        help="optimizer state split over the data-parallel group (ZeRO-1)",
    )
    o = p.add_argument_group(
        "Overlap of data-parallel, pipeline and tensor-parallel collectives (--method step or "
        "megatron-recipe, or --target X where X's configuration can say it: docs/engines.md)"
    )
    for flag, what in (
        (
            "overlap-grad-reduce",
            "the gradient all-reduce / reduce-scatter bucket by bucket under the backward "
            "(Megatron-LM --overlap-grad-reduce; default off)",
        ),
        (
            "overlap-p2p",
            "pipeline sends under the chunks' compute (Megatron-LM's default for the interleaved "
            "schedule: on with --method megatron-recipe, off for the search)",
        ),
        (
            "prefetch",
            "ZeRO-3: gather the next unit's parameters under this one's compute (FSDP / "
            "DeepSpeed prefetch, Megatron-LM --overlap-param-gather; --method step or --target; "
            "default off for the search)",
        ),
        (
            "tp-comm-overlap",
            "sequence parallelism's all-gathers / reduce-scatters piece by piece under their "
            "GEMMs, on the stages that run it (Megatron-LM --tp-comm-overlap, torchtitan async "
            "TP; not DeepSpeed; the recipe needs --sequence-parallel; default off)",
        ),
    ):
        o.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction, default=None, help=what)


def verify_training_plan(args: argparse.Namespace) -> int:
    """`shardplan verify train.json --engine torch`: run the pipeline (engines/torch_pipeline)
    on S x stage-devices gloo processes; loss and every gradient against one process."""
    from shardplan.cli.commands import make_console
    from shardplan.engines.torch_pipeline import run_pipeline

    if args.engine != "torch":
        raise SolverError(
            f"{args.model} is a training plan (pipeline stages); verify it with --engine torch"
        )
    tp = training_json.from_json(Path(args.model).read_text())
    report = run_pipeline(tp, seed=args.seed, dtype=args.check_dtype)
    console = make_console()
    verdict = "[bold green]OK[/]" if report.ok else "[bold red]FAIL[/]"
    console.print(
        f"{tp.model}: {report.stages} stages x {report.world_size // report.stages} devices, "
        f"{report.micro_batches} micro-batches (1F1B, gloo): {verdict}\n"
        f"  loss {units.number(report.loss)} vs single process "
        f"{units.number(report.reference_loss)} (difference "
        f"{units.number(abs(report.loss - report.reference_loss))})\n"
        f"  {report.grads_checked} gradients; worst {report.worst_grad} at "
        f"{units.number(report.worst_grad_ratio)} x tolerance; failed: "
        f"{list(report.failed) or 'none'}\n  {units.seconds(report.seconds)}",
        highlight=False,
    )
    if args.json:
        from dataclasses import asdict

        Path(args.json).write_text(json.dumps(asdict(report), indent=1))
        console.print(f"report written to {args.json}")
    return 0 if report.ok else 1
