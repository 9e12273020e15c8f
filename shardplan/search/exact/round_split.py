"""Round-by-round form of an edge's redistribution cost, for the ILP on meshes with many rounds.

`round_features` lists, per round r, which other rounds change r's collective volume (mirroring
`cost.terms.edge_sizes`); `RoundSplit` stores the per-round price tables and evaluates them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardplan.cost.terms import faster
from shardplan.mesh import Round

BSPLIT = 1
"""Feature of round j in round r's volume: producer and consumer are both split in round j."""
NOT_BOTH_REPLICATED = 2
"""Feature of round j in round r's volume: producer and consumer are not both replicated in j."""
ASPLIT = 3
"""Feature of round j in round r's volume: split on both sides along different dims (an
all-to-all round: with an all-to-all in r too, both belong to one all-to-all)."""


def round_features(
    rounds: Sequence[Round], all_to_all: Sequence[bool] | None = None
) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Per round r, the other rounds j whose layouts change round r's redistribution volume, and
    how (mirrors `terms.edge_sizes`: a round split on both sides always shrinks the volume; a
    faster round shrinks it unless both sides replicate; when round r can be an all-to-all
    (`all_to_all[r]`, default True), a slower all-to-all round shrinks it once more)."""
    out = []
    for r, rnd in enumerate(rounds):
        feats = []
        for j, other in enumerate(rounds):
            if j == r:
                continue
            if faster(other, rnd):
                feats.append((j, NOT_BOTH_REPLICATED))
            else:
                feats.append((j, BSPLIT))
                if all_to_all is None or all_to_all[r]:
                    feats.append((j, ASPLIT))
        out.append(tuple(feats))
    return tuple(out)


def can_move_split(src: np.ndarray, dst: np.ndarray) -> bool:
    """Do these values of one round hold a split -> other split pair (an all-to-all)?"""
    a, b = set(src[src >= 0].tolist()), set(dst[dst >= 0].tolist())
    return bool(a and b) and not (len(a) == 1 and a == b)


def feature_on(kind: int, a: int, b: int) -> bool:
    """Does a round with layouts a -> b show feature `kind`?"""
    if kind == BSPLIT:
        return a >= 0 and b >= 0
    if kind == ASPLIT:
        return a >= 0 and b >= 0 and a != b
    return not (a < 0 and b < 0)


@dataclass(frozen=True, slots=True)
class RoundSplit:
    """An edge's redistribution cost split by rounds (used by the ILP on meshes with many rounds):

        C[s, t] = sum_r [a_r != b_r] values[r][i(a_r), k(b_r), f_r]

    where a = src[s], b = dst[t] are per-round layout values, i / k index `src_values[r]` /
    `dst_values[r]`, and f_r packs one bit per feature (j, kind) of `features[r]` (bit i of f_r is
    feature i): BSPLIT -> a_j >= 0 and b_j >= 0; ASPLIT -> a_j >= 0, b_j >= 0 and a_j != b_j;
    NOT_BOTH_REPLICATED -> not (a_j and b_j replicated). Each value is priced by the evaluator's
    `edge_terms` on a representative pair (its round-r piece only).
    """

    src: np.ndarray
    dst: np.ndarray
    features: tuple[tuple[tuple[int, int], ...], ...]
    src_values: tuple[np.ndarray, ...]
    dst_values: tuple[np.ndarray, ...]
    values: tuple[np.ndarray, ...]

    def columns(self) -> int:
        """Variables of the ILP's round-split formulation (per-round pairs + featured cells)."""
        n = 0
        for r, v in enumerate(self.values):
            n += len(self.src_values[r]) * len(self.dst_values[r])
            n += int((v != 0).any(axis=2).sum()) * v.shape[2]
        return n

    def dense(self) -> np.ndarray:
        """C over every (src row, dst row) pair, vectorised."""
        src, dst = self.src, self.dst
        out = np.zeros((len(src), len(dst)))
        for r, feats in enumerate(self.features):
            f = np.zeros(out.shape, dtype=np.int64)
            for bit, (j, kind) in enumerate(feats):
                if kind == BSPLIT:
                    on = (src[:, j] >= 0)[:, None] & (dst[:, j] >= 0)[None, :]
                elif kind == ASPLIT:
                    on = (src[:, j] >= 0)[:, None] & (dst[:, j] >= 0)[None, :]
                    on &= src[:, j][:, None] != dst[:, j][None, :]
                else:
                    on = ~((src[:, j] < 0)[:, None] & (dst[:, j] < 0)[None, :])
                f |= on.astype(np.int64) << bit
            i = np.searchsorted(self.src_values[r], src[:, r])[:, None]
            k = np.searchsorted(self.dst_values[r], dst[:, r])[None, :]
            moved = src[:, r][:, None] != dst[:, r][None, :]
            out += np.where(moved, self.values[r][i, k, f], 0.0)
        return out

    def value(self, a: Sequence[int], b: Sequence[int]) -> float:
        total = 0.0
        for r, feats in enumerate(self.features):
            if a[r] == b[r]:
                continue
            f = 0
            for bit, (j, kind) in enumerate(feats):
                f |= int(feature_on(kind, a[j], b[j])) << bit
            i = int(np.searchsorted(self.src_values[r], a[r]))
            k = int(np.searchsorted(self.dst_values[r], b[r]))
            total += float(self.values[r][i, k, f])
        return total
