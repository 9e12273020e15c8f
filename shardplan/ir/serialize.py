"""Graph <-> plain dict (JSON-ready), exact round trip; O(size of the graph)."""

from __future__ import annotations

from typing import Any

from shardplan.errors import IRError
from shardplan.ir.dims import DimKind, LoopDim, Reducer
from shardplan.ir.graph import Graph, make_graph
from shardplan.ir.op import Op, Role, Tensor
from shardplan.ir.signature import Signature


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    return value


def graph_to_dict(graph: Graph) -> dict[str, Any]:
    return {
        "name": graph.name,
        "tensors": [
            [t.name, list(t.shape), t.dtype_bytes, t.role.value] for t in graph.tensors.values()
        ],
        "ops": [
            {
                "name": op.name,
                "kind": op.kind,
                "layer": op.layer,
                "flops": op.flops,
                "inputs": list(op.inputs),
                "outputs": list(op.outputs),
                "loop_dims": [
                    [
                        d.name,
                        d.extent,
                        d.kind.value,
                        d.reducer.value if d.reducer else None,
                        d.halo,
                        d.span,
                    ]
                    for d in op.signature.loop_dims
                ],
                "input_dims": [[list(g) for g in dims] for dims in op.signature.inputs],
                "output_dims": [[list(g) for g in dims] for dims in op.signature.outputs],
                "attrs": [[k, v] for k, v in op.attrs],
            }
            for op in graph.ops
        ],
    }


def graph_from_dict(data: dict[str, Any]) -> Graph:
    from shardplan.ir.verify import verify

    try:
        tensors = {
            name: Tensor(name, tuple(shape), int(dtype), Role(role))
            for name, shape, dtype, role in data["tensors"]
        }
        ops = []
        for o in data["ops"]:
            dims = tuple(
                LoopDim(n, int(e), DimKind(k), Reducer(r) if r else None, int(h), int(sp))
                for n, e, k, r, h, *rest in o["loop_dims"]
                for sp in [rest[0] if rest else 0]  # span: absent in files before it existed
            )
            sig = Signature(
                dims,
                tuple(tuple(tuple(g) for g in d) for d in o["input_dims"]),
                tuple(tuple(tuple(g) for g in d) for d in o["output_dims"]),
            )
            ops.append(
                Op(
                    o["name"],
                    o["kind"],
                    sig,
                    tuple(o["inputs"]),
                    tuple(o["outputs"]),
                    float(o["flops"]),
                    tuple((k, _freeze(v)) for k, v in o["attrs"]),
                    o.get("layer", ""),
                )
            )
        graph = make_graph(str(data["name"]), tensors, tuple(ops))
    except (KeyError, TypeError, ValueError) as e:
        raise IRError(f"graph JSON is malformed: {e!r}") from e
    return verify(graph)
