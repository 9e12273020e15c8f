"""Block copies: every repeated block of an unfolded graph given one block's decisions.

A model of two to five identical layers (too few to fold, `fold.py`) is searched whole, and the
round-by-round greedy can decide its layers differently: the first layer sees the embedding's
layout, the later ones the layer before them. An MoE model (DeepSeek-MoE-shaped, 3 layers,
batch 24, sequence 64) on 2x2x3 kept its first layer's attention whole on every device but split
the next two's along the hidden units, 1.181 of the ILP optimum, where the optimum keeps every
layer's attention whole; the polish moves one op, a pair or a run at a time, each alone adding
redistributions. So for each block k of the longest run of identical blocks
(`fold.repeated_blocks`, two or more), the plan with every block taking block k's strategies is
scored by the evaluator; the ones scoring below the plan, lowest first (at most `TRIED`), or
when none does the lowest (`columns.ABOVE`: a copy that must shed a cut costs more as copied
than polished), are polished with pair and run moves (`polish.polished_if_lower`) and kept
when they then score lower: 1.181 -> 1.121 there, 1.000 with the stream moves and the copy
polished as `ABOVE` says (`streams.py`). Never worse than the plan; O(blocks) scorings and at
most `TRIED` polishes, on graphs that were not folded; not in the memory-aware driver's
penalised re-runs (as `columns.py`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from shardplan.cost.evaluate import ScoreCache
from shardplan.cost.presets import CostOptions
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.search.drec.columns import ABOVE, best_polished
from shardplan.search.drec.fold import repeated_blocks
from shardplan.sharding import Strategy

TRIED = 2
"""At most this many copies are polished (each a polish; the scorings are cheap)."""

Plan = dict[str, Strategy]


def copies(graph: Graph, plan: Mapping[str, Strategy], labels: Sequence[int]) -> Iterator[Plan]:
    """`plan` with every block of the longest run of >= 2 identical blocks taking block k's
    strategies, for each block k whose strategies differ from another block's."""
    found = repeated_blocks(graph, labels, 2)
    if found is None:
        return
    start, period, count = found
    names = [op.name for op in graph.ops]
    blocks = [
        tuple(plan[names[start + b * period + x]] for x in range(period)) for b in range(count)
    ]
    seen: set[tuple[Strategy, ...]] = set()
    for block in blocks:
        if block in seen or all(b == block for b in blocks):
            continue  # tried already, or every block decides alike
        seen.add(block)
        out = dict(plan)
        for b in range(count):
            out.update((names[start + b * period + x], s) for x, s in enumerate(block))
        yield out


def with_block_copies(
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    memory_lambda: float,
    cache: ScoreCache,
    plan: Plan,
) -> Plan:
    """`plan`, or a copy of one block's strategies to every block (`copies`) polished, when it
    scores lower (module docstring)."""
    if opts.preset.symbolic or memory_lambda:  # MindSpore's one pass; a memory-penalised
        return plan  # re-run of the driver (`driver.py`, up to 8 of them) seeks a plan that fits
    candidates = list(copies(graph, plan, cache.classes))
    args = (graph, mesh, opts, memory_lambda, None, cache, plan, candidates)
    return best_polished(*args, TRIED, ABOVE)


__all__ = ["TRIED", "copies", "with_block_copies"]
