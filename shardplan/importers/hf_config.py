"""Any Hugging Face `config.json` planned without its weights.

`from_hf(config, batch=, seq=)` and `hf_builder(config, seq=)` read a config (a folder holding
config.json, the file, a dict, or a `transformers.PretrainedConfig`), instantiate its
architecture (`architectures[0]`, else the AutoModel of its `model_type`) on torch's meta device
— parameters have shapes and no storage, so a 70B model takes no memory and no initialisation
time — and import it with torch.export (which traces with fake tensors) and `import_torch`.
Causal LMs are traced without `labels` (the graph ends at the logits, as for a named
architecture): the label shift pads with the ignore index -100, which the engines' cross-entropy
does not skip, so `verify` could not check such a graph. The module is built
once per builder; each batch size is one export + translation, O(|nodes|), except that once two
sizes over 1 are traced, the others are derived from them when the two determine the graph
(`shardplan.importers.rebatch`: every number constant or proportional to the batch, each op
re-derived through the catalogue), O(ops).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from shardplan.errors import ArgumentError, UnknownModelError
from shardplan.importers._build import ImportResult
from shardplan.ir.graph import Graph
from shardplan.lazy import require


def _frameworks() -> tuple[Any, Any]:
    torch = require("torch", extra="torch", user="--hf and from_hf")
    return torch, require("transformers", extra="torch", user="--hf and from_hf")


def config_path(name: str) -> Path | None:
    """`name` as a local config.json (or a folder holding one), else None."""
    path = Path(name)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise UnknownModelError(f"--hf {name!r}: the folder has no config.json")
        return path
    if path.suffix == ".json":
        if not path.is_file():
            raise UnknownModelError(f"--hf {name!r}: no such file")
        return path
    return None


def load_config(
    config: Any,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
) -> tuple[Any, str, str | None]:
    """(transformers config, label, architecture class name) of a path, dict or config object;
    `layers`/`hidden`/`heads` override the standard keys (hidden also sets intermediate 4x, heads
    the K/V heads to their gcd with it, both a head_dim that was hidden // heads)."""
    _, transformers = _frameworks()
    if isinstance(config, transformers.PretrainedConfig):
        arch = (getattr(config, "architectures", None) or [None])[0]
        cfg, label = config.__class__.from_dict(config.to_dict()), config.model_type
    else:
        if isinstance(config, (str, Path)):
            path = config_path(str(config))
            if path is None:
                raise UnknownModelError(
                    f"from_hf({config!r}): give a folder holding config.json or the file itself"
                )
            label = path.parent.name if path.name == "config.json" else path.stem
            try:
                data = json.loads(path.read_text())
            except ValueError as e:
                raise UnknownModelError(f"--hf {str(config)!r}: {path} is not JSON: {e}") from e
        elif isinstance(config, Mapping):
            data, label = dict(config), str(config.get("model_type", "hf"))
        else:
            raise ArgumentError(
                f"from_hf: config must be a path, a dict or a transformers config, "
                f"not {type(config).__name__}"
            )
        data = dict(data)
        model_type = data.pop("model_type", None)
        if model_type is None:
            raise UnknownModelError(
                f"--hf {label!r}: not a Hugging Face config (it has no 'model_type')"
            )
        try:
            cfg = transformers.AutoConfig.for_model(model_type, **data)
        except ValueError as e:
            raise UnknownModelError(
                f"--hf {label!r}: transformers does not know model_type {model_type!r}"
            ) from e
        arch = (data.get("architectures") or [None])[0]
    derived_head_dim = _head_dim(cfg)
    for value, key in (
        (layers, "num_hidden_layers"),
        (hidden, "hidden_size"),
        (heads, "num_attention_heads"),
    ):
        if value is not None:
            setattr(cfg, key, value)
    kv = getattr(cfg, "num_key_value_heads", None)
    if heads is not None and isinstance(kv, int) and heads % kv:
        cfg.num_key_value_heads = math.gcd(kv, heads)  # K/V heads must divide the query heads
    resized = hidden is not None or heads is not None
    same = derived_head_dim is not None and derived_head_dim == getattr(cfg, "head_dim", None)
    if resized and same:
        try:
            cfg.head_dim = _head_dim(cfg)  # hidden // heads unless the config set it apart (Qwen3)
        except AttributeError:
            pass  # a read-only head_dim (Falcon's property) follows hidden and heads already
    if hidden is not None and hasattr(cfg, "intermediate_size"):
        cfg.intermediate_size = 4 * hidden
    cfg.use_cache = False
    return cfg, label, arch


def _head_dim(cfg: Any) -> int | None:
    hidden, heads = getattr(cfg, "hidden_size", None), getattr(cfg, "num_attention_heads", None)
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None


def meta_module(cfg: Any, arch: str | None) -> Any:
    """The architecture instantiated on the meta device (shapes only), eager attention."""
    torch, transformers = _frameworks()
    model_cls = getattr(transformers, arch, None) if arch else None
    with torch.device("meta"):
        if model_cls is None:
            model = transformers.AutoModel.from_config(cfg, attn_implementation="eager")
        else:
            model = model_cls._from_config(cfg, attn_implementation="eager")
    return model.eval()


def example_inputs(
    model: Any, cfg: Any, batch: int, seq: int, image: int | None, labels: bool = False
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Meta-device inputs of the forward pass at this batch (`labels`: also the labels of a
    causal LM, so its loss is traced)."""
    torch, _ = _frameworks()
    meta = torch.device("meta")
    if hasattr(cfg, "image_size") and hasattr(cfg, "num_channels"):
        size = image or int(cfg.image_size)
        return (torch.empty(batch, int(cfg.num_channels), size, size, device=meta),), {}
    ids = torch.zeros((batch, seq), dtype=torch.long, device=meta)
    if hasattr(cfg, "num_mel_bins") and hasattr(cfg, "max_source_positions"):
        # speech (Whisper): log-mel frames, twice the encoder positions (its conv stride is 2)
        frames = 2 * int(cfg.max_source_positions)
        features = torch.empty(batch, int(cfg.num_mel_bins), frames, device=meta)
        return (), {"input_features": features, "decoder_input_ids": ids}
    if getattr(cfg, "is_encoder_decoder", False):
        return (), {"input_ids": ids, "decoder_input_ids": ids}
    if type(model).__name__.endswith("ForCausalLM"):
        return (ids,), {"labels": ids, "use_cache": False} if labels else {"use_cache": False}
    return (ids,), {}


def hf_importer(
    config: Any,
    seq: int = 128,
    image: int | None = None,
    layers: int | None = None,
    hidden: int | None = None,
    heads: int | None = None,
    unknown: str = "error",
    retrace: bool = False,
) -> Callable[[int], ImportResult]:
    """batch -> ImportResult of `config` at that batch. The module is built once; the first two
    batch sizes over 1 are traced and kept, later ones are derived from them when they determine
    the graph (`rebatch`, else traced too; `retrace=True` traces every size)."""
    torch, _ = _frameworks()
    from shardplan.checks import positive_int
    from shardplan.importers.rebatch import rebatch
    from shardplan.importers.torch import import_torch

    seq = positive_int(seq, "seq")
    cfg, label, arch = load_config(config, layers, hidden, heads)
    model = meta_module(cfg, arch)
    traced: list[tuple[int, ImportResult]] = []  # (batch, import) of the first two traces

    def build(batch: int) -> ImportResult:
        batch = positive_int(batch, "batch")
        known = dict(traced)
        if batch in known:
            return known[batch]
        # torch.export specialises size-1 dims, so batch 1 is always traced
        if len(traced) == 2 and batch > 1 and not retrace:
            derived = rebatch(traced[0], traced[1], batch)
            if derived is not None:
                return derived
        args, kwargs = example_inputs(model, cfg, batch, seq, image)
        with torch.no_grad():
            result = import_torch(model, args, kwargs or None, unknown=unknown, name=label)  # type: ignore[arg-type]
        if batch > 1 and len(traced) < 2:
            traced.append((batch, result))
        return result

    return build


def hf_builder(config: Any, seq: int = 128, **options: Any) -> Callable[[int], Graph]:
    """batch -> Graph of `config` (weights never materialised): the builder the training-step
    planner takes (it rebuilds the model at each micro-batch size)."""
    importer = hf_importer(config, seq, **options)
    return lambda batch: importer(batch).graph


def from_hf(config: Any, batch: int = 8, seq: int = 128, **options: Any) -> Graph:
    """The graph of a Hugging Face config at (batch, seq), built on the meta device (module
    docstring). `options`: image, layers, hidden, heads, unknown ("error" or "replicate")."""
    return hf_importer(config, seq, **options)(batch).graph
