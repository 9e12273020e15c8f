"""The model zoo: pure-Python builders of common DNN graphs (no framework needed).

`build(name, **overrides)` returns a verified Graph; `MODELS` lists every entry with its default
hyper-parameters. Sizes (batch, seq, image, layers, hidden, ...) are keyword overrides, so tests can
build small versions of every model and benchmarks the full ones.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from shardplan import checks
from shardplan.errors import ArgumentError, UnknownModelError
from shardplan.ir.graph import Graph
from shardplan.zoo import cnn, llm, moe, transformer
from shardplan.zoo.entries_llm import llm_entries


@dataclass(frozen=True, slots=True)
class ModelEntry:
    name: str
    builder_path: str
    defaults: Mapping[str, Any]
    description: str
    published_params: float | None = None
    small: Mapping[str, Any] = field(default_factory=dict)
    published_active: float | None = None  # MoE: parameters activated per token
    source: str = ""  # the published configuration the defaults are read from
    # whether the publisher's activated figure counts the input embedding table (DeepSeek's not)
    active_with_embedding: bool = True

    @property
    def builder(self) -> Callable[..., Graph]:
        module, function = self.builder_path.split(".")
        modules = {"cnn": cnn, "llm": llm, "moe": moe, "transformer": transformer}
        return getattr(modules[module], function)


def _entry(
    name: str,
    builder: str,
    description: str,
    published: float | None = None,
    small: dict[str, Any] | None = None,
    published_active: float | None = None,
    source: str = "",
    *,
    active_with_embedding: bool = True,
    **defaults: Any,
) -> ModelEntry:
    return ModelEntry(
        name,
        builder,
        MappingProxyType(defaults),
        description,
        published,
        MappingProxyType(small or {}),
        published_active,
        source,
        active_with_embedding,
    )


_TINY_TF = {"batch": 4, "seq": 16, "layers": 2, "hidden": 64, "heads": 4, "vocab": 128}

MODELS: Mapping[str, ModelEntry] = MappingProxyType(
    {
        e.name: e
        for e in (
            _entry("mlp", "transformer.mlp", "3-layer MLP on 784-dim inputs", None, {"batch": 16}),
            _entry(
                "sapp-mlp",
                "transformer.sapp_tutorial",
                "MindSpore SAPP tutorial MLP (784-512-512-1)",
                None,
                {"batch": 16},
            ),
            _entry(
                "alexnet",
                "cnn.alexnet",
                "AlexNet (ImageNet, 224x224)",
                61.1e6,
                {"batch": 2, "image": 64, "classes": 10},
            ),
            _entry(
                "vgg16",
                "cnn.vgg16",
                "VGG-16 (ImageNet, 224x224)",
                138.4e6,
                {"batch": 2, "image": 32, "classes": 10, "width": 8},
            ),
            _entry(
                "resnet50",
                "cnn.resnet50",
                "ResNet-50 (ImageNet, 224x224)",
                25.6e6,
                {"batch": 2, "image": 32, "classes": 10, "width": 8},
            ),
            _entry(
                "resnet152",
                "cnn.resnet152",
                "ResNet-152 (ImageNet, 224x224)",
                60.2e6,
                {"batch": 2, "image": 32, "classes": 10, "width": 8},
            ),
            _entry(
                "bert-base",
                "transformer.bert",
                "BERT-base encoder, 12 layers, hidden 768",
                110e6,
                {**_TINY_TF, "max_positions": 16},
                layers=12,
                hidden=768,
                heads=12,
                seq=512,
            ),
            _entry(
                "bert-large",
                "transformer.bert",
                "BERT-large encoder, 24 layers, hidden 1024",
                340e6,
                {**_TINY_TF, "max_positions": 16},
                layers=24,
                hidden=1024,
                heads=16,
                seq=512,
            ),
            _entry(
                "gpt2-small",
                "transformer.gpt",
                "GPT-2 small, 12 layers, hidden 768",
                124e6,
                _TINY_TF,
                layers=12,
                hidden=768,
                heads=12,
            ),
            _entry(
                "gpt2-medium",
                "transformer.gpt",
                "GPT-2 medium, 24 layers, hidden 1024",
                355e6,
                _TINY_TF,
                layers=24,
                hidden=1024,
                heads=16,
            ),
            _entry(
                "gpt2-large",
                "transformer.gpt",
                "GPT-2 large, 36 layers, hidden 1280",
                774e6,
                _TINY_TF,
                layers=36,
                hidden=1280,
                heads=20,
            ),
            _entry(
                "gpt2-xl",
                "transformer.gpt",
                "GPT-2 xl, 48 layers, hidden 1600",
                1558e6,
                _TINY_TF,
                layers=48,
                hidden=1600,
                heads=25,
            ),
            _entry(
                "gpt3-175b",
                "transformer.gpt",
                "GPT-3 175B, 96 layers, hidden 12288, seq 2048",
                175e9,
                {**_TINY_TF, "max_positions": 16},
                layers=96,
                hidden=12288,
                heads=96,
                seq=2048,
                max_positions=2048,
                batch=8,
            ),
            _entry(
                "gpt3",
                "transformer.gpt",
                "GPT-3-style decoder: set layers/hidden/heads",
                None,
                _TINY_TF,
                layers=24,
                hidden=2048,
                heads=16,
                seq=2048,
                max_positions=2048,
            ),
            _entry(
                "vit-b16",
                "transformer.vit",
                "ViT-B/16 (224x224, 1000 classes)",
                86.6e6,
                {
                    "batch": 2,
                    "image": 32,
                    "patch": 8,
                    "layers": 2,
                    "hidden": 64,
                    "heads": 4,
                    "classes": 10,
                },
            ),
            _entry(
                "moe",
                "moe.moe",
                "one Mixture-of-Experts transformer layer (8 experts, top-2)",
                None,
                {"batch": 2, "seq": 16, "hidden": 32, "heads": 4, "experts": 4, "ffn": 64},
            ),
            _entry(
                "deepseek-moe",
                "moe.deepseek_moe",
                "DeepSeek-MoE-style decoder: 64 small experts top-6 + 2 shared experts",
                None,
                {
                    "batch": 2,
                    "seq": 16,
                    "layers": 2,
                    "hidden": 32,
                    "heads": 4,
                    "vocab": 128,
                    "experts": 8,
                    "top_k": 3,
                    "expert_ffn": 16,
                },
            ),
            *llm_entries(_entry),
            _entry(
                "wide-deep",
                "transformer.wide_deep",
                "Wide&Deep (26 sparse fields, deep 1024-512-256)",
                None,
                {"batch": 16, "fields": 3, "vocab": 64, "embed": 8, "deep": (32, 16)},
            ),
        )
    }
)


def build(name: str, small: bool = False, **overrides: Any) -> Graph:
    """Build zoo model `name`; `small=True` starts from the reduced sizes used in tests.

    Unknown keyword arguments raise ArgumentError naming the accepted ones, as do sizes that are
    not whole numbers >= 1 (`checks.model_sizes`); `None` values are ignored.
    """
    entry = MODELS.get(name)
    if entry is None:
        hint = checks.did_you_mean(name, list(MODELS), "`shardplan models` lists them all")
        raise UnknownModelError(f"no zoo model {name!r}{hint}")
    kwargs = {**entry.defaults, **(entry.small if small else {})}
    kwargs.update({k: v for k, v in overrides.items() if v is not None})
    parameters = inspect.signature(entry.builder).parameters
    unknown = sorted(set(kwargs) - set(parameters))
    if unknown:
        raise ArgumentError(
            f"model {name!r} does not take {unknown}; it takes {sorted(parameters)}"
        )
    defaults = {k: p.default for k, p in parameters.items()}
    kwargs = checks.model_sizes(name, kwargs, defaults)
    kwargs.setdefault("name", name)
    return entry.builder(**kwargs)


__all__ = ["MODELS", "ModelEntry", "build"]
