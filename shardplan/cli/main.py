"""`shardplan` command line: argparse sub-commands; every ShardplanError maps to an exit code.

Exit codes: 0 ok, 1 other shardplan error, 2 usage / unknown model, 3 bad graph, 4 bad mesh,
5 bad plan, 6 infeasible (memory), 7 unsupported op, 8 missing optional dependency, 9 solver,
10 backend (engine) failure.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rich.console import Console

from shardplan.errors import ShardplanError


def build_parser() -> argparse.ArgumentParser:
    from shardplan.cli import commands

    parser = argparse.ArgumentParser(
        prog="shardplan",
        description="Operator-level (SPMD) parallel plans for DNN training, found by D-Rec.",
    )
    from shardplan.version import __version__

    parser.add_argument("--version", action="version", version=f"shardplan {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.register(sub)
    try:
        from shardplan.cli import compare
    except ImportError:  # compare is optional until its module lands
        compare = None  # type: ignore[assignment]
    if compare is not None:
        compare.register(sub)
    try:
        from shardplan.cli import verify
    except ImportError:
        verify = None  # type: ignore[assignment]
    if verify is not None:
        verify.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    try:
        return int(args.run(args) or 0)
    except ShardplanError as e:
        console.print(
            f"[bold red]error[/]: {type(e).__name__}: {e}", highlight=False, soft_wrap=True
        )
        return e.exit_code
    except TypeError as e:
        if "does not take" in str(e):
            console.print(f"[bold red]error[/]: {e}", highlight=False, soft_wrap=True)
            return 2
        raise
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
