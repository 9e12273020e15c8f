"""D-Rec's next-round prices (the lookahead variant): where the next round cuts another number of
ways (`differs`), each cut of a heavy op also pays the op's cheapest own price in that round on
what the cut leaves (operand sizes, the all-reduce pieces it adds, the backlog). A mixin of
`costs.RoundCosts` (it reads the ledger's state and the round's prices). O(cuts^2 * operands)
per op and round.
"""

from __future__ import annotations

import math

from shardplan.cost.collectives import all_reduce_s
from shardplan.cost.terms import OperandInfo, intra_terms, piece_compute
from shardplan.mesh import Round
from shardplan.sharding import cut_problem


def differs(a: Round, b: Round) -> bool:
    """Whether two rounds cut different ways (q): what one leaves decides what the other can cut
    (a round of 3 after rounds of 2), while rounds of one q can trade their cuts."""
    return a.q != b.q


def scaled(infos: list[OperandInfo], div: float) -> list[OperandInfo]:
    """The operands with their sizes divided by `div` (themselves when it is 1: x / 1.0 == x)."""
    if div == 1.0:
        return infos
    return [
        OperandInfo(
            x.numel / div, x.dtype_bytes, x.role, x.requires_grad, x.ar_divisor, x.grad_shared
        )
        for x in infos
    ]


class NextRoundPrices:
    """`RoundCosts`' prices of a cut in the next round (mixed into it; uses its state)."""

    def _add_next_round(self, i: int, r: int, costs: dict[str | None, float]) -> None:
        """Remaining-rounds-aware price (the lookahead variant): where the next round differs
        (its q: `differs`), each cut of op i also pays op i's cheapest own price in that round
        on what the cut leaves: operand sizes, the all-reduce pieces it adds, and the backlog a
        next cut that neither splits nor reduces an operand then pays. A tensor-parallel cut
        keeps activations (logits) whole, so a round of 3 after it all-reduces them at twice the
        size a batch cut would leave: priced alone, the round cannot see that."""
        rounds = self.rounds
        if r + 1 >= len(rounds) or not differs(rounds[r], rounds[r + 1]):
            return
        st, nxt, opts, mesh = self.states[i], rounds[r + 1], self.opts, self.mesh
        op, q = st.op, rounds[r].q
        div = self.compute_divisor[r + 1]
        before = math.prod(rounds[j].q for j, c in enumerate(st.cuts) if c is not None)
        for cut in list(costs):
            extents = dict(st.extents)
            if cut is not None:
                extents[cut] //= q
            operands = self._next_operands(i, r, cut)
            ins = [info for is_output, _, info, _ in operands if not is_output]
            outs = [info for is_output, _, info, _ in operands if is_output]
            flops = op.flops / before / (q if cut is not None else 1) / div
            c_ins, c_outs = scaled(ins, div), scaled(outs, div)
            base = piece_compute(op, None, nxt.q, flops, c_ins, c_outs, opts, mesh, ideal=True)
            best = math.inf
            for c in self.candidates[i]:
                if c is not None and cut_problem(op, c, extents[c], nxt.q) is not None:
                    continue
                price = intra_terms(op, c, nxt, ins, outs, extents.get(c, 1), opts).total
                price += piece_compute(op, c, nxt.q, flops, c_ins, c_outs, opts, mesh) - base
                for is_output, pos, _, backlog in operands:
                    if backlog and not self._shrinks(i, c, pos, is_output):
                        price += backlog
                best = min(best, price)
            if best < math.inf:
                costs[cut] += best

    def _next_operands(
        self, i: int, r: int, cut: str | None
    ) -> list[tuple[bool, int, OperandInfo, float]]:
        """Op i's operands before round r + 1 if round r cuts `cut`: (is_output, position, size
        and hierarchical all-reduce divisor as `_infos` would give them, the backlog round r + 1
        charges a cut that keeps the operand whole: the pieces assumed to shrink in it, grown by
        round r when `cut` keeps it whole too, and the all-reduce `cut` itself adds)."""
        st, rnd = self.states[i], self.rounds[r]
        ins, outs = self._infos(i, r)
        now, after = self._assumed(i, r), self._assumed(i, r + 1)
        out = []
        for is_output, infos in ((False, ins), (True, outs)):
            for pos, x in enumerate(infos):
                divisor = 1.0
                for j, qj in self.faster_than[r + 1]:
                    if j > r + 1:
                        divisor *= qj if after >> j & 1 else 1
                    elif j == r:
                        divisor *= qj if self._reduces_only(i, cut, pos, is_output) else 1
                    else:
                        divisor *= qj if self._reduces_only(i, st.cuts[j], pos, is_output) else 1
                split = self._in(i, cut, pos) if not is_output else self._out(i, cut, pos)
                kept = not self._shrinks(i, cut, pos, is_output)
                pieces = sum(
                    c * rnd.q if kept and m >> r & 1 else c
                    for _, c, m in st.ar_history.get((is_output, pos), ())
                    if m >> (r + 1) & 1
                )
                if now >> (r + 1) & 1 and (is_output, pos) in self._reduced_operands(i, cut):
                    nbytes = x.numel * x.dtype_bytes / x.ar_divisor
                    pieces += all_reduce_s(nbytes, rnd.q, rnd.bandwidth_bytes_per_s)
                numel = x.numel / rnd.q if split >= 0 else x.numel
                info = OperandInfo(numel, x.dtype_bytes, x.role, x.requires_grad, divisor)
                out.append((is_output, pos, info, pieces * (self.rounds[r + 1].q - 1)))
        return out

    def _reduces_only(self, i: int, cut: str | None, pos: int, is_output: bool) -> bool:
        """Does `cut` all-reduce this operand of op i without splitting it?"""
        return (is_output, pos) in self._reduced_operands(i, cut) and (
            (self._out(i, cut, pos) if is_output else self._in(i, cut, pos)) < 0
        )
