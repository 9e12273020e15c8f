"""`F.scaled_dot_product_attention` imports as one fused `attention` op (causal flag, masks,
grouped-query heads), computes what the module computes, and plans on it run; the forms the
kind cannot express go through the core-ATen decomposition instead."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import shardplan as sp  # noqa: E402
from shardplan.engines import torch_exec as te  # noqa: E402
from shardplan.importers import import_torch  # noqa: E402
from shardplan.importers import torch as importer  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


class Block(torch.nn.Module):
    """x [b, t, 16] -> q, k, v (4 heads of 4; or 4 query and 2 key/value heads) -> SDPA -> out."""

    def __init__(self, mask: str = "none", causal: bool = False, gqa: bool = False,
                 dropout: float = 0.0, scale: float | None = None) -> None:  # fmt: skip
        super().__init__()
        self.mask, self.causal, self.gqa = mask, causal, gqa
        self.dropout, self.scale = dropout, scale
        self.kv = 2 if gqa else 4
        self.q, self.out = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)
        self.k, self.v = torch.nn.Linear(16, 4 * self.kv), torch.nn.Linear(16, 4 * self.kv)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).reshape(b, t, 4, 4).transpose(1, 2)  # no slices: imported exactly
        k = self.k(x).reshape(b, t, self.kv, 4).transpose(1, 2)
        v = self.v(x).reshape(b, t, self.kv, 4).transpose(1, 2)
        mask = None
        if self.mask == "static-bool":  # a folded mask: each query sees itself and later keys
            mask = torch.ones(t, t, dtype=torch.bool).triu()
        elif self.mask == "all-true":  # transformers' mask without padding, broadcast per batch
            mask = torch.ones(1, 1, t, t, dtype=torch.bool).expand(b, 1, t, t)
        elif self.mask == "computed":  # depends on the input: [s, t] shared by the batch
            mask = x[0, :, :t] > -1.0
        elif self.mask == "per-batch":  # a padding-like mask per batch element
            mask = (x[:, :, :t] > -1.0).unsqueeze(1)
        o = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout, is_causal=self.causal,
            scale=self.scale, enable_gqa=self.gqa,
        )  # fmt: skip
        return self.out(o.transpose(1, 2).reshape(b, t, 16))


def _x(batch=4, seq=8):
    return torch.randn(batch, seq, 16, generator=torch.Generator().manual_seed(0))


def _import(module, x):
    torch.manual_seed(0)
    return import_torch(module, (x,))


def _attention_ops(graph):
    return [op for op in graph.ops if op.kind == "attention"]


def _run_imported(graph, module, x):
    """The imported graph on the module's own weights (constants from the engines' values)."""
    params = {name: value.detach().numpy() for name, value in module.state_dict().items()}
    _, inputs = te.init_values(graph)
    inputs["x"] = x.numpy()
    (out,) = te.forward(graph, {t.name: params[t.name] for t in graph.parameters}, inputs).values()
    return out.detach().numpy()


@pytest.mark.parametrize(
    "options",
    [{}, {"causal": True}, {"gqa": True, "causal": True}, {"scale": 0.3}, {"mask": "all-true"}],
    ids=["plain", "causal", "gqa-causal", "scale", "all-true-mask"],
)
def test_sdpa_is_one_attention_op_computing_what_the_module_computes(options):
    torch.manual_seed(0)
    module, x = Block(**options).eval(), _x()
    result = _import(module, x)
    graph = result.graph
    (op,) = _attention_ops(graph)
    assert "softmax" not in {o.kind for o in graph.ops} and "bmm" not in {o.kind for o in graph.ops}
    masks = [t for t in op.inputs[3:]]
    assert masks == (["causal_mask_8x8"] if options.get("causal") else [])  # all-true: dropped
    assert len(graph.tensors[op.inputs[0]].shape) == (5 if options.get("gqa") else 4)
    if "scale" in options:
        assert op.attr("scale") == 0.3
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(_run_imported(graph, module, x), want, rtol=1e-5, atol=1e-6)


def test_masks_folded_or_computed_become_an_additive_input():
    module, x = Block(mask="static-bool").eval(), _x()
    graph = _import(module, x).graph
    (op,) = _attention_ops(graph)
    (mask,) = op.inputs[3:]
    assert graph.tensors[mask].shape == (8, 8) and "causal" not in mask  # anti-causal: a constant
    result = _import(Block(mask="computed").eval(), x)
    (op,) = _attention_ops(result.graph)
    producer = {out: o for o in result.graph.ops for out in o.outputs}[op.inputs[3]]
    assert producer.kind == "scale" and producer.attr("value") == 1e9  # (m - 1) x 1e9
    assert result.approximated["aten.scaled_dot_product_attention.default"] == 1


@pytest.mark.parametrize(
    "options", [{"dropout": 0.1}, {"mask": "per-batch"}], ids=["dropout", "per-batch-mask"]
)
def test_forms_the_kind_cannot_express_are_decomposed(options):
    module, x = Block(**options), _x()
    module.train(bool(options.get("dropout")))
    program = torch.export.export(module, (x,))
    assert not importer._needs_decomposition(program, importer.aten_table())  # it has a row...
    with pytest.raises(importer.UnsupportedOpError, match="scaled_dot_product_attention"):
        importer._translate(torch, program, "b", "error", decompose=False)  # ...that refuses
    graph = importer._translate(torch, program, "b", "error").graph
    kinds = {op.kind for op in graph.ops}
    assert "attention" not in kinds and {"softmax", "bmm"} <= kinds


def test_plans_on_imported_attention_run_sharded(devices8):
    from shardplan.fidelity.verify import verify_plan

    module, x = Block(causal=True, gqa=True).eval(), _x()
    graph = _import(module, x).graph
    free = sp.plan(graph, "4")
    plan = sp.plan(graph, "4", memory=free.cost.memory_per_device * 0.5)
    cut = [s for name, s in plan.strategies.items() if graph.ops[graph.op_index[name]].kind
           == "attention"]  # fmt: skip
    assert all(d in ("b0", "b1", "g0", "s", "e", None) for s in cut for d in s)  # t, d FROZEN
    assert any(d is not None for s in cut for d in s), cut  # the budget makes it cut attention
    report = verify_plan(plan, train=True)
    assert report.numerics_ok, report.text()


def test_hugging_face_sdpa_models_translate_directly():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    sizes = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
    vit = transformers.ViTModel(transformers.ViTConfig(**sizes, intermediate_size=64,
                                                       image_size=32, patch_size=8))  # fmt: skip
    llama = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            **sizes, num_key_value_heads=2, intermediate_size=64, vocab_size=64, use_cache=False
        )  # fmt: skip
    )
    for model, x, mask in (
        (vit, torch.randn(2, 3, 32, 32), ()),
        (llama, torch.zeros(2, 8).long(), ("causal_mask_8x8",)),
    ):
        assert model.config._attn_implementation == "sdpa"
        program = torch.export.export(model.eval(), (x,))
        assert not importer._needs_decomposition(program, importer.aten_table())
        graph = importer._translate(torch, program, "m", "error", decompose=False).graph
        ops = _attention_ops(graph)
        assert len(ops) == 2 and all(tuple(op.inputs[3:]) == mask for op in ops)
        assert graph.num_params == sum(p.numel() for p in model.parameters())
