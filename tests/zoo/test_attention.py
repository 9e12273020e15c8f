"""The zoo's `attention` option: one fused op in place of five, the same model otherwise."""

from __future__ import annotations

import pytest

from shardplan.cost import CostOptions
from shardplan.cost.step import profile_stage
from shardplan.errors import ArgumentError
from shardplan.ir import verify
from shardplan.mesh import Mesh
from shardplan.search.experts import megatron
from shardplan.zoo import build

TRANSFORMERS = [
    "gpt3",
    "gpt2-small",
    "bert-base",
    "vit-b16",
    "llama3-8b",
    "qwen3-32b",
    "mixtral-8x7b",
    "deepseek-v3",
]
SCORE_KINDS = {"scale", "softmax"}  # and the mask's add: the ops on the scores


@pytest.mark.parametrize("name", TRANSFORMERS)
def test_fused_graph_has_the_same_parameters_and_one_attention_per_layer(name):
    unfused = build(name, small=True)
    fused = build(name, small=True, attention="fused")
    verify(fused)
    assert fused.num_params == unfused.num_params
    attention = [op for op in fused.ops if op.kind == "attention"]
    scores = [op for op in unfused.ops if op.name.endswith(".scores")]
    assert len(attention) == len(scores) >= 1
    # the GEMMs' FLOPs are the same; the fused graph drops the element-wise ops on the scores
    gemms = sum(op.flops for op in unfused.ops if op.name.endswith((".scores", ".context")))
    assert sum(op.flops for op in attention) == gemms
    dropped = sum(
        op.flops
        for op in unfused.ops
        if op.kind in SCORE_KINDS | {"add"} and op.name.endswith((".scale", ".softmax", ".mask"))
    )
    assert unfused.flops - fused.flops == pytest.approx(dropped)


def test_unknown_attention_is_refused_by_name():
    with pytest.raises(ArgumentError, match="attention must be one of"):
        build("llama3-8b", small=True, attention="flash")
    with pytest.raises(ArgumentError, match="does not take"):
        build("resnet50", small=True, attention="fused")


def test_fused_attention_keeps_no_scores_for_the_backward():
    # one GPT layer at sequence 1024 under Megatron t=4: the unfused layer keeps the softmax's
    # b x heads x s x s result (and the mask-add's input is not kept); the fused one keeps q, k, v
    opts = CostOptions.make(dtype="bf16")
    mesh = Mesh((4,))
    kept = {}
    for attention in ("unfused", "fused"):
        g = build("gpt3", batch=2, seq=1024, layers=1, hidden=256, heads=4, attention=attention)
        prof = profile_stage(g, mesh, megatron(g, mesh, 4), opts)
        kept[attention] = prof.activation_bytes
    scores_per_device = 2 * 4 * 1024 * 1024 * 2 / 4  # b x heads x s x s bf16, heads split 4 ways
    assert kept["unfused"] - kept["fused"] >= scores_per_device


@pytest.mark.parametrize("name", ["gpt3", "llama3-8b", "bert-base"])
def test_fused_models_derive_at_other_batch_sizes(name):
    # the step search derives the model at other micro-batch sizes (`ir.rebatch`): the fused op
    # scales like any other, by the builder's own graphs at those sizes
    from shardplan.ir.rebatch import batch_scaling

    def at(n):
        return build(name, small=True, attention="fused", batch=n)

    scaling = batch_scaling(at(8), 8, at(4), 4)
    assert scaling is not None
    for n in (2, 16):
        assert scaling.at(n) == at(n)
        assert scaling.through_catalogue(n) == at(n)
