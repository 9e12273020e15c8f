"""`shardplan plan ... --dtype bf16`: the training-step search and its printout.

With `--dtype` the plan is a TrainingPlan (search/scale.py): pipeline stages over the outermost
mesh axis, micro-batches, per-stage recomputation and ZeRO, each stage planned by D-Rec. Zoo
models are rebuilt at each micro-batch size; graphs from other sources run with one micro-batch.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from shardplan import units, zoo
from shardplan.cli.models import load_graph, model_label
from shardplan.cli.options import SIZE_FLAGS, progress_of
from shardplan.cost import CostOptions
from shardplan.errors import SolverError
from shardplan.exporters import training_json
from shardplan.ir.graph import Graph
from shardplan.ir.op import Role
from shardplan.mesh import parse_bytes, parse_mesh
from shardplan.training import TrainingPlan


def graph_batch(graph: Graph) -> int:
    """The global batch: the leading dim of the graph's first input."""
    for t in graph.tensors.values():
        if t.role is Role.INPUT and t.shape:
            return t.shape[0]
    raise SolverError(f"graph {graph.name!r} has no input to read the batch size from")


def run_training_plan(args: argparse.Namespace) -> int:
    from shardplan.cli.render import make_console, print_plan
    from shardplan.search.scale import plan_training

    if args.method != "drec" or args.train is False or args.preset != "shardplan":
        raise SolverError(
            "--dtype plans a training step with method drec and the shardplan preset; drop "
            "--method/--infer/--preset, or drop --dtype for a single SPMD plan"
        )
    if getattr(args, "zero", None) is not None:
        raise SolverError(
            "--zero sets the ZeRO stage of a single SPMD plan; --dtype plans choose it per "
            "pipeline stage under --memory: drop one of them"
        )
    if args.mesh is None:
        raise SolverError("--dtype plans need --mesh (e.g. --mesh 128x8)")
    progress = progress_of(args)
    graph = load_graph(args, progress)
    mesh = parse_mesh(args.mesh, machine=args.machine)
    opts = CostOptions.make("shardplan", True, args.optimizer, args.dtype)
    batch = graph_batch(graph)
    if args.model and not (args.torch or args.hf or args.onnx):
        overrides = {f: getattr(args, f, None) for f in SIZE_FLAGS if f != "batch"}
        small = getattr(args, "small", False)

        def build(b: int) -> Graph | None:
            return zoo.build(args.model, small=small, batch=b, **overrides)
    else:

        def build(b: int) -> Graph | None:
            return graph if b == batch else None  # imported graphs have one batch size

    progress.update(f"searching stages x micro-batches for {graph.name} on mesh {mesh.text()} ...")
    tp = plan_training(
        build,
        batch,
        mesh,
        opts,
        parse_bytes(args.memory) if args.memory else None,
        progress=progress.update,
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
        Path(args.json).write_text(json.dumps(data, indent=1))
        console.print(f"training plan written to {args.json}")
    return 0


def print_training_plan(console: Console, tp: TrainingPlan) -> None:
    """One row per stage, then the step summary; every number through `shardplan.units`, the
    stage table in under 100 columns (an op range prints first and last op on two lines)."""
    step = tp.step
    assert step is not None
    stages = "1 stage" if tp.pipeline_stages == 1 else f"{tp.pipeline_stages} stages"
    mbs = "1 micro-batch" if tp.micro_batches == 1 else f"{tp.micro_batches} micro-batches"
    table = Table(
        title=f"{tp.model} on mesh {tp.mesh.text()}: {stages}, {mbs} of "
        f"{tp.batch // tp.micro_batches}",
        caption="time per micro-batch; memory per device: weights = params+grads+optimizer, "
        "act = activations (micro-batches in flight)",
    )
    for col in ("stage", "ops", "mesh", "recompute", "ZeRO", "fwd+bwd", "weights", "act", "memory"):
        table.add_column(col, overflow="fold", no_wrap=col not in ("ops", "act"))
    for s, (stage, cost) in enumerate(zip(tp.stages, step.stages, strict=True)):
        g = stage.plan.graph
        table.add_row(
            str(s),
            f"{g.ops[0].name} ..\n{g.ops[-1].name} ({len(g.ops)})",
            stage.plan.mesh.text(),
            stage.levers.recompute.value,
            str(stage.levers.zero),
            units.seconds(cost.fwd_s + cost.bwd_s),
            units.nbytes(cost.param_bytes),
            f"{units.nbytes(cost.activation_bytes)} ({cost.in_flight})",
            units.nbytes(cost.memory_bytes),
        )
    console.print(table)
    summary = Table(title="training step (predicted)", show_header=False)
    summary.add_column("item", no_wrap=True)
    summary.add_column("value")
    for axis in tp.axes:
        summary.add_row("mesh", axis)
    sec = units.seconds
    rows = (
        ("step time", sec(step.step_s)),
        ("  pipeline (m + S - 1 slots)", sec(step.pipeline_s)),
        ("    of which bubble", f"{sec(step.bubble_s)} ({step.bubble_s / step.step_s:.1%})"),
        ("    of which p2p sends", sec(step.p2p_s)),
        ("    of which recomputation", sec(step.recompute_s)),
        ("  gradient sync (once per step)", sec(step.sync_s)),
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
    from shardplan.cli.render import warn_split

    for s, stage in enumerate(tp.stages):  # a stage that splits nothing says so on stderr
        warn_split(stage.plan, f"stage {s}: " if tp.pipeline_stages > 1 else "")


def add_dtype_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dtype",
        default=None,
        choices=("bf16", "fp16", "fp32"),
        help="plan a whole training step in this precision (bf16/fp16: mixed precision with fp32 "
        "master weights): pipeline stages, micro-batches, recomputation and ZeRO chosen to fit "
        "--memory (see docs/scale.md)",
    )


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
