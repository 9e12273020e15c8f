"""shardplan: operator-level (SPMD) parallel plans for DNN training, found by the Double-Recursive
algorithm (D-Rec) with a symbolic, profiling-free cost model.

Public API: `zoo.build`, `Graph`/`GraphBuilder`, `Mesh`/`parse_mesh`, `plan`, `evaluate`, `Plan`.
Heavy frameworks (jax, torch, onnx) are imported only by the importers, exporters and engines
that need them.
"""

from __future__ import annotations

from shardplan import errors, zoo
from shardplan.ir import DimKind, Graph, GraphBuilder, Op, Role, Tensor
from shardplan.mesh import Mesh, parse_mesh
from shardplan.plan import Plan, evaluate
from shardplan.search import plan  # rebinds `shardplan.plan` from the module to the function
from shardplan.version import __version__  # noqa: E402  (one home for the version)

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
    "parse_mesh",
    "plan",
    "zoo",
]
