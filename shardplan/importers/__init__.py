"""Importers: framework graphs -> `Graph`. torch and onnx are imported only when called.

- `from_torch(module, example_args, ...)` / `import_torch(...)`: torch.export, core ATen.
- `from_onnx(path_or_model, ...)` / `import_onnx(...)`: an ONNX ModelProto with inferred shapes.

`from_*` return the Graph (warning with `ReplicatedOpsWarning` if ops were made opaque);
`import_*` return an `ImportResult` with the graph, the replicated ops and the approximations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardplan.importers._build import ImportResult, ReplicatedOp, ReplicatedOpsWarning

if TYPE_CHECKING:
    from shardplan.ir.graph import Graph

__all__ = [
    "ImportResult",
    "ReplicatedOp",
    "ReplicatedOpsWarning",
    "from_onnx",
    "from_torch",
    "import_onnx",
    "import_torch",
]


def from_torch(
    module: Any, example_args: Any = (), example_kwargs: Any = None, **options: Any
) -> Graph:
    """See `shardplan.importers.torch.from_torch`."""
    from shardplan.importers import torch as importer

    return importer.from_torch(module, example_args, example_kwargs, **options)


def import_torch(
    module: Any, example_args: Any = (), example_kwargs: Any = None, **options: Any
) -> ImportResult:
    """See `shardplan.importers.torch.import_torch`."""
    from shardplan.importers import torch as importer

    return importer.import_torch(module, example_args, example_kwargs, **options)


def from_onnx(path_or_model: Any, **options: Any) -> Graph:
    """See `shardplan.importers.onnx.from_onnx`."""
    from shardplan.importers import onnx as importer

    return importer.from_onnx(path_or_model, **options)


def import_onnx(path_or_model: Any, **options: Any) -> ImportResult:
    """See `shardplan.importers.onnx.import_onnx`."""
    from shardplan.importers import onnx as importer

    return importer.import_onnx(path_or_model, **options)
