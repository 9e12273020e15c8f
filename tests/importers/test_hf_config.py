"""Hugging Face configs planned without weights: the meta-device import of the published configs
in tests/data/hf equals the zoo's twin (a few layers), at any batch, with clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import shardplan as sp  # noqa: E402
from shardplan.errors import ArgumentError, UnknownModelError  # noqa: E402
from shardplan.zoo import build  # noqa: E402

HF = Path(__file__).resolve().parents[1] / "data" / "hf"


@pytest.mark.parametrize(("name", "layers"), [("llama3-8b", 1), ("mixtral-8x7b", 1),
                                               ("deepseek-v3", 4), ("qwen3-32b", 1)])
def test_published_config_imports_like_the_zoo_twin(name, layers):
    graph = sp.from_hf(HF / name, batch=2, seq=16, layers=layers)
    twin = build(name, batch=2, seq=16, layers=layers)
    assert graph.num_params == twin.num_params
    assert graph.flops == pytest.approx(twin.flops, rel=0.01)
    assert {"linear", "bmm", "embedding"} <= {op.kind for op in graph.ops}


def test_full_size_config_has_the_published_parameter_count():
    # all 80 layers on the meta device: no weights are allocated
    graph = sp.from_hf(HF / "llama3-70b" / "config.json", batch=1, seq=8)
    assert graph.num_params == pytest.approx(70.6e9, rel=0.01)
    assert graph.num_params == build("llama3-70b", batch=1, seq=8).num_params


def test_builder_rebuilds_at_each_batch():
    builder = sp.hf_builder(HF / "llama3-8b", seq=8, layers=1)
    one, four = builder(1), builder(4)
    assert one.tensor("input_ids").shape == (1, 8)
    assert four.tensor("input_ids").shape == (4, 8)
    assert four.flops == pytest.approx(4 * one.flops, rel=1e-9)


def test_config_as_dict_and_as_transformers_object():
    import transformers

    data = json.loads((HF / "llama3-8b" / "config.json").read_text())
    from_dict = sp.from_hf(data, batch=1, seq=8, layers=1)
    config = transformers.AutoConfig.for_model(**data)
    from_object = sp.from_hf(config, batch=1, seq=8, layers=1)
    assert from_dict.num_params == from_object.num_params


def test_bad_configs_are_named(tmp_path):
    with pytest.raises(UnknownModelError, match="has no config.json"):
        sp.from_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(UnknownModelError, match="no 'model_type'"):
        sp.from_hf(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "not-a-model"}))
    with pytest.raises(UnknownModelError, match="does not know model_type 'not-a-model'"):
        sp.from_hf(tmp_path)
    with pytest.raises(ArgumentError, match="must be a path, a dict or a transformers config"):
        sp.from_hf(42)
    with pytest.raises(ArgumentError, match="batch must be between 1"):
        sp.from_hf(HF / "llama3-8b", batch=0, seq=8, layers=1)


def test_causal_lm_loss_is_translated_directly():
    # export's IR keeps aten.cross_entropy_loss and aten.pad (the label shift): both have rows,
    # so the import skips the core-ATen decomposition and the loss is one cross_entropy op
    import torch

    from shardplan.importers import torch as importer
    from shardplan.importers.hf_config import example_inputs, load_config, meta_module

    cfg, _, arch = load_config(HF / "llama3-8b", layers=1, hidden=64, heads=4)
    model = meta_module(cfg, arch)
    args, kwargs = example_inputs(model, cfg, 2, 8, None, labels=True)
    program = torch.export.export(model, args, kwargs)
    assert not importer._needs_decomposition(program, importer.aten_table())
    graph = importer._translate(torch, program, "llama", "error").graph
    (loss,) = [op for op in graph.ops if op.kind == "cross_entropy"]
    assert [graph.tensor(t).shape for t in loss.inputs] == [(16, cfg.vocab_size), (16,)]


@pytest.mark.parametrize("arch", ["t5", "convnext", "whisper", "mamba"])
def test_import_coverage_configs_import_without_weights(arch):
    # an encoder-decoder, an image model, speech (log-mel input_features) and a state-space
    # model of benchmarks/import_coverage.py, from their tiny configs alone
    import sys

    from shardplan.ir.op import Role

    sys.path.insert(0, str(HF.parents[2] / "benchmarks"))
    import import_coverage

    module, _ = dict((row[0], row[2]) for row in import_coverage.ARCHITECTURES)[arch]()
    config = module.config
    config.architectures = [type(module).__name__]
    graph = sp.from_hf(config, batch=2, seq=8)
    assert graph.num_params == sum(p.numel() for p in module.parameters())
    inputs = [t for t in graph.tensors.values() if t.role is Role.INPUT]
    assert inputs and all(t.shape[0] == 2 for t in inputs)


@pytest.mark.parametrize("resize", [{}, {"hidden": 256, "heads": 8}])
def test_a_config_whose_head_dim_is_read_only_imports(resize):
    # Falcon derives head_dim in a property without a setter: the importer must not assign it
    from transformers import FalconConfig

    config = FalconConfig(
        hidden_size=128, num_hidden_layers=2, num_attention_heads=4, vocab_size=500,
        architectures=["FalconForCausalLM"],
    )  # fmt: skip
    graph = sp.from_hf(config, batch=2, seq=16, **resize)
    hidden = resize.get("hidden", 128)
    assert any(op.kind == "linear" for op in graph.ops)
    assert graph.tensors["transformer.word_embeddings.weight"].shape == (500, hidden)
