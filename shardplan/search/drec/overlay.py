"""Which inputs' gradients another reader already all-reduces in a round: D-Rec's charges.

Readers of one tensor that cut it alike share its gradient all-reduce (the evaluator's share
credit); the greedy pass keeps, per round, the (tensor, round) pairs some decided reader pays,
and prices a trial cut against them through an `Overlay`, O(1) per look-up and per added key.
"""

from __future__ import annotations


class Overlay:
    """A set of (tensor, round) charges seen through: `base` plus a few keys added on top, so a
    trial does not copy the round's whole set (which would make the greedy quadratic)."""

    __slots__ = ("base", "extra")

    def __init__(self, base: set[tuple[str, int]]) -> None:
        self.base, self.extra = base, set()

    def __contains__(self, key: object) -> bool:
        return key in self.base or key in self.extra

    def __bool__(self) -> bool:
        return bool(self.base) or bool(self.extra)

    def add(self, key: tuple[str, int]) -> None:
        self.extra.add(key)


Charges = set[tuple[str, int]] | frozenset[tuple[str, int]] | Overlay
"""Which inputs' gradients another reader already all-reduces in this round."""
