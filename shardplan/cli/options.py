"""The CLI's flags, declared once: parent parsers every sub-command composes, and what they mean.

`source_flags()` (a zoo name, --hf, --torch, --onnx, size flags), `search_flags()` (mesh, method,
machine, memory, preset, --force), `output_flags()` (--json, --quiet) and `plot_flag()`; then
`plan_from_args` turns parsed flags into a Plan, showing progress on stderr (rich; silent with
--quiet or when stderr is not a terminal). `--force OP=STRATEGY` is parsed here against the graph:
OP is an op name or a module prefix naming one heavy op; STRATEGY is one loop dim (or readable
cut name: batch, column, row, heads, ...) per round, comma-separated, '-' for none, or a single
one for every round.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape

from shardplan import units
from shardplan.checks import did_you_mean
from shardplan.errors import PlanError, ShardplanError
from shardplan.hardware import DEFAULT_MACHINE, MACHINES
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.search import METHODS
from shardplan.sharding import Strategy
from shardplan.zoo.layers import ATTENTION

SIZE_FLAGS = (
    "batch",
    "seq",
    "image",
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "ffn",
    "vocab",
    "experts",
    "top_k",
    "width",
)


def zoo_overrides(args: argparse.Namespace, batch: bool = True) -> dict[str, Any]:
    """The zoo overrides given on the command line: the size flags (without --batch when
    `batch` is False) and --attention, a builder choice; None where a flag was not given."""
    out = {f: getattr(args, f, None) for f in SIZE_FLAGS if batch or f != "batch"}
    out["attention"] = getattr(args, "attention", None)
    return out


def source_flags() -> argparse.ArgumentParser:
    """Where the model comes from: a zoo name or one of --hf, --torch, --onnx; size flags."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument(
        "model",
        nargs="?",
        help="zoo model name (see `shardplan models`); omit with --torch/--hf/--onnx",
    )
    source = p.add_argument_group("other model sources")
    source.add_argument(
        "--torch",
        metavar="MODULE:FUNCTION",
        help="a Python function returning an nn.Module, or (module, example_args)",
    )
    source.add_argument(
        "--args",
        metavar="SHAPES",
        help="example inputs for --torch, e.g. '8x128:long' or '8x3x224x224' "
        "(comma-separated; dtypes float (default), long, int, bool)",
    )
    source.add_argument(
        "--hf",
        metavar="NAME|PATH",
        help="a Hugging Face architecture built offline with random weights: a supported name "
        "(bert-base-uncased, gpt2, ...; docs/importers.md), or a local folder or config.json",
    )
    source.add_argument("--onnx", metavar="FILE", help="an ONNX model file")
    source.add_argument(
        "--unknown",
        choices=("error", "replicate"),
        default="error",
        help="ops outside the import tables: fail (default) or keep replicated",
    )
    group = p.add_argument_group(
        "model size (zoo models; --hf takes batch/seq/image/layers/hidden/heads)"
    )
    for flag in SIZE_FLAGS:
        dashed = flag.replace("_", "-")
        group.add_argument(f"--{dashed}", type=int, default=None, help=f"override {dashed}")
    group.add_argument(
        "--small", action="store_true", help="start from the reduced sizes used in tests"
    )
    group.add_argument(
        "--attention",
        choices=ATTENTION,
        default=None,
        help="zoo transformers' attention: unfused, five ops (the default, as Megatron-LM ran it "
        "in 2021-22), or fused, one op (FlashAttention; docs/cost-model.md)",
    )
    return p


def search_flags(mesh_required: bool = True, method: bool = True) -> argparse.ArgumentParser:
    """How to plan: mesh, method, machine, memory budget, cost preset, forced strategies."""
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("planning")
    g.add_argument(
        "--mesh",
        required=mesh_required,
        default=None,
        help="device mesh, e.g. 8, 2x8, 4x8 (outermost, slowest axis first)",
    )
    if method:
        g.add_argument("--method", default="drec", choices=METHODS, help="search method (drec)")
    g.add_argument(
        "--machine",
        default=DEFAULT_MACHINE,
        type=machine_arg,
        metavar="NAME|FILE.json",
        help=f"the devices: a preset ({', '.join(sorted(MACHINES))}; default "
        f"{DEFAULT_MACHINE}) or a JSON file describing your machine (docs/machines.md)",
    )
    g.add_argument(
        "--memory", default=None, help="per-device budget, e.g. 80GB; the plan fits it or fails"
    )
    g.add_argument(
        "--preset", default="shardplan", choices=("shardplan", "mindspore"), help="cost preset"
    )
    mode = g.add_mutually_exclusive_group()
    mode.add_argument(
        "--train", dest="train", action="store_true", default=None, help="training (default)"
    )
    mode.add_argument(
        "--infer", dest="train", action="store_false", help="inference (no backward pass)"
    )
    g.add_argument(
        "--optimizer",
        default="adam",
        choices=("adam", "sgd-momentum", "none"),
        help="optimizer state counted in memory (training)",
    )
    g.add_argument(
        "--time-limit", type=float, default=60.0, help="seconds for ilp and dp (default 60)"
    )
    g.add_argument(
        "--force",
        action="append",
        default=[],
        metavar="OP=STRATEGY",
        help="keep OP's strategy and plan the rest around it (repeatable), e.g. "
        "h.0.mlp.fc=row or h.0.mlp.fc=b,n,- (one cut per round, '-' none)",
    )
    return p


def machine_arg(text: str) -> Any:
    """A preset name as it is, or the Machine a JSON file describes (`Machine.from_dict`)."""
    if text in MACHINES:
        return text
    from pathlib import Path

    from shardplan.hardware import Machine

    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a machine preset ({', '.join(sorted(MACHINES))}) nor a JSON "
            "file describing one (see docs/machines.md)"
        )
    try:
        import json

        return Machine.from_dict(json.loads(path.read_text()))
    except (ValueError, RecursionError, ShardplanError) as e:
        raise argparse.ArgumentTypeError(f"machine file {text}: {e}") from e


def output_flags() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--json", metavar="FILE", help="also write the result as JSON to FILE")
    p.add_argument(
        "-q", "--quiet", action="store_true", help="no progress or import report on stderr"
    )
    return p


def plot_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--plot",
        metavar="FILE",
        help="also draw the result to FILE.png or FILE.svg (needs the `plot` extra: matplotlib)",
    )


# -- progress -----------------------------------------------------------------------------------
class Progress:
    """Progress of slow steps on stderr: a spinner while a step runs and a line when it ends
    (steps over 1 s); silent with --quiet or when stderr is not a terminal."""

    def __init__(self, quiet: bool = False, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.quiet = quiet
        self.enabled = not quiet and self.console.is_terminal

    @contextlib.contextmanager
    def step(self, text: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        start = time.perf_counter()
        with self.console.status(escape(text)):
            yield
        seconds = time.perf_counter() - start
        if seconds > 1.0:
            self.console.print(f"{escape(text)}: {units.seconds(seconds)}", highlight=False)

    def update(self, text: str) -> None:
        """A progress line of a long search: on a terminal only (like the spinner)."""
        if self.enabled:
            self.console.print(escape(text), highlight=False, soft_wrap=True)

    def note(self, text: str) -> None:
        """A message for the user (import report, warnings): shown unless --quiet."""
        if not self.quiet:
            self.console.print(escape(text), highlight=False, soft_wrap=True)


def progress_of(args: argparse.Namespace) -> Progress:
    return Progress(getattr(args, "quiet", False))


# -- --force --------------------------------------------------------------------------------------
def resolve_op(graph: Graph, name: str) -> str:
    """An op name, or a module prefix (`h.0.mlp.fc`) naming exactly one heavy op under it."""
    from shardplan.search.drec.flex import is_transparent

    if name in graph.op_index:
        return name
    under = [
        op for op in graph.ops if op.name.startswith(name + ".") or op.name.startswith(name + "/")
    ]
    heavy = [op.name for op in under if not is_transparent(op)]
    if len(heavy) == 1:
        return heavy[0]
    if heavy:
        raise PlanError(
            f"op {name!r} names {len(heavy)} heavy ops ({', '.join(heavy[:5])}); give one of them"
        )
    # an op or the module path of a heavy op (`h.0.mlp.fc` for `h.0.mlp.fc.linear`)
    names = [n for op in graph.ops for n in (op.name, op.name.rsplit(".", 1)[0])]
    hint = did_you_mean(name, names, "`shardplan show` lists the ops")
    raise PlanError(f"no op {name!r} in {graph.name}{hint}")


def parse_strategy(graph: Graph, mesh: Mesh, op_name: str, text: str) -> Strategy:
    """'b,n,-' / 'b n -' (one per round) or 'row' (every round) -> a strategy of `op_name`."""
    from shardplan.cli.render import cut_kind

    op = graph.op(op_name)
    rounds = len(mesh.rounds)
    tokens = [t for t in text.replace(",", " ").split() if t]
    if len(tokens) == 1:
        tokens = tokens * rounds
    if len(tokens) != rounds:
        raise PlanError(
            f"--force {op_name}={text}: give one cut per round ({rounds} on mesh {mesh.text()}, "
            "'-' for none) or a single cut for every round"
        )
    dims = [d.name for d in op.signature.loop_dims]
    out: list[str | None] = []
    for token in tokens:
        if token in ("-", "none"):
            out.append(None)
        elif token in dims:
            out.append(token)
        else:
            named = [d for d in dims if cut_kind(graph, op, d) == token]
            if len(named) != 1:
                choices = ", ".join(f"{d} ({cut_kind(graph, op, d)})" for d in dims)
                raise PlanError(
                    f"--force {op_name}={text}: {token!r} is not a loop dim of {op_name} "
                    f"({op.signature.text()}); choose from {choices} or '-'"
                )
            out.append(named[0])
    return tuple(out)


def parse_forces(graph: Graph, mesh: Mesh, items: Sequence[str]) -> dict[str, Strategy]:
    forced: dict[str, Strategy] = {}
    for item in items:
        if "=" not in item:
            raise PlanError(f"--force {item!r}: write OP=STRATEGY, e.g. h.0.mlp.fc=row")
        name, text = item.rsplit("=", 1)
        op_name = resolve_op(graph, name.strip())
        forced[op_name] = parse_strategy(graph, mesh, op_name, text)
    return forced


# -- plans from flags ------------------------------------------------------------------------------
def plan_options(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "train": args.train is not False,
        "memory": args.memory,
        "preset": args.preset,
        "optimizer": args.optimizer,
        **({"zero": args.zero} if getattr(args, "zero", None) is not None else {}),
    }


def plan_from_args(
    args: argparse.Namespace,
    graph: Graph,
    mesh: Mesh,
    progress: Progress,
    method: str | None = None,
    forced: dict[str, Strategy] | None = None,
) -> Any:
    """Plan `graph` as the flags say (ilp: with D-Rec's plan as the incumbent it must beat)."""
    from shardplan.search import plan

    method = method or args.method
    extra: dict[str, Any] = {"time_limit": args.time_limit} if method in ("ilp", "dp") else {}
    if forced:
        extra["fixed"] = forced
    options = plan_options(args)
    if method == "ilp":
        with progress.step(f"D-Rec plan of {graph.name} (the ILP's incumbent)"):
            seed = plan(graph, mesh, "drec", **options, fixed=forced or None)
        extra["incumbent"] = seed.strategies
    with progress.step(f"{method} planning {graph.name} on mesh {mesh.text()}"):
        return plan(graph, mesh, method, **options, **extra)
