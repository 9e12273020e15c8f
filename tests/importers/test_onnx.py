"""ONNX importer: a tiny BERT exported by torch.onnx, hand-built graphs, the unknown-op policy."""

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from shardplan.errors import ShapeError, UnsupportedOpError  # noqa: E402
from shardplan.importers import ReplicatedOpsWarning, from_onnx, import_onnx  # noqa: E402
from shardplan.ir import DimKind, Role, verify  # noqa: E402

from .tiny_bert import onnx_bytes, tiny_bert  # noqa: E402


def _init(name, shape, seed=0):
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)


def _model(nodes, inputs, outputs, initializers, opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _mlp():
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="/fc1/MatMul"),
        helper.make_node("Add", ["b1", "h"], ["hb"], name="/fc1/Add"),
        helper.make_node("Relu", ["hb"], ["a"], name="/act/Relu"),
        helper.make_node("Gemm", ["a", "w2", "b2"], ["y"], name="/fc2/Gemm", transB=1),
        helper.make_node("Softmax", ["y"], ["p"], name="/Softmax", axis=-1),
    ]
    inits = [
        _init("w1", (8, 16)),
        _init("b1", (16,), 1),
        _init("w2", (4, 16), 2),
        _init("b2", (4,), 3),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    p = helper.make_tensor_value_info("p", TensorProto.FLOAT, [2, 4])
    return _model(nodes, [x], [p], inits)


def test_hand_built_mlp():
    graph = from_onnx(_mlp())
    assert verify(graph) is graph
    assert [op.kind for op in graph.ops] == [
        "matmul",
        "bias_add",
        "relu",
        "linear",
        "bias_add",
        "softmax",
    ]
    assert graph.num_params == 8 * 16 + 16 + 4 * 16 + 4
    assert graph.op("h").layer == "fc1"
    assert graph.tensors["x"].role is Role.INPUT


def _attention():
    """Q K^T / sqrt(d) -> softmax -> V with heads split by Reshape/Transpose (constant shapes)."""
    b, s, h, heads = 2, 4, 8, 2
    d = h // heads
    nodes = [
        helper.make_node(
            "Constant",
            [],
            ["shape"],
            value=numpy_helper.from_array(np.array([b, s, heads, d], dtype=np.int64)),
        )
    ]
    for t in "qkv":
        nodes += [
            helper.make_node("MatMul", ["x", f"w{t}"], [f"{t}0"], name=f"/{t}/MatMul"),
            helper.make_node("Reshape", [f"{t}0", "shape"], [f"{t}1"], name=f"/{t}/Rs"),
        ]
    nodes += [
        helper.make_node("Transpose", ["q1"], ["q"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["k1"], ["kt"], perm=[0, 2, 3, 1]),
        helper.make_node("Transpose", ["v1"], ["v"], perm=[0, 2, 1, 3]),
        helper.make_node("MatMul", ["q", "kt"], ["scores"]),
        helper.make_node("Div", ["scores", "scale"], ["scaled"]),
        helper.make_node("Softmax", ["scaled"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        helper.make_node(
            "Constant",
            [],
            ["merged"],
            value=numpy_helper.from_array(np.array([b, s, h], dtype=np.int64)),
        ),
        helper.make_node("Reshape", ["ctx_t", "merged"], ["flat"]),
        helper.make_node("ReduceMean", ["flat"], ["pooled"], axes=[1], keepdims=0),
    ]
    inits = [_init(f"w{t}", (h, h), i) for i, t in enumerate("qkv")]
    inits.append(numpy_helper.from_array(np.array(d**0.5, dtype=np.float32), "scale"))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, s, h])
    y = helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [b, h])
    return _model(nodes, [x], [y], inits)


def test_hand_built_attention_block():
    result = import_onnx(_attention())
    kinds = [op.kind for op in result.graph.ops]
    assert kinds.count("bmm") == 2 and kinds.count("matmul") == 3
    assert {"reshape", "transpose", "scale", "softmax", "reduce_mean"} <= set(kinds)
    assert result.graph.num_params == 3 * 8 * 8  # the scalar initializer is a constant
    assert result.replicated == () and result.approximated == {}


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # the TorchScript-based exporter
def test_tiny_bert_exported_by_torch_imports(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    module, bert = tiny_bert(vocab=100, hidden=32, intermediate=64, pooled=True)
    ids = torch.randint(0, 100, (2, 8))
    data = onnx_bytes(module, ids)
    path = tmp_path / "bert.onnx"
    path.write_bytes(data)
    result = import_onnx(path)
    graph = result.graph
    assert graph.name == "bert"
    assert verify(graph) is graph
    assert graph.num_params == sum(p.numel() for p in bert.parameters())
    assert result.replicated == ()
    kinds = {op.kind for op in graph.ops}
    assert {"embedding", "layer_norm", "matmul", "bias_add", "bmm", "softmax"} <= kinds
    assert any(op.layer.startswith("bert.encoder.layer.1") for op in graph.ops)


def _with_det():
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"], name="/fc/MatMul"),
        helper.make_node("Reshape", ["h", "shape"], ["m"], name="/Reshape"),
        helper.make_node("Det", ["m"], ["det"], name="/block/Det"),
    ]
    inits = [
        _init("w", (4, 9)),
        numpy_helper.from_array(np.array([2, 3, 3], dtype=np.int64), "shape"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])
    y = helper.make_tensor_value_info("det", TensorProto.FLOAT, [2])
    return _model(nodes, [x], [y], inits)


def test_unsupported_op_raises_with_its_name():
    with pytest.raises(UnsupportedOpError, match=r"ONNX op 'Det'.*/block/Det"):
        from_onnx(_with_det())


def test_unsupported_op_replicates_and_reports():
    result = import_onnx(_with_det(), unknown="replicate")
    (replicated,) = result.replicated
    assert replicated.source == "Det" and replicated.module == "block"
    opaque = result.graph.op(replicated.op)
    assert all(d.kind is DimKind.FROZEN for d in opaque.signature.loop_dims)
    assert "Det" in result.report()
    with pytest.warns(ReplicatedOpsWarning, match="Det"):
        from_onnx(_with_det(), unknown="replicate")


def test_symbolic_input_shape_is_a_clear_error():
    model = _mlp()
    dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    dim.ClearField("dim_value")
    dim.dim_param = "batch"
    with pytest.raises(ShapeError, match="static shape"):
        from_onnx(model)


def test_depthwise_conv_imports_with_groups():
    vi = helper.make_tensor_value_info
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="/dw/Conv", group=8,
                              pads=[1, 1, 1, 1])]
    model = _model(nodes, [vi("x", TensorProto.FLOAT, [2, 8, 6, 6])],
                   [vi("y", TensorProto.FLOAT, [2, 8, 6, 6])],
                   [_init("w", (8, 1, 3, 3)), _init("b", (8,), 1)])
    result = import_onnx(model)
    conv = next(op for op in result.graph.ops if op.kind == "conv2d")
    assert conv.attr("groups") == 8 and conv.signature.loop_dim("g").extent == 8
    assert result.graph.num_params == 8 * 9 + 8
