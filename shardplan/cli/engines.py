"""`plan --target X` / `plan --from-config FILE` and `shardplan export PLAN.json --to X`.

`--target`: the search within the engine's menu (search/step/menus.py), then the unrestricted search
(search/scale.py) for the note comparing the two steps. `--from-config`: the configuration's
knobs (importers/engine_config.py) built into the engine's layout and scored by the step model,
then the best layout of that engine for comparison. `export`: a training plan JSON through the
engine's exporter (exporters/torchtitan.py, megatron.py, deepspeed.py). Costs: one or two
training searches; export O(stages x expert pass).
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from shardplan import units
from shardplan.cost import CostOptions
from shardplan.cost.levers import Levers
from shardplan.cost.overlap import MEGATRON_BUCKET_FLOOR
from shardplan.errors import ArgumentError, PlanError
from shardplan.importers.engine_config import EngineConfig
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.search.step.engine_menus import Overlaps
from shardplan.search.step.menus import Layout
from shardplan.training import TrainingPlan

ENGINES = ("torchtitan", "megatron", "megatron-core", "deepspeed", "megatron-deepspeed")


def _compare(tp: TrainingPlan, other: TrainingPlan, what: str) -> str:
    assert tp.step is not None and other.step is not None
    ratio = tp.step.step_s / other.step.step_s
    return (
        f"{what}: step {units.seconds(other.step.step_s)} "
        f"({units.nbytes(other.step.memory_per_device)}/device); this plan's step is "
        f"{ratio:.3f}x of it"
    )


def engine_plan(
    args: argparse.Namespace,
    build: Callable[[int], Graph | None],
    batch: int,
    mesh: Mesh,
    opts: CostOptions,
    budget: float | None,
    say: Callable[[str], None],
    detail: Callable[[str], None] | None = None,
) -> TrainingPlan:
    """The plan of `--target` or `--from-config`, with the comparison note; `say` tells what
    runs, `detail` (default `say`) each layout a search tries."""
    detail = detail or say
    from shardplan.search.step.menus import get_menu, layout_plan, plan_for_menu
    from shardplan.search.step.search import plan_training

    if args.from_config:
        from shardplan.importers.engine_config import read_engine_config

        try:
            text = Path(args.from_config).read_text()
        except OSError as e:
            raise ArgumentError(f"--from-config {args.from_config}: {e.strerror}") from e
        cfg = read_engine_config(text)
        notes = _check_sizes(args, cfg)
        if cfg.batch is not None and cfg.batch != batch:
            say(f"the config's global batch {cfg.batch} replaces the model's {batch}")
            batch = cfg.batch
        counted = cfg.layers_per_chunk is not None or cfg.uneven
        layout = cfg.layout(mesh, batch, _layers(build, batch, counted))
        graph = build(batch // layout.micro_batches)
        if graph is None:
            raise PlanError("--from-config needs a zoo model (rebuilt at the micro-batch size)")
        say(f"scoring the {cfg.engine} config on mesh {mesh.text()} ...")
        tp = layout_plan(graph, batch, mesh, opts, _engine_layout(cfg, layout, graph, mesh, opts))
        assert tp is not None and tp.step is not None
        notes = [
            f"{cfg.engine} config {args.from_config}: {_layout_text(layout)}",
            *cfg.notes,
            *notes,
        ]
        if cfg.ignored:
            notes.append(f"flags not modelled: {' '.join(cfg.ignored)}")
        if budget is not None and tp.step.memory_per_device > budget:
            notes.append(
                f"does not fit --memory: needs {tp.step.memory_per_device / 1e9:.3g} GB/device"
            )
        say(f"searching the best {cfg.engine} layout for comparison ...")
        best = plan_for_menu(build, batch, mesh, opts, budget, get_menu(cfg.engine), detail)
        notes.append(_compare(tp, best, f"best {cfg.engine} layout ({best.notes[0]})"))
        notes += _attention_note(args, cfg.engine)
        return replace(tp, method=f"config-{cfg.engine}", notes=tuple(notes), step=tp.step)
    chosen = _overlaps(args)
    menu = get_menu(args.target).with_overlaps(chosen)
    say(f"searching {menu.engine} layouts on mesh {mesh.text()} ...")
    tp = plan_for_menu(build, batch, mesh, opts, budget, menu, detail)
    say("searching the unrestricted plan for comparison ...")
    free = plan_training(build, batch, mesh, opts, budget, detail, overlap=_free_overlap(chosen))
    compared = _compare(tp, free, "unrestricted plan")
    if tp.step is not None and free.step is not None and tp.step.step_s < free.step.step_s:
        compared += (
            f" (faster: the {menu.engine} layout is priced with what {menu.engine} overlaps, the "
            "unrestricted search with only the overlap flags given, e.g. --overlap-p2p; "
            "docs/engines.md)"
        )
    notes = (*tp.notes, compared, *_attention_note(args, menu.engine))
    return replace(tp, notes=notes, step=tp.step)


def _overlaps(args: argparse.Namespace) -> Overlaps:
    """The overlap flags given (--X: True, --no-X: False, left out: None)."""
    flags = ("overlap_grad_reduce", "overlap_p2p", "prefetch", "tp_comm_overlap")
    grad, p2p, prefetch, tp_comm = (
        v if isinstance(v := getattr(args, k, None), bool) else None for k in flags
    )
    return Overlaps(grad, p2p, prefetch, tp_comm)


def _free_overlap(chosen: Overlaps) -> Levers:
    """The unrestricted search's overlap: what the flags turn on (as `--method step` takes them)."""
    grad = bool(chosen.grad_reduce)
    return Levers(
        overlap_grad_reduce=grad,
        overlap_p2p=bool(chosen.p2p),
        prefetch=bool(chosen.prefetch),
        bucket_elements=MEGATRON_BUCKET_FLOOR if grad else 0,
        tp_comm_overlap=bool(chosen.tp_comm),
    )


def _check_sizes(args: argparse.Namespace, cfg: EngineConfig) -> list[str]:
    """The config's model sizes against the zoo model planned (PlanError when another model);
    a note when the model is imported, whose sizes are its code's."""
    from shardplan.cli.options import zoo_overrides
    from shardplan.exporters.engine_layout import architecture

    if not cfg.arch:
        return []
    model, small = getattr(args, "model", None), getattr(args, "small", False)
    sizes = architecture(model, small, zoo_overrides(args, batch=False)) if model else {}
    if not sizes:
        flags = " ".join(flag for _, flag, _ in cfg.arch)
        return [f"model-size flags not checked against an imported model: {flags}"]
    cfg.check_architecture(model, sizes)
    return []


def _layers(build: Callable[[int], Graph | None], batch: int, counted: bool) -> int | None:
    """The model's layer count when the config says its chunks or stages in layers, else None."""
    from shardplan.search.step.structure import graph_layers

    graph = build(batch) if counted else None
    return None if graph is None else graph_layers(graph).layers


def _engine_layout(
    cfg: EngineConfig, layout: Layout, graph: Graph, mesh: Mesh, opts: CostOptions
) -> Layout:
    """`layout` with what the engine overlaps: the config's own choices where it says them
    (`Menu.with_overlaps`), else the engine's defaults."""
    from shardplan.search.step.menus import get_menu, gradient_width

    data = mesh.size // (layout.tensor * layout.pipeline * layout.context)
    chosen = Overlaps(cfg.overlap_grad_reduce, cfg.overlap_p2p, cfg.prefetch)
    menu = get_menu(cfg.engine).with_overlaps(chosen)
    levers = menu.engine_levers(layout.levers, gradient_width(graph, opts), layout.virtual, data)
    return replace(layout, levers=levers)


def _attention_note(args: argparse.Namespace, engine: str) -> list[str]:
    """A zoo transformer planned with unfused attention, for an engine that runs it fused."""
    from shardplan.zoo import MODELS

    entry = MODELS.get(args.model) if args.model else None
    if entry is None or getattr(args, "attention", None) == "fused":
        return []
    if "attention" not in inspect.signature(entry.builder).parameters:
        return []
    return [
        f"attention priced unfused (five ops, scores through HBM); {engine} runs a fused kernel "
        "(FlashAttention / SDPA / cuDNN) by default: plan with --attention fused to price what "
        "it runs (docs/cost-model.md)"
    ]


def _layout_text(layout: Layout) -> str:
    lv = layout.levers
    more = [
        text
        for on, text in (
            (lv.sequence_parallel, "sequence parallel"),
            (layout.virtual > 1, f"{layout.virtual} chunks per stage"),
            (bool(layout.stage_layers), f"layers per chunk {list(layout.stage_layers)}"),
            (layout.context > 1, f"context x{layout.context}"),
            (layout.expert > 1, f"expert x{layout.expert}"),
            (lv.tp_comm_overlap, "tp_comm_overlap"),
        )
        if on
    ]
    return (
        f"tensor x{layout.tensor}, pipeline x{layout.pipeline}, {layout.micro_batches} "
        f"micro-batches, {lv.recompute.value} recomputation, ZeRO-{lv.zero}"
        + "".join(f", {m}" for m in more)
    )


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "export",
        help="write a training plan as a torchtitan, Megatron or DeepSpeed configuration",
        description="Write a training plan (`plan --dtype ... --json FILE`) as an engine's "
        "configuration: torchtitan job TOML, Megatron-LM flags, Megatron-core TransformerConfig "
        "arguments (JSON), DeepSpeed config JSON, or Megatron-DeepSpeed flags. A plan the engine "
        "cannot express is an error naming the stage, op and construct (plan with --target).",
    )
    p.add_argument("plan", metavar="PLAN.json", help="a training plan written by plan --json")
    p.add_argument("--to", required=True, choices=ENGINES, help="the engine configuration")
    p.add_argument("-o", "--output", metavar="FILE", help="write to FILE (default: stdout)")
    p.set_defaults(run=run_export)


def export_text(data: dict, engine: str) -> str:
    """The configuration text of a parsed training plan JSON for `engine`."""
    from shardplan.exporters import deepspeed, megatron, torchtitan, training_json
    from shardplan.exporters.engine_layout import architecture

    tp = training_json.from_json(data)
    cfg = data.get("model_config") or {"name": data.get("model", "")}
    arch = architecture(str(cfg.get("name", "")), bool(cfg.get("small")), cfg.get("overrides"))
    if engine == "torchtitan":
        return torchtitan.to_torchtitan(tp, arch)
    if engine == "megatron":
        return megatron.to_megatron(tp, arch)
    if engine == "megatron-core":
        kw = megatron.megatron_kwargs(megatron.megatron_layout(tp), arch)
        return json.dumps(kw, indent=2) + "\n"
    if engine == "deepspeed":
        return deepspeed.to_deepspeed(tp)
    flags = deepspeed.megatron_deepspeed_flags(deepspeed.deepspeed_layout(tp), arch)
    return megatron.flag_block(flags)


def run_export(args: argparse.Namespace) -> int:
    from shardplan.cli.inputs import output_path

    output_path(args.output, "-o")
    try:
        data = json.loads(Path(args.plan).read_text())
    except OSError as e:
        raise ArgumentError(f"{args.plan}: {e.strerror}") from e
    except json.JSONDecodeError as e:
        raise PlanError(f"{args.plan} is not JSON: {e}") from e
    text = export_text(data, args.to)
    if args.output:
        Path(args.output).write_text(text)
        print(f"{args.to} configuration written to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
