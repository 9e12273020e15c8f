"""Causes of differences between measured and predicted collectives for
`shardplan.fidelity.verify`: the documented `CAUSES`, the tolerance constants, `Difference`
and the `_Delta` bookkeeping the explainer rules use.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

TOLERANCE = 0.10
"""Measured and predicted bytes of one kind (or one operator) agree within +-10%."""
MIN_BYTES = 64.0
"""Per-operator differences below this many bytes per device are not listed (scalars)."""


UNEXPLAINED = "unexplained"


# -- causes of differences -----------------------------------------------------------------------

CAUSES: Mapping[str, str] = {
    "norm-statistics": (
        "XLA computes a normalisation (layer/RMS norm, softmax, cross-entropy, batch norm) with "
        "its normalised axis - for batch norm, the batch - split and all-reduces per-row "
        "statistics (max, sum, mean, variance) or gathers the norm's small parameter gradients; "
        "the cost model charges nothing for them (batch norm: unmodelled by design)"
    ),
    "split-normalised-axis": (
        "the plan all-gathers the input of a softmax/norm/cross-entropy that arrives split on "
        "its FROZEN axis; XLA computes it split instead (statistics all-reduced), so the "
        "predicted all-gather does not happen"
    ),
    "shared-gradient": (
        "a tensor read by several operators in the same layout (tied embedding, q/k/v reading "
        "one activation): the model sums the gradient contributions locally and all-reduces "
        "once; XLA all-reduces every contribution (one tuple all-reduce, same bytes)"
    ),
    "gradient-in-steps": (
        "a gradient reduced toward a parameter stored split (FSDP/ZeRO) is all-reduced in "
        "several steps over sub-groups, each of the full buffer (the CPU backend has no "
        "reduce-scatter: all-reduce + dynamic-slice): sum 2(g_i-1)/g_i B instead of the ring "
        "2(G-1)/G B"
    ),
    "weight-regather": (
        "in the backward pass XLA all-gathers (part of) a parameter again - FSDP does not keep "
        "the gathered weight, or XLA prefers gathering the weight to reducing an activation "
        "gradient - which the model does not charge"
    ),
    "sharded-parameter-compute": (
        "XLA computes an operator on a parameter stored split (FSDP/ZeRO) without gathering it "
        "(e.g. a masked lookup on a sharded embedding table whose result is all-reduced), "
        "instead of the all-gather of the parameter the model charges"
    ),
    "round-order": (
        "adding a split of a tensor dim in an earlier round to a split in a later round is not "
        "a local slice (a PartitionSpec orders a dim's mesh axes outermost first): XLA moves "
        "blocks with a collective-permute where the model charges nothing (forward) or an "
        "all-gather (backward)"
    ),
    "input-resharding": (
        "a graph input or constant (token ids, a routing mask) is read by an operator in "
        "another layout than it was placed in; the model assumes inputs arrive where each "
        "consumer reads them"
    ),
    "all-gather-for-all-to-all": (
        "XLA implements a split-to-split redistribution, modelled as an all-to-all, with an "
        "all-gather and a dynamic-slice (or replicates the tensor: 'involuntary full "
        "rematerialization')"
    ),
    "merged-partial-sums": (
        "XLA adds partial sums of several operators before one all-reduce (two vocab-parallel "
        "embeddings feeding an add), or adds a split gradient into another reader's partial "
        "gradient before its all-reduce, where the model reduces each / gathers the split one"
    ),
    "contract-split-input": (
        "an input arrives split on a dim the operator contracts; the plan all-gathers it, XLA "
        "contracts the local parts and all-reduces the partial result (more bytes when the "
        "result is larger than the input)"
    ),
    "partial-gradient-slice": (
        "a gradient all-reduce followed by a slice to the producer's split layout: XLA "
        "all-reduces only the slice the producer keeps, the model the whole local gradient"
    ),
    "xla-partitioning": (
        "XLA's SPMD partitioner implements the operator's cut with other collectives than the "
        "plan's (only the layouts of the operator's inputs and output are constrained, not its "
        "inside): e.g. a conv/matmul cut along two loop dims, or it gathers an input and "
        "computes redundantly instead of reducing a partial result"
    ),
    "xla-replicated-compute": (
        "XLA all-gathers an activation the plan keeps split and computes the operator on the "
        "whole tensor (its per-device result in the compiled HLO has the global shape), so the "
        "partial sums, gradient all-reduces and redistributions the plan implies vanish, and "
        "the all-gather of its input appears (a top-k XLA does not split along the batch)"
    ),
    "moved-to-neighbour": (
        "the same collective is attributed by the HLO metadata to a neighbouring operator "
        "(a redistribution placed at the producer, a gradient gather at the previous "
        "operator's sharding constraint); not a volume difference"
    ),
    "gradient-gather-volume": (
        "cost-model bug: the backward gradient all-gather of a replicated -> split edge that "
        "slices in several rounds is charged (q-1)/q of the consumer's shrinking local size per "
        "round (3L/8 for 2x2x2) instead of a ring all-gather of the whole gradient (7L/8); XLA "
        "gathers the whole gradient"
    ),
    "shared-parameter-gather": (
        "a parameter stored split (FSDP/ZeRO) and read whole by several operators in the same "
        "layout (GPT-2's tied embedding: the lookup and the LM head) is gathered once and the "
        "gathered copy reused; the model charges the gather at every reader"
    ),
    "outside-graph": (
        "collectives whose metadata names no operator of the graph: the scalar objective the "
        "backend adds (sum of the outputs) or XLA-internal code"
    ),
}
"""Known causes of measured != predicted, each a documented model limitation
(docs/verification.md explains each with an HLO excerpt)."""


@dataclass(frozen=True, slots=True)
class Difference:
    """One operator and collective kind where measured and predicted bytes disagree > 10%.

    `op` is "" for collectives the metadata does not attribute to an operator. `causes` are
    keys of CAUSES, or contain "unexplained" when rules could not account for
    `unexplained_bytes` of the difference.
    """

    op: str
    kind: str
    predicted: float
    measured: float
    causes: tuple[str, ...]
    detail: str = ""
    unexplained_bytes: float = 0.0

    @property
    def explained(self) -> bool:
        return UNEXPLAINED not in self.causes


@dataclass
class _Delta:
    op: str
    kind: str
    predicted: float
    measured: float
    remaining: float
    causes: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)

    @property
    def sign(self) -> int:
        return 1 if self.measured > self.predicted else -1

    def take(self, amount: float, cause: str, detail: str = "") -> float:
        amount = min(max(amount, 0.0), self.remaining)
        if amount <= 0:
            return 0.0
        self.remaining -= amount
        if cause not in self.causes:
            self.causes.append(cause)
        if detail:
            self.details.append(detail)
        return amount

    def done(self) -> bool:
        return self.remaining <= max(TOLERANCE * max(self.predicted, self.measured), MIN_BYTES)


def _significant(p: float, m: float) -> bool:
    return abs(m - p) > max(TOLERANCE * max(p, m), MIN_BYTES)
