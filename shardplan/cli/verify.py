"""`shardplan verify MODEL|plan.json --mesh 8`: run a plan on JAX and check it.

Prints the numerics verdict (sharded vs unsharded, max error against the stated tolerance) and
the communication XLA actually inserted against the cost model's prediction, per collective kind
(bytes one device sends), with the documented cause of every difference beyond 10%.

The JAX CPU backend fakes N devices only when XLA_FLAGS asks for them before jax starts; this
command sets `--xla_force_host_platform_device_count` itself when jax is not imported yet.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from rich.markup import escape

from shardplan import units
from shardplan.cli.options import output_flags, progress_of, search_flags, source_flags
from shardplan.errors import ArgumentError
from shardplan.mesh import Mesh

_FLAG = "xla_force_host_platform_device_count"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "verify",
        parents=[source_flags(), search_flags(mesh_required=False), output_flags()],
        help="run a plan on JAX: numerics vs unsharded, measured vs predicted collectives",
        description="Run MODEL's plan (or a saved plan.json) sharded on JAX/XLA and unsharded on "
        "the same values; report whether the results agree and compare the collectives XLA "
        "inserts (bytes sent per device) with the cost model's prediction. Example: "
        "shardplan verify gpt2-small --small --batch 8 --mesh 8 --method megatron",
    )
    p.add_argument(
        "--engine",
        default="jax",
        choices=("jax", "torch"),
        help="SPMD engine: jax (XLA on fake CPU devices; numerics and collectives) or torch "
        "(DTensor on N local gloo processes; numerics)",
    )
    p.add_argument(
        "--user-module",
        action="store_true",
        help="with --engine torch and --torch MODULE:FUNCTION: train YOUR module 3 AdamW steps "
        "through shardplan.torch.parallelize on mesh-size gloo processes and compare losses and "
        "parameters with one process, plus collectives per kind vs the plan's prediction",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of parameters and inputs")
    p.add_argument(
        "--check-dtype",
        dest="check_dtype",
        default="float64",
        choices=("float64", "float32"),
        help="what both JAX programs compute in (default float64; collective bytes are counted "
        "at the plan's own dtype either way)",
    )
    p.add_argument(
        "--rtol", type=float, default=None, help="relative tolerance (float64 1e-9, float32 1e-4)"
    )
    p.add_argument(
        "--atol", type=float, default=None, help="absolute tolerance (float64 1e-12, float32 1e-6)"
    )
    p.add_argument(
        "--differences",
        type=int,
        default=15,
        help="list at most N per-operator differences (0: none)",
    )
    p.set_defaults(run=run_verify)


def ensure_devices(count: int) -> None:
    """Ask XLA's CPU backend for `count` fake devices, if jax has not started yet."""
    if "jax" in sys.modules and sys.modules["jax"] is not None:
        return
    flags = os.environ.get("XLA_FLAGS", "")
    m = re.search(rf"--{_FLAG}=(\d+)", flags)
    if m and int(m.group(1)) >= count:
        return
    flag = f"--{_FLAG}={count}"
    flags = re.sub(rf"--{_FLAG}=\d+", flag, flags) if m else f"{flags} {flag}".strip()
    os.environ["XLA_FLAGS"] = flags


VERIFY_MEMORY_SHARE = 0.5
"""verify refuses a model whose estimated run needs more than this share of the machine's RAM."""


def refuse_too_big(graph: Any, train: bool, dtype: str, small: bool) -> None:
    """Refuse up front (ArgumentError) when running `graph` twice (one device, then sharded) at
    `dtype`, with gradients when training, would not fit in memory: estimated as every tensor's
    elements x dtype bytes x (2 runs) x (2 with gradients)."""
    elements = sum(t.numel for t in graph.tensors.values())
    need = elements * (8 if dtype == "float64" else 4) * 2 * (2 if train else 1)
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - non-POSIX
        ram = 16e9
    if need > VERIFY_MEMORY_SHARE * ram:
        hint = "use smaller sizes" if small else "add --small (or smaller sizes)"
        raise ArgumentError(
            f"verify would need about {units.nbytes(need)} to run {graph.name!r} "
            f"({elements:,} tensor elements at {dtype}, reference and sharded"
            f"{', with gradients' if train else ''}), over half of this machine's "
            f"{units.nbytes(ram)}; {hint}"
        )


def _is_training_file(path: str | None) -> bool:
    """A training plan (pipeline stages) rather than a single SPMD plan."""
    from shardplan.exporters.training_json import is_training_json

    if not path or not path.endswith(".json"):
        return False
    try:
        return is_training_json(json.loads(Path(path).read_text()))
    except (OSError, ValueError, RecursionError):
        return False  # the plan loader reports unreadable or malformed files


def run_verify(args: argparse.Namespace) -> int:
    if _is_training_file(args.model):
        from shardplan.cli.training import verify_training_plan

        return verify_training_plan(args)
    from shardplan.cli.commands import check_output_path
    from shardplan.cli.plans import plan_for
    from shardplan.cli.render import make_console

    if args.user_module and (args.engine != "torch" or not args.torch):
        raise ArgumentError(
            "--user-module runs your own nn.Module: give --engine torch and --torch MODULE:FUNCTION"
        )
    check_output_path(args.json)
    progress = progress_of(args)

    def check(graph: Any, plan_train: bool | None) -> None:  # before the search and the run
        train = (True if plan_train is None else plan_train) if args.train is None else args.train
        refuse_too_big(graph, train, args.check_dtype, bool(getattr(args, "small", False)))

    p, _ = plan_for(args, progress, check)
    if p.zero:
        progress.note(
            f"the plan's ZeRO stage {p.zero} is verified as the SPMD program the engines run: "
            "stage 0, parameters stored as the plan stores them (docs/cost-model.md)"
        )
    mesh: Mesh = p.mesh
    from shardplan.search.api import split_warning

    split = split_warning(p)
    if split and args.engine == "torch":  # the JAX report prints it under its verdict
        make_console().print(f"warning: {escape(split)}", highlight=False)
    if args.user_module:
        from shardplan.cli.verify_user import verify_user_module

        return verify_user_module(p, args)
    if args.engine == "torch":
        with progress.step(f"running the plan on {mesh.size} torch processes"):
            return _verify_torch(p, args)
    ensure_devices(mesh.size)
    from shardplan.fidelity.verify import verify_plan

    train = p.options.train if args.train is None else args.train
    with progress.step(f"running the plan on {mesh.size} JAX devices"):
        report = verify_plan(
            p, train=train, seed=args.seed, rtol=args.rtol, atol=args.atol, dtype=args.check_dtype
        )
    console = make_console()
    print_report(console, report, args.differences, split)
    if args.json:
        data = report.to_dict()
        data["plan"] = {"method": p.method, "mesh": mesh.text(), "status": p.status}
        Path(args.json).write_text(json.dumps(data, indent=1))
        console.print(f"report written to {args.json}")
    return 0 if report.numerics_ok else 1


def _verify_torch(p: Any, args: argparse.Namespace) -> int:
    """Run the plan with DTensor on mesh-size gloo processes and compare with one process."""
    from shardplan.cli.render import make_console
    from shardplan.fidelity.torch import verify_torch

    train = p.options.train if args.train is None else args.train
    report = verify_torch(p, seed=args.seed, train=train)
    console = make_console()
    console.print(report.text(), highlight=False)
    if args.json:
        Path(args.json).write_text(json.dumps(report.to_dict(), indent=1))
        console.print(f"report written to {args.json}")
    return 0 if report.ok else 1


def print_report(
    console: Any, report: Any, differences: int = 15, split: str | None = None
) -> None:
    """The numerics verdict (and `split`, the plan's `split_warning`, under it: numbers that agree
    because nothing was split prove little), the bytes per collective kind predicted and
    measured, the per-operator differences and their causes."""
    from rich.table import Table

    from shardplan.fidelity.verify import CAUSES, UNEXPLAINED

    mode = "training step (loss + gradients)" if report.train else "forward pass"
    verdict = "[bold green]OK[/]" if report.numerics_ok else "[bold red]FAIL[/]"
    console.print(f"{report.model} on mesh {report.mesh}, {report.method} plan, {mode}")
    console.print(
        f"numerics: {verdict}  max error {units.number(report.max_error)} "
        f"({report.worst_tensor or '-'}), {len(report.tensors)} tensors; "
        f"tolerance: {report.tolerance}"
    )
    if split:
        console.print(f"  [yellow]warning[/]: {escape(split)}", highlight=False)
    if report.numerics_note:
        console.print(f"  [yellow]note[/]: {report.numerics_note}", highlight=False)
    for t in report.tensors[:0] if report.numerics_note else report.tensors:
        if not t.ok:
            console.print(
                f"  [red]{t.name}[/]: max abs error {units.number(t.max_abs_error)}, "
                f"max |reference| {units.number(t.max_abs_reference)}"
            )
    table = Table(title="communication, bytes sent per device (ring algorithms)")
    for col in ("kind", "predicted", "measured", "ratio", "count", "causes of the difference"):
        table.add_column(col, overflow="fold")
    for k in report.kinds:
        if not (k.predicted or k.measured):
            continue
        ratio = "inf" if k.ratio == float("inf") else f"{k.ratio:.3f}"  # a ratio: 3 decimals
        causes = "within 10%" if k.within else (", ".join(k.causes) or UNEXPLAINED)
        if not k.explained:
            causes += f" [red](unexplained {units.nbytes(k.unexplained_bytes)})[/]"
        table.add_row(
            k.kind, units.nbytes(k.predicted), units.nbytes(k.measured), ratio, str(k.count), causes
        )
    table.add_row(
        "total",
        units.nbytes(report.predicted_total),
        units.nbytes(report.measured_total),
        f"{report.measured_total / report.predicted_total:.3f}" if report.predicted_total else "-",
        "",
        "",
    )
    console.print(table)
    shown = [d for d in report.differences][: max(differences, 0)]
    if shown:
        diff = Table(title=f"per-operator differences > 10% ({len(report.differences)} in all)")
        for col in ("op", "kind", "predicted", "measured", "cause"):
            diff.add_column(col, overflow="fold")
        for d in shown:
            diff.add_row(
                d.op or "(no operator)",
                d.kind,
                units.nbytes(d.predicted),
                units.nbytes(d.measured),
                ", ".join(d.causes),
            )
        console.print(diff)
    seen = report.causes_seen()
    if seen:
        console.print("causes (docs/verification.md):")
        for c in seen:
            console.print(f"  [bold]{c}[/]: {CAUSES[c]}", highlight=False)
    if not report.explained:
        console.print(
            "[bold yellow]warning[/]: some differences have no known cause; "
            "please report them with the --json output"
        )


__all__ = ["ensure_devices", "print_report", "register", "run_verify"]
