"""Optional frameworks (torch, jax, onnx, transformers, matplotlib), imported on first use.

`require` is the one place that imports an optional dependency: importers, exporters, engines,
the user-facing torch/jax packages and the CLI call it inside the functions that need the
framework, so `import shardplan` stays framework-free (tests/test_package.py checks it). A missing
framework becomes a `MissingDependencyError` that names who needed it and the pip extra to
install. Cost: one `importlib.import_module` per module named (a dict hit once loaded).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from shardplan.errors import MissingDependencyError


def require(module: str, *more: str, extra: str, user: str, hint: str = "") -> ModuleType:
    """Import `module` (and the submodules `more`, e.g. `torch.distributed.tensor`) and return
    `module`; without them raise MissingDependencyError naming `user`, the `extra` to install
    and an optional `hint` (an alternative that needs no framework)."""
    try:
        found = importlib.import_module(module)
        for name in more:
            importlib.import_module(name)
    except ImportError as e:
        also = f"; {hint}" if hint else ""
        raise MissingDependencyError(
            f"{user} needs the `{extra}` extra, which is not installed ({e}); "
            f"install it with: pip install 'shardplan[{extra}]'{also}"
        ) from e
    return found
