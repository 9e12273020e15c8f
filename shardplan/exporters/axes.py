"""Per-round layouts collapsed onto the mesh's own axes, when the rounds of each axis agree.

A plan cuts once per prime ROUND; a mesh axis of size 4 has two rounds. A tensor's placement can
be written over the axis itself (a DTensor mesh dim or a JAX mesh axis named by the user) exactly
when every round of the axis does the same thing to it: splits the same tensor dim, or
replicates, or leaves the same partial sum. Rounds of one axis are contiguous, so splitting dim
j in both rounds of an axis of 4 is the axis splitting j four ways (block index c0 * 2 + c1 = the
axis coordinate, row-major). Everything here is pure and O(rounds) per tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from shardplan.mesh import Mesh

T = TypeVar("T")


def collapse(per_round: Sequence[T], mesh: Mesh, fill: T) -> tuple[T, ...] | None:
    """Per mesh axis: the one entry all its rounds share (`fill` for an axis of size 1), or None
    when two rounds of one axis differ (then only a round-shaped mesh can express it)."""
    rounds = mesh.rounds
    if len(per_round) != len(rounds):
        raise ValueError(f"{len(per_round)} entries for {len(rounds)} rounds of {mesh.text()}")
    out: list[T] = []
    for axis in range(len(mesh.shape)):
        entries = {per_round[r.index] for r in rounds if r.mesh_axis == axis}
        if len(entries) > 1:
            return None
        out.append(entries.pop() if entries else fill)
    return tuple(out)


def collapse_texts(per_round: Sequence[str], mesh: Mesh) -> tuple[str, ...] | None:
    """Placement strings (`S(0)`, `R`, `P`) per round -> per mesh axis, or None."""
    return collapse(tuple(per_round), mesh, "R")


__all__ = ["collapse", "collapse_texts"]
