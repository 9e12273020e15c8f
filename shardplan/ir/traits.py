"""Op-kind traits: what engines, verification and cost may need to know about a kind beyond its
signature, declared once here as data so that no other layer branches on op-kind names.

The signature (`ir/catalogue.py`) says how an op's loop dims index its tensors; a few facts it does
not carry are listed per kind in `KIND_TRAITS`:

- `SCALE_OPERAND`: operand 1 is a multiplicative scale (gamma); engines initialise it to ones.
- `NORMALISES`: the op computes statistics (mean, variance, max, sum of exponentials) over an
  axis; when that axis arrives split, XLA all-reduces the per-row statistics.
- `STATISTICS_OVER_PARALLEL`: the statistics run over PARALLEL loop dims (batch norm: over batch
  and space, per channel): cutting one of them needs an all-reduce of the statistics that the
  signature cannot express; `KindTraits.statistics_kept` names the operand-0 tensor dim the
  statistics are kept per (the channel).
- `INDEX_INPUT`: an operand holds integer indices (ids, labels) into an extent of another operand;
  `KindTraits.index` says which (engines draw values in range; a cut of the indexed extent turns
  the lookup into a masked one).
- `GLOBAL_SHAPE_ATTR`: the `shape` attribute is the global result shape (a device computing a
  block needs its local shape).
- `OPAQUE`: an operator the importers could not translate (every loop dim FROZEN).
- `KINK`: the derivative jumps at 0 (rounding noise can flip a gradient by a finite amount).
- `PASSES_GRADIENT`: the backward hands the result's gradient to each input of the result's size
  unchanged, with no kernel (PyTorch's tools/autograd/derivatives.yaml: `add` and `bias_add`'s
  `self: grad`; views); a smaller (broadcast) input's gradient is a reduction of it.

`KindTraits.backward_recompute` is the fraction of its forward FLOPs an op's backward runs again
on top of the usual gradient GEMMs: fused attention recomputes its scores q k^T, one of the
forward's two GEMMs (FlashAttention-2, Dao 2023, section 3.1.2: the backward's five GEMMs against
the forward's two, 2.5x; half the forward when d = e, as in every zoo model but MLA's d = 1.5 e).

Lookups are O(1); the table is immutable.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType


class Trait(Enum):
    SCALE_OPERAND = "scale-operand"
    NORMALISES = "normalises"
    STATISTICS_OVER_PARALLEL = "statistics-over-parallel"
    INDEX_INPUT = "index-input"
    GLOBAL_SHAPE_ATTR = "global-shape-attr"
    OPAQUE = "opaque"
    KINK = "kink"
    PASSES_GRADIENT = "passes-gradient"


@dataclass(frozen=True, slots=True)
class IndexInput:
    """Operand `position` holds integer indices into dim `bound_dim` of operand `bound_operand`."""

    position: int
    bound_operand: int
    bound_dim: int


@dataclass(frozen=True, slots=True)
class KindTraits:
    traits: frozenset[Trait] = frozenset()
    index: IndexInput | None = None
    statistics_kept: int | None = None
    backward_recompute: float = 0.0

    def __contains__(self, trait: Trait) -> bool:
        return trait in self.traits


OPAQUE_KIND = "opaque"
"""The kind importers give operators they cannot translate (`unknown="replicate"`)."""


def _t(*traits: Trait, index: IndexInput | None = None, kept: int | None = None) -> KindTraits:
    return KindTraits(frozenset(traits), index, kept)


_NORM = (Trait.SCALE_OPERAND, Trait.NORMALISES)

KIND_TRAITS: Mapping[str, KindTraits] = MappingProxyType(
    {
        "layer_norm": _t(*_NORM),
        "rms_norm": _t(*_NORM),
        "batch_norm": _t(*_NORM, Trait.STATISTICS_OVER_PARALLEL, kept=1),
        "softmax": _t(Trait.NORMALISES),
        "cross_entropy": _t(Trait.NORMALISES, Trait.INDEX_INPUT, index=IndexInput(1, 0, -1)),
        "embedding": _t(Trait.INDEX_INPUT, index=IndexInput(1, 0, 0)),
        "reshape": _t(Trait.GLOBAL_SHAPE_ATTR, Trait.PASSES_GRADIENT),
        "relu": _t(Trait.KINK),
        **{k: _t(Trait.PASSES_GRADIENT) for k in ("add", "bias_add", "identity", "transpose")},
        OPAQUE_KIND: _t(Trait.OPAQUE),
        "attention": KindTraits(backward_recompute=0.5),
    }
)
"""Kind -> its traits; kinds not listed have none."""

_NONE = KindTraits()


class Saved(Enum):
    """What an op's backward reads, so what autograd keeps from its forward (PyTorch's
    tools/autograd/derivatives.yaml: e.g. `mm` saves self and mat2, `gelu` self, `_softmax` and
    `exp` result, `add` nothing, `native_dropout` its boolean mask)."""

    INPUTS = "inputs"
    OUTPUTS = "outputs"
    NOTHING = "nothing"
    MASK = "mask"  # one byte per element of the result


SAVED_FOR_BACKWARD: Mapping[str, Saved] = MappingProxyType(
    {
        **{k: Saved.NOTHING for k in ("add", "sub", "bias_add", "neg", "cast", "identity")},
        **{k: Saved.NOTHING for k in ("scale", "reshape", "transpose", "concat")},
        **{k: Saved.NOTHING for k in ("reduce_sum", "reduce_mean")},
        **{k: Saved.OUTPUTS for k in ("softmax", "exp", "tanh", "sigmoid", "relu", "sqrt")},
        "rsqrt": Saved.OUTPUTS,
        "dropout": Saved.MASK,
    }
)
"""Kind -> what its backward keeps; kinds not listed keep their non-parameter inputs (matmuls,
norms, gelu/silu, mul/div, convolutions, embeddings' ids, cross-entropy's logits, MoE ops)."""


def saved_for_backward(kind: str) -> Saved:
    return SAVED_FOR_BACKWARD.get(kind, Saved.INPUTS)


def traits_of(kind: str) -> KindTraits:
    """The traits of op kind `kind` (empty for kinds without any)."""
    return KIND_TRAITS.get(kind, _NONE)


def has_trait(kind: str, trait: Trait) -> bool:
    return trait in traits_of(kind).traits


def backward_recompute(kind: str) -> float:
    """Fraction of an op's forward FLOPs its backward recomputes (module docstring)."""
    return traits_of(kind).backward_recompute


__all__ = [
    "KIND_TRAITS",
    "OPAQUE_KIND",
    "SAVED_FOR_BACKWARD",
    "IndexInput",
    "backward_recompute",
    "KindTraits",
    "Saved",
    "Trait",
    "has_trait",
    "saved_for_backward",
    "traits_of",
]
