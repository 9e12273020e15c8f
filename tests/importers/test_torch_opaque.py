"""torch importer, unknown="replicate": multi-result ops, effect tokens, untraceable code."""

import pytest

torch = pytest.importorskip("torch")

from shardplan.errors import UnsupportedOpError  # noqa: E402
from shardplan.importers import import_torch  # noqa: E402
from shardplan.ir import DimKind, verify  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning")


class _Linalg(torch.nn.Module):
    """fc, then a linalg op on 2x2 matrices [2, 2, 2]."""

    def __init__(self, fn):
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)
        self.fn = fn

    def forward(self, x):
        return self.fn(self.fc(x).reshape(2, 2, 2))


def _slogdet(m):
    sign, logabs = torch.linalg.slogdet(m)
    return (sign * logabs).sum()


def _lu_factor(m):
    lu, pivots = torch.linalg.lu_factor(m)  # export adds an error check behind an effect token
    return lu.sum() + pivots.sum()


def _lstsq(m):
    return torch.linalg.lstsq(m, m).solution.sum()


X = (torch.randn(2, 4),)


def test_every_result_of_a_multi_result_op_is_replicated_and_reported():
    result = import_torch(_Linalg(_slogdet), X, unknown="replicate")
    (r,) = result.replicated
    assert r.source == "aten._linalg_slogdet.default"
    op = result.graph.op(r.op)
    assert op.kind == "opaque" and op.outputs == r.results
    # _linalg_slogdet returns sign [2], logabsdet [2], LU [2, 2, 2], pivots [2, 2]
    shapes = [result.graph.tensors[t].shape for t in op.outputs]
    assert shapes == [(2,), (2,), (2, 2, 2), (2, 2)]
    assert all(d.kind is DimKind.FROZEN for d in op.signature.loop_dims)
    assert f"{r.op} (aten._linalg_slogdet.default): 4 results" in result.report()
    verify(result.graph)


def test_an_effect_token_around_a_check_is_not_an_operand():
    # lu_factor exports as linalg_lu_factor_ex (LU, pivots, info) + with_effects(token,
    # _linalg_check_errors, info): the check is skipped, the token never read as a tensor
    result = import_torch(_Linalg(_lu_factor), X, unknown="replicate")
    (r,) = result.replicated
    assert r.source == "aten.linalg_lu_factor_ex.default"
    assert len(r.results) == 3
    assert not any("getitem" in note for note in result.notes)  # the token is not "dropped"
    verify(result.graph)
    with pytest.raises(UnsupportedOpError, match="linalg_lu_factor_ex"):
        import_torch(_Linalg(_lu_factor), X)


def test_what_torch_export_cannot_trace_is_a_typed_error_naming_the_op():
    with pytest.raises(UnsupportedOpError, match=r"torch.export could not trace.*linalg_lstsq"):
        import_torch(_Linalg(_lstsq), X, unknown="replicate")


def test_the_eager_per_expert_moe_loop_is_a_typed_error_with_the_fix():
    transformers = pytest.importorskip("transformers")
    config = transformers.MixtralConfig(
        hidden_size=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_hidden_layers=1,
        intermediate_size=32,
        vocab_size=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        use_cache=False,
        attn_implementation="eager",
        experts_implementation="eager",  # a Python loop over the experts hit (nonzero)
    )
    model = transformers.MixtralForCausalLM(config).eval()
    with pytest.raises(UnsupportedOpError, match=r"could not trace MixtralForCausalLM.*grouped_mm"):
        import_torch(model, (torch.randint(0, 32, (2, 4)),))
