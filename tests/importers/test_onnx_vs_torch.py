"""The ONNX export of a small BERT plans the same matmul strategies as its torch.export import."""

import io

import pytest

import shardplan as sp
from shardplan.ir.op import Role

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
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

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=128, hidden_size=64, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=256,
                                     max_position_embeddings=64, attn_implementation="eager")
    bert = transformers.BertModel(config).eval()
    with torch.no_grad():  # distinct values: the exporter merges equal initializers
        for p in bert.parameters():
            p.normal_()

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids):
            return self.bert(input_ids=input_ids).last_hidden_state

    ids = torch.randint(0, 128, (8, 32))
    buffer = io.BytesIO()
    torch.onnx.export(Wrapper(), (ids,), buffer, dynamo=False, input_names=["input_ids"])
    from_onnx = import_onnx(onnx.load_from_string(buffer.getvalue())).graph
    with torch.no_grad():
        from_torch = import_torch(Wrapper(), (ids,)).graph
    a, b = _weight_ops(from_onnx), _weight_ops(from_torch)
    assert [n for _, n in a] == [n for _, n in b] and len(a) == 12
    for mesh in ("4", "2x2"):
        # half the unconstrained plan's memory: at this toy size D-Rec would replicate everything
        budget = sp.plan(from_torch, mesh).cost.memory_per_device / 2
        p_onnx = sp.plan(from_onnx, mesh, memory=budget)
        p_torch = sp.plan(from_torch, mesh, memory=budget)
        assert [p_onnx.strategies[x] for x, _ in a] == [p_torch.strategies[y] for y, _ in b]
    assert any(c is not None for x, _ in a for c in p_onnx.strategies[x])  # 2x2 really cuts
