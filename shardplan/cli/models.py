"""Where the CLI gets a graph: a zoo name, a PyTorch module, a Hugging Face architecture by name,
or an ONNX file. Framework imports happen only for the source asked for."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from collections.abc import Callable
from typing import Any

from shardplan import zoo
from shardplan.cli.options import Progress, zoo_overrides
from shardplan.errors import (
    ArgumentError,
    IRError,
    ShardplanError,
    UnknownModelError,
    UnsupportedOpError,
)
from shardplan.ir.graph import Graph


def model_label(args: argparse.Namespace) -> str:
    return args.model or args.hf or args.onnx or args.torch or "?"


def is_plan_file(model: str | None) -> bool:
    """A saved plan (`plan --json FILE`) given where a model name goes."""
    import os
    from pathlib import Path

    return bool(model) and (
        model.endswith(".json") or (os.sep in model and Path(model).is_file())  # type: ignore[union-attr]
    )


def load_graph(args: argparse.Namespace, progress: Progress | None = None) -> Graph:
    """Build the graph the arguments name (exactly one source); imports show progress."""
    progress = progress or Progress(quiet=True)
    if getattr(args, "model", None) and not (args.torch or args.hf or args.onnx):
        if is_plan_file(args.model):
            from shardplan.cli.plans import load_plan_file

            return load_plan_file(args.model).graph
    with progress.step(f"importing {model_label(args)}"):
        try:
            result = _load(args)
        except UnsupportedOpError as e:  # the importers speak Python; say the CLI flag
            text = str(e).replace("pass unknown='replicate'", "pass --unknown replicate")
            text = text.replace("with unknown='replicate'", "with --unknown replicate")
            raise UnsupportedOpError(text) from e
    if isinstance(result, Graph):
        return result
    if result.replicated or result.approximated or result.notes:
        progress.note(result.report())  # what is not exact
    return result.graph


def _load(args: argparse.Namespace) -> Any:
    sources = [s for s in ("model", "torch", "hf", "onnx") if getattr(args, s, None)]
    if len(sources) != 1:
        raise UnknownModelError(
            "name exactly one model: a zoo name, --torch MODULE:FUNCTION, --hf NAME or --onnx FILE"
            f" (got {sources or 'none'})"
        )
    if getattr(args, "attention", None) and not args.model:
        raise ArgumentError(
            "--attention chooses how zoo models write attention; an imported model runs the "
            "attention its code runs (drop --attention)"
        )
    if args.model:
        overrides: dict[str, Any] = zoo_overrides(args)
        return zoo.build(args.model, small=getattr(args, "small", False), **overrides)
    if args.hf:
        from shardplan.importers.hf import import_hf

        result = import_hf(
            args.hf,
            batch=args.batch or 8,
            seq=args.seq or 128,
            image=args.image or 224,
            layers=args.layers,
            hidden=args.hidden,
            heads=args.heads,
            unknown=args.unknown,
        )
    elif args.onnx:
        from shardplan.importers import import_onnx

        result = import_onnx(args.onnx, unknown=args.unknown)
    else:
        from shardplan.importers import import_torch

        module, example = _call_torch_builder(args.torch, args.args)
        result = import_torch(module, example, unknown=args.unknown)
    return result


def hf_rebuilder(args: argparse.Namespace) -> Callable[[int], Graph]:
    """batch -> graph of the --hf model at that batch (the training-step planner rebuilds the
    model at each micro-batch); a local config's module is built once, on the meta device."""
    from shardplan.importers.hf import import_hf
    from shardplan.importers.hf_config import config_path, hf_importer

    sizes = {"layers": args.layers, "hidden": args.hidden, "heads": args.heads}
    seq, image = args.seq or 128, args.image or 224
    if config_path(args.hf) is not None:
        importer = hf_importer(args.hf, seq, image, unknown=args.unknown, **sizes)
        return lambda b: importer(b).graph
    return lambda b: import_hf(args.hf, b, seq, image, unknown=args.unknown, **sizes).graph


def _call_torch_builder(target: str, shapes: str | None) -> tuple[Any, tuple[Any, ...]]:
    if ":" not in target:
        raise IRError(f"--torch {target!r}: write MODULE:FUNCTION, e.g. my_models:build")
    module_name, function_name = target.split(":", 1)
    sys.path.insert(0, os.getcwd())  # absolute: a cached finder for "." may be stale
    importlib.invalidate_caches()
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise IRError(f"--torch: cannot import module {module_name!r}: {e}") from e
    finally:
        sys.path.pop(0)
    function = getattr(module, function_name, None)
    if not callable(function):
        raise IRError(f"--torch: module {module_name!r} has no function {function_name!r}")
    try:
        built = function()
    except Exception as e:  # the user's builder failed: say so in one line, not a traceback
        raise IRError(
            f"--torch {target}: calling {function_name}() failed with {type(e).__name__}: {e}; "
            "it must take no arguments and return a torch module (or (module, example inputs))"
        ) from e
    pair = isinstance(built, tuple)
    if (pair and len(built) != 2) or not _is_torch_module(built[0] if pair else built):
        raise IRError(
            f"--torch {target}: {function_name}() returned {type(built).__name__}, not a torch "
            "module (or (module, example inputs))"
        )
    if isinstance(built, tuple):
        model, example = built[0], tuple(built[1])
        if shapes:
            example = parse_example_args(shapes)
        return model, example
    if not shapes:
        raise IRError(f"--torch {target}: the function returned a module; give --args shapes")
    return built, parse_example_args(shapes)


def _is_torch_module(x: Any) -> bool:
    import torch

    return isinstance(x, torch.nn.Module)


_DTYPES = {"float": "float32", "long": "int64", "int": "int32", "bool": "bool"}


def parse_example_args(text: str) -> tuple[Any, ...]:
    """'8x128:long,8x128' -> (torch.zeros(8,128, dtype=int64), torch.randn(8,128))."""
    import torch

    out = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+(?:x\d+)*)\s*(?::\s*(\w+))?\s*", part)
        if not m or (m.group(2) and m.group(2) not in _DTYPES):
            raise ShardplanError(
                f"--args {part!r}: write shapes like 8x128:long (dtypes: {sorted(_DTYPES)})"
            )
        shape = tuple(int(s) for s in m.group(1).split("x"))
        dtype = getattr(torch, _DTYPES[m.group(2) or "float"])
        out.append(
            torch.randn(shape) if dtype.is_floating_point else torch.zeros(shape, dtype=dtype)
        )
    return tuple(out)
