"""The torch importer translates export's IR directly when it can: same graph as after the core
ATen decomposition, and the decomposition is still used when an op needs it."""

import pytest

torch = pytest.importorskip("torch")

import shardplan as sp  # noqa: E402
from shardplan.cost import CostOptions, evaluate_strategies  # noqa: E402
from shardplan.importers import torch as importer  # noqa: E402
from shardplan.search.drec import drec  # noqa: E402


class _Gpt(torch.nn.Module):
    def __init__(self, hidden=32, heads=4, layers=2, vocab=64, seq=16):
        super().__init__()
        self.heads = heads
        self.wte, self.wpe = torch.nn.Embedding(vocab, hidden), torch.nn.Embedding(seq, hidden)
        self.ln = torch.nn.ModuleList(torch.nn.LayerNorm(hidden) for _ in range(2 * layers))
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(hidden, 3 * hidden) for _ in range(layers))
        self.mlp = torch.nn.ModuleList(
            torch.nn.Sequential(
                torch.nn.Linear(hidden, 4 * hidden),
                torch.nn.GELU(),
                torch.nn.Linear(4 * hidden, hidden),
            )
            for _ in range(layers)
        )
        self.head = torch.nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids):
        b, t = ids.shape
        x = self.wte(ids) + self.wpe(torch.arange(t, device=ids.device))
        for i, (qkv, mlp) in enumerate(zip(self.qkv, self.mlp, strict=True)):
            q, k, v = qkv(self.ln[2 * i](x)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
            a = (q @ k.transpose(-2, -1)).masked_fill(
                torch.ones(t, t, dtype=torch.bool, device=ids.device).triu(1), -1e9
            )
            x = x + (a.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1)
            x = x + mlp(self.ln[2 * i + 1](x))
        return self.head(x)


def _program(module, *args):
    return torch.export.export(module, args)


def test_direct_translation_equals_the_decomposed_one():
    with torch.device("meta"):  # big enough for plans that cut (no weights in memory)
        module, ids = _Gpt(hidden=512, heads=8, vocab=1024, seq=64), torch.zeros(32, 64).long()
    program = _program(module, ids)
    assert not importer._needs_decomposition(program, importer.aten_table())
    direct = importer._translate(torch, program, "gpt", "error").graph
    decomposed = importer._translate(torch, program, "gpt", "error", decompose=True).graph
    # export's IR keeps composite ops with rules of their own (unbind: three selections where
    # the decomposition has a slice and a squeeze each): the heavy ops and the plan agree
    heavy = ("linear", "bmm", "embedding")
    assert [op.kind for op in direct.ops if op.kind in heavy] == [
        op.kind for op in decomposed.ops if op.kind in heavy
    ]
    assert len(direct.ops) <= len(decomposed.ops)
    assert direct.num_params == decomposed.num_params
    opts = CostOptions.make()
    for mesh in ("8", "2x4"):
        mesh = sp.parse_mesh(mesh)
        costs = [
            evaluate_strategies(g, mesh, drec(g, mesh, opts), opts).total
            for g in (direct, decomposed)
        ]
        assert costs[0] == pytest.approx(costs[1], rel=1e-12)
        plan = drec(direct, mesh, opts)
        assert any(any(s) for s in plan.values())  # a plan that cuts, not all replicated


def test_an_op_without_a_rule_is_decomposed_first():
    class Hard(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.silu(x).logsumexp(
                -1
            )  # silu has no rule before decomposition

    program = _program(Hard(), torch.randn(2, 8))
    table = importer.aten_table()
    keys = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    missing = {k for k in keys if k not in table}
    assert importer._needs_decomposition(program, table) == bool(missing)
    importer.import_torch(program)  # imports either way


def test_a_shape_a_rule_refuses_falls_back_to_the_decomposition():
    class Broadcast(torch.nn.Module):
        def forward(self, a, b):
            return a @ b  # (4, 2, 8, 16) @ (2, 16, 8): aten.matmul's rule refuses these shapes

    program = _program(Broadcast(), torch.randn(4, 2, 8, 16), torch.randn(2, 16, 8))
    assert not importer._needs_decomposition(program, importer.aten_table())
    with pytest.raises(importer.UnsupportedOpError):
        importer._translate(torch, program, "b", "error", decompose=False)
    graph = importer._translate(torch, program, "b", "error").graph
    assert "bmm" in {op.kind for op in graph.ops}


def test_results_nobody_reads_are_not_imported():
    class Dead(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)

        def forward(self, x):
            self.unused(x).tanh()  # computed, never returned: the decomposition drops it too
            return self.used(x)

    program = _program(Dead(), torch.randn(2, 8))
    direct = importer._translate(torch, program, "d", "error").graph
    decomposed = importer._translate(torch, program, "d", "error", decompose=True).graph
    assert [op.kind for op in direct.ops] == [op.kind for op in decomposed.ops]
    assert "tanh" not in {op.kind for op in direct.ops}


def _hf(name):
    transformers = pytest.importorskip("transformers")
    sizes = {"hidden_size": 32, "num_hidden_layers": 2, "vocab_size": 64}
    if name == "llama":  # RMSNorm upcasts with aten.to.dtype; SwiGLU's silu
        config = transformers.LlamaConfig(
            **sizes,
            num_attention_heads=4,
            num_key_value_heads=2,
            intermediate_size=64,
            use_cache=False,
            attn_implementation="eager",
        )
        return transformers.LlamaForCausalLM(config), torch.zeros(2, 8).long()
    if name == "mamba":  # chunk, a depthwise conv1d, dt_proj.weight @ x (2-D @ 3-D matmul)
        config = transformers.MambaConfig(
            **sizes, state_size=4, expand=2, conv_kernel=4, use_cache=False
        )
        return transformers.MambaForCausalLM(config), torch.zeros(2, 8).long()
    config = transformers.ConvNextConfig(
        hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, image_size=32
    )
    return transformers.ConvNextModel(config), torch.randn(2, 3, 32, 32)  # strided, grouped conv2d


@pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")
@pytest.mark.parametrize("name", ["llama", "mamba", "convnext"])
def test_hugging_face_models_translate_directly(name):
    # export's IR ops of these models (to.dtype, chunk, conv1d/conv2d, 2-D @ 3-D matmul) have
    # rules: no decomposition; the graph is the decomposed one's or leaner (silu stays one op)
    torch.manual_seed(0)
    model, x = _hf(name)
    program = _program(model.eval(), x)
    assert not importer._needs_decomposition(program, importer.aten_table())
    direct = importer._translate(torch, program, name, "error", decompose=False).graph
    decomposed = importer._translate(torch, program, name, "error", decompose=True).graph
    heavy = ("linear", "bmm", "embedding", "conv2d", "einsum")
    assert sorted(op.kind for op in direct.ops if op.kind in heavy[:4]) == sorted(
        op.kind for op in decomposed.ops if op.kind in heavy[:4]
    )
    assert direct.num_params == decomposed.num_params == sum(p.numel() for p in model.parameters())
    assert len(direct.ops) <= len(decomposed.ops)
    opts = CostOptions.make()
    mesh = sp.parse_mesh("4")
    costs = [
        evaluate_strategies(g, mesh, drec(g, mesh, opts), opts).total
        for g in (direct, decomposed)
    ]
    # the same heavy ops; fewer elementwise ops (silu, softplus as one op each) cost no more
    assert costs[0] <= costs[1] * (1 + 1e-12)
