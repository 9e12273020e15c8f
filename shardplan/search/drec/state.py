"""D-Rec's per-search state: each op's (`OpState`) and the edge contexts and prices the variants
of one call share (`EdgeBook`), with the relation codes contexts are made of.

`relation` codes how an edge's two layouts relate in one round (same split, both replicated,
all-to-all, gather, slice); a context is the tuple of an edge's codes over the rounds done, and
its marginal price depends on the layouts only through them (`ledger.RoundLedger._marginal`).
All O(1) per call but `trials`, O(cuts).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from shardplan.ir.graph import Graph
from shardplan.ir.op import Op
from shardplan.search.drec.flex import FlexEdge
from shardplan.sharding import REPLICATED

EXAMPLE = ((0, 0), (REPLICATED, REPLICATED), (0, 1), (0, REPLICATED), (REPLICATED, 0))
"""A (src, dst) pair of each `relation` (an edge's price depends on its layouts only so)."""


def relation(src: int, dst: int) -> int:
    """How an edge's two layouts relate in one round: 0 the same split, 1 both replicated,
    2 split -> other split (all-to-all), 3 split -> replicated, 4 replicated -> split."""
    if src == dst:
        return 0 if src >= 0 else 1
    if src >= 0:
        return 2 if dst >= 0 else 3
    return 4


def trials(decided: dict[int, str | None], i: int, cuts: list[str | None]) -> Iterator[str | None]:
    """Each cut of op i, set in `decided` while the caller prices it; `decided` is restored."""
    had, old = i in decided, decided.get(i)
    try:
        for cut in cuts:
            decided[i] = cut
            yield cut
    finally:
        if had:
            decided[i] = old
        else:
            decided.pop(i, None)


@dataclass(slots=True)
class OpState:
    """Mutable per-search state of one op (local to one `drec` call)."""

    op: Op
    extents: dict[str, int]
    in_numel: list[float]
    out_numel: list[float]
    cuts: list[str | None] = field(default_factory=list)
    preds: list[FlexEdge] = field(default_factory=list)
    succs: list[FlexEdge] = field(default_factory=list)
    siblings: list[tuple[int, int, int, dict[int, int], int]] = field(default_factory=list)
    """(other heavy op, my output position, its output position, my dim -> its dim, the
    transparent op reading my output on the way)."""
    ar_history: dict[tuple[bool, int], list[tuple[int, float, int]]] = field(default_factory=dict)
    """(is_output, position) -> [(round, all-reduce cost charged then, bit mask of the later
    rounds that price assumed would shrink the operand first)]."""
    credits: dict[int, list[tuple[int, float, int]]] = field(default_factory=dict)
    """Input position -> [(round, all-reduce cost the previous reader paid for it then, mask)]: owed
    back if the two readers' layouts part in a later round (`RoundCosts._revoked`)."""
    kind: object = ()
    """(label, cuts so far): ops of one kind have the same prices (set by the search, which
    numbers them: `EdgeBook.kind_id`)."""

    @staticmethod
    def of(graph: Graph, op: Op, label: int) -> OpState:
        """Op's state before the first round (`label`: its `fold.op_labels` label)."""
        return OpState(
            op,
            op.signature.extents,
            [float(graph.tensors[t].numel) for t in op.inputs],
            [float(graph.tensors[t].numel) for t in op.outputs],
            kind=(label,),
        )


class EdgeBook:
    """Edge contexts and their prices, shared by the searches of one `drec` call (one graph,
    mesh and set of options): a context id stands for its codes (per round done, `relation`)
    in every search, and an edge's marginal price is a pure function of (layouts, context,
    tensor), the context holding the round — so a variant that reaches the rounds another did
    reads their prices instead of pricing them again. No edge price depends on how a variant
    prices cuts."""

    __slots__ = (
        "ctx_ids",
        "ctxs",
        "ctx_moves",
        "ctx_next",
        "edge_cache",
        "edge_kinds",
        "forms",
        "form_of",
        "form_ids",
        "prev_price",
        "chain",
        "chain_ids",
        "chain_of",
        "kinds",
        "near",
        "infos",
    )

    def __init__(self) -> None:
        self.ctx_ids: dict[tuple[int, ...], int] = {}
        self.ctxs: list[tuple[int, ...]] = []
        self.ctx_moves: list[bool] = []
        """Per context: whether a layout moved in some round (else an unchanged edge is free)."""
        self.ctx_next: dict[tuple[int, int], int] = {}
        """(context, the next round's relation) -> the extended context."""
        self.edge_cache: dict[tuple[int, int, int, int], float] = {}
        """(src, dst, context, tensor form) -> the edge's marginal price (`RoundLedger._edge`)."""
        self.edge_kinds: dict[tuple[object, ...], float] = {}
        """(relation, context, size, width, gradient, ahead) -> the same, per relation."""
        self.forms: list[tuple[float, int, bool, tuple[int, ...]]] = []
        """Per tensor form number: (size, width, gradient, ahead) (`RoundLedger._form`)."""
        self.form_ids: dict[tuple[float, int, bool, tuple[int, ...]], int] = {}
        self.form_of: dict[str, int] = {}
        """Tensor -> its form's number (one graph per book)."""
        self.prev_price: dict[tuple[object, ...], float] = {}
        """(context, tensor form) -> its price over the rounds before (`_marginal`)."""
        self.chain: dict[tuple[int, int, int, int], float] = {}
        """(a flex edge's pricing number, layouts, context) -> its price through its chain
        (`RoundCosts._chain_price`)."""
        self.chain_ids: dict[tuple[object, ...], int] = {}
        """(a flex edge's dim map, into its consumer?, tensor form) -> its pricing number."""
        self.chain_of: dict[tuple[int, bool], int] = {}
        """(id of a flex edge, into its consumer?) -> the same (the flex graph outlives the
        book)."""
        self.near: dict[tuple[object, ...], list[float]] = {}
        """(op label, operand, neighbour's layout, direction, context, tensor form, the op's
        valid cuts) -> the edge's price under each cut (`RoundCosts._edge_prices`)."""
        self.infos: dict[tuple[object, ...], Any] = {}
        """(all-reduces priced hopefully?, round, op kind) -> the op's operand infos then
        (`RoundLedger._infos`: a function of them, so every search reads one copy)."""
        self.kinds: dict[tuple[object, ...], int] = {}
        """(label,) or (a kind's number, a round's cut) -> the number of the op kind it makes
        (`kind_id`): searches that price alike share prices by these numbers."""

    def kind_id(self, kind: tuple[object, ...]) -> int:
        """The number of an op kind, (label,) or (the previous kind's number, the round's cut):
        equal for ops (of any search sharing the book) with one label and one history."""
        found = self.kinds.get(kind)
        if found is None:
            found = self.kinds[kind] = len(self.kinds)
        return found
