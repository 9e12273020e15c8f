"""The operator IR: loop dims, signatures, ops, tensors, the catalogue and the graph."""

from shardplan.ir.catalogue import CATALOGUE, OpForm, op_form
from shardplan.ir.dims import DimKind, LoopDim, Reducer
from shardplan.ir.graph import Graph, GraphBuilder, make_graph
from shardplan.ir.op import Op, Role, Tensor
from shardplan.ir.signature import Signature, major_positions
from shardplan.ir.verify import verify

__all__ = [
    "CATALOGUE",
    "DimKind",
    "Graph",
    "GraphBuilder",
    "LoopDim",
    "Op",
    "OpForm",
    "Reducer",
    "Role",
    "Signature",
    "Tensor",
    "make_graph",
    "major_positions",
    "op_form",
    "verify",
]
