"""`shardplan` command line: argparse sub-commands; every ShardplanError maps to an exit code.

Exit codes: 0 ok, 1 other shardplan error, 2 usage / unknown model, 3 bad graph, 4 bad mesh,
5 bad plan, 6 infeasible (memory), 7 unsupported op, 8 missing optional dependency, 9 solver,
10 backend (engine) failure.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from rich.console import Console
from rich.markup import escape

from shardplan.errors import ShardplanError


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line on stderr (exit 2), like every other CLI failure."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"error: usage: {message} (see `{self.prog} --help`)\n")
        raise SystemExit(2)


def build_parser() -> argparse.ArgumentParser:
    from shardplan.cli import commands, compare, engines, explain, verify
    from shardplan.version import __version__

    parser = _Parser(
        prog="shardplan",
        description="Operator-level (SPMD) parallel plans for DNN training, found by D-Rec.",
    )
    parser.add_argument("--version", action="version", version=f"shardplan {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.register(sub)
    compare.register(sub)
    engines.register(sub)
    explain.register(sub)
    verify.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    try:
        return int(args.run(args) or 0)
    except ShardplanError as e:
        # escape: messages carry text like "pip install 'shardplan[jax]'" that is not markup
        console.print(
            f"[bold red]error[/]: {type(e).__name__}: {escape(str(e))}",
            highlight=False,
            soft_wrap=True,
        )
        return e.exit_code
    except TypeError as e:  # zoo.build: a size flag the model does not take
        if "does not take" in str(e):
            console.print(f"[bold red]error[/]: {escape(str(e))}", highlight=False, soft_wrap=True)
            return 2
        raise
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
