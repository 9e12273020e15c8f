"""shardplan: operator-level (SPMD) parallel plans for DNN training, found by the Double-Recursive
algorithm (D-Rec) with a symbolic, profiling-free cost model.

Public API: `zoo.build`, `Graph`/`GraphBuilder`, `Mesh`/`parse_mesh`, `plan` (the function
`shardplan.search.plan`; the Plan value lives in `shardplan.plans`), `evaluate`, `Plan`; the
importers `from_torch`, `from_onnx`, `from_jaxpr`, `from_hf` (a Hugging Face config on the meta
device; `hf_builder` for the training-step planner); the engines `shardplan.torch.parallelize`
and `shardplan.jax.shard`. Heavy frameworks (jax, torch, onnx) are imported only by the importers,
exporters and engines that need them: the importer names and the `torch` / `jax` subpackages are
loaded on first use (PEP 562 `__getattr__`), so `import shardplan` stays light.
"""

from __future__ import annotations

from shardplan import errors, zoo
from shardplan.ir import DimKind, Graph, GraphBuilder, Op, Role, Tensor
from shardplan.mesh import Mesh, parse_mesh
from shardplan.plans import Plan, evaluate
from shardplan.search import plan  # rebinds `shardplan.plans` from the module to the function
from shardplan.version import __version__  # noqa: E402  (one home for the version)

_LAZY = {
    "from_torch": "shardplan.importers.torch",
    "from_onnx": "shardplan.importers.onnx",
    "from_jaxpr": "shardplan.importers.jaxpr",
    "from_hf": "shardplan.importers.hf_config",
    "hf_builder": "shardplan.importers.hf_config",
}


def __getattr__(name: str) -> object:
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in ("torch", "jax"):  # the engine subpackages (they import their framework lazily)
        return importlib.import_module(f"shardplan.{name}")
    raise AttributeError(f"module 'shardplan' has no attribute {name!r}")


__all__ = [
    "DimKind",
    "Graph",
    "GraphBuilder",
    "Mesh",
    "Op",
    "Plan",
    "Role",
    "Tensor",
    "__version__",
    "errors",
    "evaluate",
    "from_hf",
    "from_jaxpr",
    "from_onnx",
    "from_torch",
    "hf_builder",
    "parse_mesh",
    "plan",
    "zoo",
]
