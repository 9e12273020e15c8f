"""torch.export importer: tiny Hugging Face models, the unknown-op policy, the rules."""

import functools
import warnings

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from shardplan.errors import ShardplanError, UnsupportedOpError  # noqa: E402
from shardplan.importers import ReplicatedOpsWarning, from_torch, import_torch  # noqa: E402
from shardplan.importers.torch import aten_table  # noqa: E402
from shardplan.ir import DimKind, Role, verify  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
T = transformers
EAGER = {"attn_implementation": "eager"}


def _ids(batch=2, seq=8, vocab=100):
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(0))


def bert():
    c = T.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=64, **EAGER)
    return T.BertForSequenceClassification(c), (_ids(),), {}


def gpt2():
    c = T.GPT2Config(vocab_size=100, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                     use_cache=False, bos_token_id=0, eos_token_id=0, **EAGER)
    return T.GPT2LMHeadModel(c), (_ids(),), {}


def resnet():
    c = T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1],
                       layer_type="basic", num_channels=3)
    return T.ResNetModel(c), (torch.randn(2, 3, 32, 32),), {}


def llama():
    c = T.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      use_cache=False, **EAGER)
    return T.LlamaForCausalLM(c), (_ids(),), {}


def t5():
    c = T.T5Config(vocab_size=100, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4,
                   use_cache=False, **EAGER)
    return T.T5ForConditionalGeneration(c), (_ids(),), {"decoder_input_ids": _ids(seq=6)}


def vit():
    c = T.ViTConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=64, image_size=32, patch_size=8, **EAGER)
    return T.ViTModel(c), (torch.randn(2, 3, 32, 32),), {}


def mixtral(experts="batched_mm"):
    c = T.MixtralConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                        num_experts_per_tok=2, max_position_embeddings=64, use_cache=False,
                        experts_implementation=experts, **EAGER)
    return T.MixtralForCausalLM(c), (_ids(),), {}


# model -> kinds its graph must contain
MODELS = {
    "bert": (bert, {"embedding", "linear", "bias_add", "bmm", "softmax", "layer_norm", "gelu"}),
    "gpt2": (gpt2, {"embedding", "matmul", "linear", "bmm", "softmax", "layer_norm"}),
    "resnet": (resnet, {"conv2d", "batch_norm", "relu", "pool2d", "reduce_mean"}),
    "llama": (llama, {"embedding", "linear", "bmm", "softmax", "rsqrt", "reduce_mean", "concat"}),
    "t5": (t5, {"embedding", "linear", "bmm", "softmax", "relu"}),
    "vit": (vit, {"conv2d", "concat", "linear", "bmm", "softmax", "layer_norm"}),
    "mixtral": (mixtral, {"embedding", "linear", "bmm", "softmax", "einsum", "reduce_sum"}),
}


def _params(model):
    return sum(p.numel() for p in model.parameters())


@functools.cache
def _imported(name):
    torch.manual_seed(0)
    model, args, kwargs = MODELS[name][0]()
    return model, import_torch(model.eval(), args, kwargs)


@pytest.mark.parametrize("name", list(MODELS))
def test_hugging_face_model_imports(name):
    model, result = _imported(name)
    kinds = MODELS[name][1]
    graph = result.graph
    assert verify(graph) is graph
    assert graph.num_params == _params(model)
    assert result.replicated == ()
    assert kinds <= {op.kind for op in graph.ops}
    assert any(op.layer for op in graph.ops)
    # folding: no op reads only constants (masks, positions and rotary tables are constants)
    for op in graph.ops:
        assert any(graph.tensors[t].role is not Role.CONSTANT for t in op.inputs), op.name


def test_tied_lm_head_is_one_parameter_read_as_a_linear_weight():
    graph = _imported("gpt2")[1].graph
    weights = [t for t in graph.parameters if t.shape == (100, 32)]
    assert len(weights) == 1
    (head,) = [op for op in graph.ops if op.kind == "linear"]
    assert head.inputs[1] == weights[0].name


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 16)
        self.conv = torch.nn.Conv1d(4, 6, 3, padding=1)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x, s):
        y = self.drop(torch.relu(self.fc(x)))
        return y[:, :4].sum(-1), self.conv(s).clamp(0, 1)


def test_rules_on_a_small_module():
    result = import_torch(_Block().train(), (torch.randn(2, 8), torch.randn(2, 4, 10)))
    graph = result.graph
    kinds = [op.kind for op in graph.ops]
    assert "linear" in kinds and "dropout" in kinds and "conv2d" in kinds
    linear = next(op for op in graph.ops if op.kind == "linear")
    assert graph.tensors[linear.inputs[1]].shape == (16, 8)  # the stored [out, in] weight
    conv = next(op for op in graph.ops if op.kind == "conv2d")
    assert graph.tensors[conv.outputs[0]].shape == (2, 6, 1, 10)  # conv1d as a height-1 conv2d
    assert [op.kind for op in graph.ops[-2:]] == ["maximum", "minimum"] or "minimum" in kinds
    assert result.approximated == {"aten.slice.Tensor": 1}
    assert graph.num_params == 8 * 16 + 16 + 4 * 6 * 3 + 6


class _ManyOps(torch.nn.Module):
    """One of each op family the table covers beyond the transformer zoo."""

    def __init__(self):
        super().__init__()
        self.bn, self.gn = torch.nn.BatchNorm2d(4), torch.nn.GroupNorm(2, 4)
        self.emb = torch.nn.Embedding(10, 6)
        self.w = torch.nn.Parameter(torch.randn(3, 5, 6))

    def forward(self, x, img, ids, mask):
        f = torch.nn.functional
        values, indices = torch.topk(x, 2, dim=-1)
        first, *_, last = x.unbind(0)
        left, right = x.split([2, 4], -1)
        batched = x.unsqueeze(0).expand(3, 4, 6)
        return (torch.gather(x, 1, ids[:, :3]), torch.index_select(x, 1, ids[0, :2]), values,
                indices, torch.sort(x, -1)[0], torch.cumsum(x, -1), x.max(-1)[0], x.var(-1),
                x.argmax(-1), f.pad(x, (1, 2)), torch.stack([x, x], 1), first + last, left,
                right, x.clamp(min=0), f.hardtanh(x), torch.where(mask, x, 0.0),
                x.masked_fill(mask, -1.0), f.log_softmax(x, -1), 1 - x, x ** 3, 2 ** x,
                torch.erf(x).abs(), x.exp().log(), self.bn(img), self.gn(img),
                f.avg_pool2d(img, 2), f.adaptive_avg_pool2d(img, 2),
                torch.baddbmm(batched, batched[:, :, :5], self.w), self.emb(ids),
                self.w[ids[0, :2]], x[ids[0], ids[1]], (x > 0) & (x < 1), x.mean(), x.any(-1),
                x.view(4, 2, 3).transpose(1, 2), x.reshape(24).sin())


def test_many_op_families_import_without_replication():
    args = (torch.randn(4, 6), torch.randn(2, 4, 8, 8), torch.randint(0, 4, (4, 6)),
            torch.rand(4, 6) > 0.5)
    result = import_torch(_ManyOps().train(), args)
    kinds = {op.kind for op in result.graph.ops}
    assert result.replicated == ()
    assert {"einsum", "batch_norm", "pool2d", "bmm", "embedding", "concat", "softmax",
            "reduce_max", "minimum", "maximum"} <= kinds
    assert result.approximated["aten.topk.default"] == 2  # values and indices
    assert result.graph.num_params == 4 + 4 + 4 + 4 + 60 + 90


def test_exported_program_is_accepted():
    program = torch.export.export(_Block().eval(), (torch.randn(2, 8), torch.randn(2, 4, 10)))
    graph = from_torch(program)
    assert graph.name == "exported_program"
    assert "dropout" not in {op.kind for op in graph.ops}  # eval-mode dropout is an alias


class _Det(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.linalg.det(self.fc(x).view(2, 2, 2)).sum()


class _Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = _Det()

    def forward(self, x):
        return self.block(x) * 2


def test_unsupported_op_raises_with_op_and_module():
    with pytest.raises(UnsupportedOpError, match=r"aten\._linalg_det\.default.*'block'"):
        from_torch(_Outer(), (torch.randn(2, 4),))


def test_unsupported_op_replicates_and_reports():
    result = import_torch(_Outer(), (torch.randn(2, 4),), unknown="replicate")
    (replicated,) = result.replicated
    assert replicated.source == "aten._linalg_det.default"
    assert replicated.module == "block"
    opaque = result.graph.op(replicated.op)
    assert opaque.kind == "opaque"
    assert all(d.kind is DimKind.FROZEN for d in opaque.signature.loop_dims)
    assert "aten._linalg_det.default" in result.report()
    with pytest.warns(ReplicatedOpsWarning, match="_linalg_det"):
        graph = from_torch(_Outer(), (torch.randn(2, 4),), unknown="replicate")
    assert graph.num_params == 20


def test_moe_with_grouped_experts_imports_strictly_with_an_expert_dim():
    torch.manual_seed(0)
    model, args, _ = mixtral(experts=None)  # transformers' default: grouped_mm
    result = import_torch(model.eval(), args)
    assert result.replicated == ()
    assert result.graph.num_params == _params(model)
    experts = [op for op in result.graph.ops if op.kind == "expert_matmul"]
    assert len(experts) == 4  # up and down, two layers
    assert all(op.signature.loop_dims[0].name == "e" for op in experts)
    assert sum("experts model.layers" in n for n in result.notes) == 2


def test_bad_policy_and_table_invariants():
    with pytest.raises(ShardplanError, match="unknown='skip'"):
        import_torch(_Det(), (torch.randn(2, 4),), unknown="skip")
    table = aten_table()
    assert "aten.addmm.default" in table and "aten.convolution.default" in table
    with warnings.catch_warnings():
        warnings.simplefilter("error", ReplicatedOpsWarning)
        from_torch(_Det().fc, (torch.randn(3, 4),))  # nothing replicated: no warning


class _TfSamePad(torch.nn.Module):
    """TF-ported "same" padding: one more row and column after than before (constant_pad_nd)."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2)

    def forward(self, x):
        return self.conv(torch.nn.functional.pad(x, (0, 1, 0, 1)))


def test_asymmetric_constant_pad_of_two_axes_imports():
    g = from_torch(_TfSamePad(), (torch.randn(2, 3, 8, 8),))
    assert not any(op.kind == "opaque" for op in g.ops)
    # aten.pad (the direct path) or constant_pad_nd (decomposed), one op per padded axis
    pads = [op for op in g.ops if op.name.split("/")[0] in ("pad", "constant_pad_nd")]
    assert len(pads) == 2  # one gather per padded axis, the second reading the first
    assert g.tensors[pads[-1].outputs[0]].shape == (2, 3, 9, 9)


class _BrokenBatchNorm(torch.nn.Module):
    """Its BatchNorm has another size than the conv's channels: the module itself fails."""

    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 1)
        self.bn = torch.nn.BatchNorm2d(32)

    def forward(self, x):
        return self.bn(self.conv(x))


def test_a_module_that_fails_on_its_own_inputs_is_an_ir_error_not_an_export_one():
    from shardplan.errors import IRError

    module = _BrokenBatchNorm()
    before = module.bn.running_mean.clone()
    with pytest.raises(
        IRError, match="fails on its example inputs without shardplan.*running_mean"
    ):
        from_torch(module, (torch.randn(2, 3, 4, 4),))
    assert torch.equal(module.bn.running_mean, before)
