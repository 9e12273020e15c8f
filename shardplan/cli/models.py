"""Where the CLI gets a graph: a zoo name with size overrides (other sources plug in here)."""

from __future__ import annotations

import argparse
from typing import Any

from shardplan import zoo
from shardplan.ir.graph import Graph

SIZE_FLAGS = ("batch", "seq", "image", "layers", "hidden", "heads", "vocab", "experts", "width")


def add_model_arguments(parser: argparse.ArgumentParser, required: bool = True) -> None:
    parser.add_argument(
        "model", nargs=None if required else "?", help="zoo model name (see `shardplan models`)"
    )
    group = parser.add_argument_group("model size (zoo models)")
    for flag in SIZE_FLAGS:
        group.add_argument(f"--{flag}", type=int, default=None, help=f"override {flag}")
    group.add_argument(
        "--small", action="store_true", help="start from the reduced sizes used in tests"
    )


def load_graph(args: argparse.Namespace) -> Graph:
    """Build the graph the arguments name."""
    overrides: dict[str, Any] = {f: getattr(args, f, None) for f in SIZE_FLAGS}
    return zoo.build(args.model, small=getattr(args, "small", False), **overrides)
