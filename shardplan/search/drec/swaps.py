"""Round swaps: when every cut plan of D-Rec's variants loses to keeping everything whole.

Two consecutive rounds of one mesh axis that split it the same number of ways run over the same
links: a plan and the plan with those two rounds' cuts exchanged lay every op out over the same
devices in the same shapes (the evaluator's hierarchical pricing, which reads the rounds in
order, differs slightly). D-Rec decides the rounds in order, and the first round's greedy choice
fixes which ops the polish can then move: Llama (3 layers, batch 36) on 4x3, where every link
is 25 GB/s, had its best cut plan split the batch in round 0 and the hidden units in round 1
(1.130 of the ILP optimum; the all-replicated plan, 1.090, won). With the two rounds exchanged
the polish's pair and run moves reach 1.034: the first layer's attention then takes the batch in
every round.

So when the all-replicated plan beats every variant's (D-Rec found no parallelism worth its
collectives), the two best cut plans are tried with each such pair of rounds exchanged,
polished with pair and run moves (`polish.polish(pairs=True)`), and kept when they score lower;
in a search with pinned ops too, those kept as pinned (GPT-2 medium, 3 layers, batch 18, on
18: with its tied readers pinned whole, `tiedwhole.py`, the best cut plan — tensor parallel
over the round of 2, the batch over the rounds of 3 — scored just above replication, and its
swap reaches the ILP optimum once polished: 1.098 -> 1.000). Not run otherwise: a plan that
cuts already wins, and each try costs a polish. O(2 x rounds) polishes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from shardplan.mesh import Mesh
from shardplan.sharding import Strategy

Plan = dict[str, Strategy]


def swapped_rounds(mesh: Mesh, plan: Mapping[str, Strategy]) -> Iterator[Plan]:
    """`plan` with rounds r and r + 1 exchanged, for each such pair on one mesh axis with the same
    number of ways where some op cuts them differently."""
    rounds = mesh.rounds
    for r in range(len(rounds) - 1):
        a, b = rounds[r], rounds[r + 1]
        if a.mesh_axis != b.mesh_axis or a.q != b.q:
            continue
        if all(s[r] == s[r + 1] for s in plan.values()):
            continue  # the same plan
        yield {name: (*s[:r], s[r + 1], s[r], *s[r + 2 :]) for name, s in plan.items()}


def cuts_anything(plan: Mapping[str, Strategy]) -> bool:
    """Whether some op of `plan` is cut in some round (else replication won)."""
    return any(c is not None for s in plan.values() for c in s)


def with_round_swaps(
    mesh: Mesh,
    scored: list[tuple[Plan, float]],
    best: Plan,
    best_score: float,
    improve: Callable[[Plan], tuple[Plan, float] | None],
) -> tuple[Plan, float]:
    """`best` (scored `best_score`) or, when it cuts nothing, the lowest-scoring of the two best
    cut plans of `scored` with a pair of rounds exchanged (`swapped_rounds`) and `improve`d
    (polished and scored; None: not a valid plan for the search)."""
    if cuts_anything(best):
        return best, best_score
    cut = sorted(
        ((p, s) for p, s in scored if cuts_anything(p)),
        key=lambda item: item[1],
    )
    for plan, _ in cut[:2]:
        for candidate in swapped_rounds(mesh, plan):
            found = improve(candidate)
            if found is not None and found[1] < best_score:
                best, best_score = found
    return best, best_score


__all__ = ["cuts_anything", "swapped_rounds", "with_round_swaps"]
