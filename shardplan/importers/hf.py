"""Hugging Face architectures by name, built offline from their config class (random weights).

No weights and no config are downloaded: each supported name maps to a `transformers` config
class with the published hyper-parameters written here, a model class, and the inputs it takes.
The model is built with `attn_implementation="eager"` and `use_cache=False`, then imported with
torch.export (`import_torch`). Size overrides (`layers`, `hidden`, `heads`) make small versions.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from shardplan.errors import UnknownModelError
from shardplan.importers._build import ImportResult
from shardplan.lazy import require


@dataclass(frozen=True)
class HFArch:
    """One supported name: config class + published hyper-parameters + model class + inputs."""

    config: str
    model: str
    inputs: str  # "tokens" (input_ids), "seq2seq" (input_ids + decoder_input_ids), "pixels"
    params: dict[str, Any] = field(default_factory=dict)
    layer_key: str = "num_hidden_layers"
    hidden_key: str = "hidden_size"
    heads_key: str = "num_attention_heads"


def _gpt2(layers: int, hidden: int, heads: int) -> HFArch:
    return HFArch(
        "GPT2Config",
        "GPT2LMHeadModel",
        "tokens",
        {"n_layer": layers, "n_embd": hidden, "n_head": heads},
        "n_layer",
        "n_embd",
        "n_head",
    )


ARCHITECTURES: dict[str, HFArch] = {
    "bert-base-uncased": HFArch("BertConfig", "BertForSequenceClassification", "tokens"),
    "bert-large-uncased": HFArch(
        "BertConfig",
        "BertForSequenceClassification",
        "tokens",
        {
            "num_hidden_layers": 24,
            "hidden_size": 1024,
            "num_attention_heads": 16,
            "intermediate_size": 4096,
        },
    ),
    "gpt2": _gpt2(12, 768, 12),
    "gpt2-medium": _gpt2(24, 1024, 16),
    "gpt2-large": _gpt2(36, 1280, 20),
    "gpt2-xl": _gpt2(48, 1600, 25),
    "google/vit-base-patch16-224": HFArch("ViTConfig", "ViTModel", "pixels"),
    "microsoft/resnet-50": HFArch(
        "ResNetConfig", "ResNetModel", "pixels", {}, "depths", "hidden_size", ""
    ),
    "t5-small": HFArch(
        "T5Config",
        "T5ForConditionalGeneration",
        "seq2seq",
        {"d_model": 512, "num_layers": 6, "num_heads": 8, "d_ff": 2048},
        "num_layers",
        "d_model",
        "num_heads",
    ),
    "TinyLlama/TinyLlama-1.1B": HFArch(
        "LlamaConfig",
        "LlamaForCausalLM",
        "tokens",
        {
            "hidden_size": 2048,
            "intermediate_size": 5632,
            "num_hidden_layers": 22,
            "num_attention_heads": 32,
            "num_key_value_heads": 4,
            "vocab_size": 32000,
        },
    ),
    "mistralai/Mixtral-8x7B-v0.1": HFArch(
        "MixtralConfig",
        "MixtralForCausalLM",
        "tokens",
        {
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "vocab_size": 32000,
        },
    ),
    "facebook/convnext-tiny-224": HFArch(
        "ConvNextConfig", "ConvNextModel", "pixels", {}, "depths", "hidden_size", ""
    ),
}


def import_hf(
    name: str,
    batch: int = 8,
    seq: int = 128,
    image: int = 224,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    unknown: str = "error",
) -> ImportResult:
    """Build architecture `name` (a supported name, or a local folder / config.json: then on the
    meta device, `hf_config`) with random weights and import it (see module docstring)."""
    from shardplan.importers.hf_config import config_path, hf_importer

    local = config_path(name)
    if local is not None:
        options = {"layers": layers, "hidden": hidden, "heads": heads, "unknown": unknown}
        return hf_importer(local, seq, image, **options)(batch)
    if name not in ARCHITECTURES:
        close = difflib.get_close_matches(name, list(ARCHITECTURES), n=3)
        raise UnknownModelError(
            f"--hf {name!r} is not supported offline; similar: {close}; "
            f"supported: {sorted(ARCHITECTURES)}, or a local folder or config.json"
        )
    torch = require("torch", extra="torch", user="--hf")
    transformers = require("transformers", extra="torch", user="--hf")
    from shardplan.importers.torch import import_torch

    arch = ARCHITECTURES[name]
    params = dict(arch.params)
    if layers is not None:
        if arch.layer_key == "depths":
            params["depths"] = [1] * min(layers, 4)
        else:
            params[arch.layer_key] = layers
    if hidden is not None and arch.hidden_key and arch.layer_key != "depths":
        params[arch.hidden_key] = hidden
        if "intermediate_size" in params or arch.config in ("BertConfig", "ViTConfig"):
            params["intermediate_size"] = 4 * hidden
        if arch.config == "T5Config":
            params["d_ff"] = 4 * hidden
    if heads is not None and arch.heads_key:
        params[arch.heads_key] = heads
        if "num_key_value_heads" in params:
            params["num_key_value_heads"] = min(params["num_key_value_heads"], heads)
    if arch.config == "ViTConfig":
        params["image_size"] = image
    config = getattr(transformers, arch.config)(**params)
    config.use_cache = False
    torch.manual_seed(0)
    model_cls = getattr(transformers, arch.model)
    try:
        model = model_cls._from_config(config, attn_implementation="eager")
    except (TypeError, ValueError):
        model = model_cls(config)
    model.eval()
    vocab = int(getattr(config, "vocab_size", 2) or 2)
    if arch.inputs == "pixels":
        channels = int(getattr(config, "num_channels", 3))
        args: tuple[Any, ...] = (torch.randn(batch, channels, image, image),)
        kwargs: dict[str, Any] = {}
    elif arch.inputs == "seq2seq":
        ids = torch.randint(0, vocab, (batch, seq))
        args, kwargs = (), {"input_ids": ids, "decoder_input_ids": ids}
    else:
        args, kwargs = (torch.randint(0, vocab, (batch, seq)),), {}
    if arch.inputs != "pixels" and arch.model.endswith("ForCausalLM"):
        kwargs["use_cache"] = False
    with torch.no_grad():
        return import_torch(
            model,
            args,
            kwargs or None,
            unknown=unknown,  # type: ignore[arg-type]
            name=name,
        )
