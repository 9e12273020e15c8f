"""The ONNX export of a small BERT plans the same matmul strategies as its torch.export import."""

import pytest

import shardplan as sp
from shardplan.ir.op import Role

from .tiny_bert import onnx_bytes, tiny_bert

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
onnx = pytest.importorskip("onnx")


def _weight_ops(graph):
    out = []
    for op in graph.ops:
        if op.kind in ("linear", "matmul"):
            weights = [t for t in op.inputs if graph.tensors[t].role is Role.PARAMETER]
            if weights:
                out.append((op.name, graph.tensors[weights[0]].numel))
    return out


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_onnx_and_torch_imports_plan_the_same_matmuls():
    from shardplan.importers import import_onnx, import_torch

    module, _ = tiny_bert(vocab=128, hidden=64, intermediate=256, pooled=False)
    ids = torch.randint(0, 128, (8, 32))
    from_onnx = import_onnx(onnx.load_from_string(onnx_bytes(module, ids))).graph
    with torch.no_grad():
        from_torch = import_torch(module, (ids,)).graph
    a, b = _weight_ops(from_onnx), _weight_ops(from_torch)
    assert [n for _, n in a] == [n for _, n in b] and len(a) == 12
    for mesh in ("4", "2x2"):
        # half the unconstrained plan's memory: at this toy size D-Rec would replicate everything
        budget = sp.plan(from_torch, mesh).cost.memory_per_device / 2
        p_onnx = sp.plan(from_onnx, mesh, memory=budget)
        p_torch = sp.plan(from_torch, mesh, memory=budget)
        assert [p_onnx.strategies[x] for x, _ in a] == [p_torch.strategies[y] for y, _ in b]
    assert any(c is not None for x, _ in a for c in p_onnx.strategies[x])  # 2x2 really cuts
