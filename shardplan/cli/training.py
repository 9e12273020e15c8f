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

from shardplan import zoo
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
    overrides: dict[str, object] = {}
    small = False
    if args.model and not (args.torch or args.hf or args.onnx):
        overrides = {f: getattr(args, f, None) for f in SIZE_FLAGS if f != "batch"}
        overrides = {k: v for k, v in overrides.items() if v is not None}
        small = getattr(args, "small", False)

        def build(b: int) -> Graph | None:
            return zoo.build(args.model, small=small, batch=b, **overrides)
    else:

        def build(b: int) -> Graph | None:
            return graph if b == batch else None  # imported graphs have one batch size

    budget = parse_bytes(args.memory) if args.memory else None
    if args.from_config or args.target:
        from shardplan.cli.engines import engine_plan

        tp = engine_plan(args, build, batch, mesh, opts, budget, progress.note)
    else:
        progress.note(
            f"searching stages x micro-batches for {graph.name} on mesh {mesh.text()} ..."
        )
        tp = plan_training(build, batch, mesh, opts, budget, progress=progress.note)
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
            data["model_config"] = {"name": args.model, "small": small, "overrides": overrides}
        Path(args.json).write_text(json.dumps(data, indent=1))
        console.print(f"training plan written to {args.json}")
    return 0


def _b(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000:
            return f"{n:.3g} {unit}"
        n /= 1000
    return f"{n:.3g} PB"


def print_training_plan(console: Console, tp: TrainingPlan) -> None:
    """One section per stage, then the step summary."""
    step = tp.step
    assert step is not None
    table = Table(
        title=f"{tp.model} on mesh {tp.mesh.text()}: {tp.pipeline_stages} stage(s), "
        f"{tp.micro_batches} micro-batch(es) of {tp.batch // tp.micro_batches}"
    )
    for col in (
        "stage",
        "ops",
        "stage mesh",
        "recompute",
        "ZeRO",
        "fwd+bwd / micro-batch",
        "params+grads+optimizer",
        "activations (in flight)",
        "memory",
    ):
        table.add_column(col, overflow="fold")
    for s, (stage, cost) in enumerate(zip(tp.stages, step.stages, strict=True)):
        g = stage.plan.graph
        table.add_row(
            str(s),
            f"{g.ops[0].name} .. {g.ops[-1].name} ({len(g.ops)})",
            stage.plan.mesh.text(),
            stage.levers.recompute.value,
            str(stage.levers.zero),
            f"{(cost.fwd_s + cost.bwd_s) * 1e3:.4g} ms",
            _b(cost.param_bytes),
            f"{_b(cost.activation_bytes)} ({cost.in_flight})",
            _b(cost.memory_bytes),
        )
    console.print(table)
    summary = Table(title="training step (predicted)", show_header=False)
    summary.add_column("item")
    summary.add_column("value")
    for axis in tp.axes:
        summary.add_row("mesh", axis)
    rows = (
        ("step time", f"{step.step_s:.4g} s"),
        ("  pipeline (m + S - 1 slots)", f"{step.pipeline_s:.4g} s"),
        ("    of which bubble", f"{step.bubble_s:.4g} s ({step.bubble_s / step.step_s:.1%})"),
        ("    of which p2p sends", f"{step.p2p_s:.4g} s"),
        ("    of which recomputation", f"{step.recompute_s:.4g} s"),
        ("  gradient sync (once per step)", f"{step.sync_s:.4g} s"),
        ("throughput", f"{step.samples_per_s:.4g} samples/s, {step.tokens_per_s:.4g} tokens/s"),
        (
            "model TFLOP/s per device",
            f"{step.tflops_per_device:.4g} ({step.peak_fraction:.1%} of peak)",
        ),
        ("  with recomputation", f"{step.hardware_tflops_per_device:.4g}"),
        ("memory per device (max)", _b(step.memory_per_device)),
        ("search time", f"{tp.search_seconds:.3g} s"),
    )
    for item, value in rows:
        summary.add_row(item, value)
    for note in tp.notes:
        summary.add_row("note", note)
    console.print(summary)


def add_dtype_argument(p: argparse.ArgumentParser) -> None:
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
        f"  loss {report.loss:.12g} vs single process {report.reference_loss:.12g}\n"
        f"  {report.grads_checked} gradients; worst {report.worst_grad} at "
        f"{report.worst_grad_ratio:.3g} x tolerance; failed: {list(report.failed) or 'none'}\n"
        f"  {report.seconds:.1f} s",
        highlight=False,
    )
    if args.json:
        from dataclasses import asdict

        Path(args.json).write_text(json.dumps(asdict(report), indent=1))
        console.print(f"report written to {args.json}")
    return 0 if report.ok else 1
