"""`shardplan verify --torch MODULE:FUNCTION --engine torch --user-module`: the user's own module
trained through `shardplan.torch.parallelize` on mesh-size gloo processes (3 AdamW steps) and
compared with the same module trained in one process; collectives per kind next to the plan's
prediction. The plan is made here (as for any verify) and sent to every process as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from shardplan import units
from shardplan.errors import PlanError

STEPS = 3
TOLERANCE = {"float64": 1e-9, "float32": 1e-4}


def user_module(target: str, shapes: str | None) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """The `--torch MODULE:FUNCTION` builder as `(module, args, kwargs)` (run in each process)."""
    from shardplan.cli.models import _call_torch_builder

    module, example = _call_torch_builder(target, shapes)
    return module, example, {}


def verify_user_module(plan: Any, args: argparse.Namespace) -> int:
    from shardplan.cli.commands import make_console
    from shardplan.exporters.plan_json import to_json
    from shardplan.torch.check import comm_table, train_worker
    from shardplan.torch.launch import spawn

    if not plan.options.train:
        raise PlanError("--user-module verifies training; drop --infer")
    report = spawn(
        train_worker,
        plan.mesh.size,
        (
            user_module,
            (args.torch, args.args),
            plan.mesh.text(),
            1.0,
            STEPS,
            1e-2,
            "parallelize",
            plan.method,
            to_json(plan),
            args.seed,
            args.check_dtype,
        ),
    )
    rtol = args.rtol if args.rtol is not None else TOLERANCE[args.check_dtype]
    ok = report["max_param_error"] <= rtol and all(
        abs(a - b) <= rtol * max(1.0, abs(b))
        for a, b in zip(report["parallel_losses"], report["reference_losses"], strict=True)
    )
    console = make_console()
    mesh = "round-shaped" if report["per_round"] else "on the mesh's own axes"
    lines = [
        f"{plan.graph.name}: {plan.method} plan on {plan.mesh.text()} ({mesh}), "
        f"{report['sharded_params']} of {report['params']} parameters sharded",
        f"losses (parallelize): {', '.join(map(units.number, report['parallel_losses']))}",
        f"losses (one process): {', '.join(map(units.number, report['reference_losses']))}",
        "largest loss difference: "
        + units.number(
            max(
                abs(a - b)
                for a, b in zip(report["parallel_losses"], report["reference_losses"], strict=True)
            )
        ),
        f"largest parameter difference after {STEPS} AdamW steps: "
        f"{units.number(report['max_param_error'])} (tolerance {units.number(rtol)})",
        "collectives of the first step (forward + backward):",
        comm_table(report),
        "OK" if ok else "MISMATCH",
    ]
    console.print("\n".join(lines), highlight=False)
    if args.json:
        Path(args.json).write_text(json.dumps({**report, "ok": ok}, indent=1))
        console.print(f"report written to {args.json}")
    return 0 if ok else 1
