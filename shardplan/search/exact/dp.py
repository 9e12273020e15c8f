"""The dynamic-programming baseline (OptCNN; MindSpore's `dynamic_programming` search mode).

Same strategy space and the same pairwise cost model as the ILP (`model.build_model`), so where it
finishes it returns the same optimum. The model is a graph: one node per op with a cost vector
over all its strategies, one dense |S_u| x |S_v| table per pair of ops that share a cost term.
  1. edge elimination: parallel terms between the same two ops are added into one table (at
     construction, and whenever an elimination creates an edge that already exists);
  2. node elimination: an op with exactly two neighbours a, c (in/out degree 1 in the op graph)
     is folded into a new a-c table  T[s, r] = min_t E_at[s, t] + U_t[t] + E_tc[t, r],
     keeping the arg-min for back-substitution (|S_a| |S_t| |S_c| work);
  3. leaf elimination (MindSpore's merge / contract): an op with one neighbour a folds into a's
     vector  U_a[s] += min_t E_at[s, t] + U_t[t];  an op with none takes its cheapest strategy;
  4. what remains is enumerated exhaustively, depth first, cheapest branch first, pruned by a
     lower bound (each op still to place at its cheapest strategy, against the placed ops'
     rows and the cheapest entries of its other tables) and the best plan found so far;
  5. back-substitution walks the eliminations backwards to recover every op's strategy.
The elimination phase is polynomial in the strategy counts; the enumeration is exponential in
what the eliminations leave (a transformer's q/k/v fan-out and residual adds leave cycles), and the
space itself is exponential in the number of rounds. The time limit is checked inside every loop;
when it is reached the method raises SolverError("dp did not finish within S s ...").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from shardplan.cost.presets import CostOptions
from shardplan.errors import SolverError
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.plans import Plan
from shardplan.search.exact.model import CostModel, build_timed_model

MAX_TABLE_ENTRIES = 60_000_000
"""Refuse (SolverError) models whose dense tables would exceed this many float64 entries."""
MAX_STRATEGIES = 2_000_000
"""Refuse (SolverError) spaces with more strategies than this in all."""
BLOCK = 4_000_000
"""Entries per numpy block in the min-plus products (32 MB)."""


@dataclass(slots=True)
class DpStats:
    leaves: int = 0
    nodes: int = 0
    merged_edges: int = 0
    remaining: int = 0
    remaining_edges: int = 0
    visited: int = 0
    seconds: float = 0.0
    order: list[int] = field(default_factory=list)

    def text(self) -> str:
        return (
            f"dp: {self.leaves} leaf and {self.nodes} node eliminations, {self.merged_edges} "
            f"parallel edges merged; enumerated {self.remaining} ops / {self.remaining_edges} "
            f"edges ({self.visited} branches) in {self.seconds:.2f} s"
        )


class _Dp:
    def __init__(
        self, model: CostModel, deadline: float, time_limit: float, max_entries: int | None
    ) -> None:
        self.model = model
        self.deadline, self.time_limit = deadline, time_limit
        self.stats = DpStats()
        self.unary = [np.array(u, dtype=float) for u in model.unary]
        self.constant = model.constant
        self.adj: list[dict[int, np.ndarray]] = [{} for _ in model.unary]
        sizes = [len(u) for u in model.unary]
        pairs = {(min(p.u, p.v), max(p.u, p.v)) for p in model.pairs}
        entries = sum(sizes[a] * sizes[b] for a, b in pairs)
        if max_entries is not None and entries > max_entries:
            self._fail(
                f"its dense cost tables need {entries:,} entries (limit {max_entries:,})", True
            )
        for p in model.pairs:
            self._tick("building tables")
            self._add(p.u, p.v, p.dense())
        self.records: list[tuple] = []

    # -- helpers --------------------------------------------------------------------------------
    def _fail(self, why: str, size: bool = False) -> None:
        g, mesh = self.model.space.graph, self.model.space.mesh
        if size:
            raise SolverError(f"dp did not finish on {g.name!r}, mesh {mesh.text()}: {why}")
        raise SolverError(
            f"dp did not finish within {self.time_limit:g} s on {g.name!r}, mesh {mesh.text()} "
            f"({why}; {self.stats.leaves + self.stats.nodes} ops eliminated so far)"
        )

    def _tick(self, what: str) -> None:
        if time.perf_counter() > self.deadline:
            self._fail(what)

    def _add(self, a: int, b: int, table: np.ndarray) -> None:
        """Edge elimination: add `table` (|S_a| x |S_b|) into the a-b edge."""
        if a > b:
            a, b, table = b, a, table.T
        if b in self.adj[a]:
            self.stats.merged_edges += 1
            table = self.adj[a][b] + table
        else:
            table = np.ascontiguousarray(table)
        self.adj[a][b] = table
        self.adj[b][a] = table  # stored once; `_edge` orients it

    def _edge(self, a: int, b: int) -> np.ndarray:
        """The a-b table oriented (|S_a| x |S_b|)."""
        t = self.adj[a][b]
        return t if a < b else t.T

    def _remove(self, t: int) -> None:
        for n in list(self.adj[t]):
            del self.adj[n][t]
        self.adj[t] = {}

    # -- eliminations ---------------------------------------------------------------------------
    def _leaf(self, t: int) -> int:
        (a,) = self.adj[t]
        m = self._edge(a, t) + self.unary[t][None, :]
        best = m.argmin(axis=1)
        self.unary[a] = self.unary[a] + m[np.arange(len(best)), best]
        self.records.append(("leaf", t, a, best))
        self._remove(t)
        self.stats.leaves += 1
        return a

    def _node(self, t: int) -> tuple[int, int]:
        a, c = sorted(self.adj[t])
        e_at, e_tc, u_t = self._edge(a, t), self._edge(t, c), self.unary[t]
        n_a, n_t, n_c = e_at.shape[0], len(u_t), e_tc.shape[1]
        new = np.empty((n_a, n_c))
        arg = np.empty((n_a, n_c), dtype=np.int32)
        left = e_at + u_t[None, :]
        rows = max(1, BLOCK // max(1, n_t * n_c))
        for i in range(0, n_a, rows):
            self._tick(f"eliminating op {self.model.space.graph.ops[t].name!r}")
            block = left[i : i + rows, :, None] + e_tc[None, :, :]
            k = block.argmin(axis=1)
            arg[i : i + rows] = k
            new[i : i + rows] = np.take_along_axis(block, k[:, None, :], axis=1)[:, 0, :]
        self.records.append(("node", t, a, c, arg))
        self._remove(t)
        self._add(a, c, new)
        self.stats.nodes += 1
        return a, c

    def eliminate(self) -> list[int]:
        """Leaf and node eliminations until none applies; returns the ops left."""
        alive = set(range(len(self.unary)))
        work = sorted(alive)
        while work:
            t = work.pop()
            if t not in alive:
                continue
            self._tick("eliminating")
            degree = len(self.adj[t])
            if degree == 0:
                best = int(self.unary[t].argmin())
                self.constant += float(self.unary[t][best])
                self.records.append(("free", t, best))
            elif degree == 1:
                work.append(self._leaf(t))
            elif degree == 2:
                work.extend(self._node(t))
            else:
                continue
            alive.discard(t)
        return sorted(alive)

    # -- enumeration ----------------------------------------------------------------------------
    def enumerate(self, nodes: list[int]) -> dict[int, int]:
        """Exhaustive depth-first search with pruning over the ops left.

        Ops are placed in a fixed order (most connected to the placed ones first). Every op not
        yet placed keeps a vector acc_j over its strategies: its unary cost plus, for each table
        to an op earlier in the order, that op's row when it is placed or else the table's
        column minimum. sum_j min(acc_j) over the ops still to place is a lower bound of what
        is left, so a branch is cut as soon as partial + bound >= the best plan found.
        """
        self.stats.remaining = len(nodes)
        if not nodes:
            return {}
        left = set(nodes)
        order = [max(nodes, key=lambda n: (len(self.adj[n]), -len(self.unary[n]), -n))]
        left.discard(order[0])
        while left:
            placed = set(order)
            nxt = max(
                left,
                key=lambda n: (sum(1 for m in self.adj[n] if m in placed), -len(self.unary[n]), -n),
            )
            order.append(nxt)
            left.discard(nxt)
        self.stats.order = order
        k_of = {n: i for i, n in enumerate(order)}
        size = len(order)
        # later[k]: (index j > k, table oriented (S_k x S_j), its column minimum)
        later: list[list[tuple[int, np.ndarray, np.ndarray]]] = [[] for _ in order]
        acc0 = [self.unary[n].copy() for n in order]
        for k, n in enumerate(order):
            for m in self.adj[n]:
                j = k_of[m]
                if j > k:
                    table = self._edge(n, m)
                    low = table.min(axis=0)
                    later[k].append((j, table, low))
                    acc0[j] = acc0[j] + low
        self.stats.remaining_edges = sum(len(x) for x in later)
        best_cost = np.inf
        best: list[int] = []
        chosen = [0] * size

        def level(k: int, partial: float, acc: list[np.ndarray], rest: float) -> None:
            """acc[j] for j >= k; rest = sum of min(acc[j]) for j > k."""
            nonlocal best_cost, best
            self.stats.visited += 1
            if self.stats.visited % 64 == 0:
                self._tick(f"enumerating {size} ops left after eliminations")
            total = partial + acc[k]
            if k == size - 1:
                s = int(total.argmin())
                if total[s] < best_cost:
                    best_cost = float(total[s])
                    chosen[k] = s
                    best = chosen.copy()
                return
            for s in np.argsort(total, kind="stable"):
                here = float(total[s])
                if here + rest >= best_cost:
                    break
                new_acc = acc.copy()
                new_rest = rest
                for j, table, low in later[k]:
                    before = float(new_acc[j].min())
                    new_acc[j] = new_acc[j] + (table[s] - low)
                    new_rest += float(new_acc[j].min()) - before
                if here + new_rest >= best_cost:
                    continue
                chosen[k] = int(s)
                level(k + 1, here, new_acc, new_rest - float(new_acc[k + 1].min()))

        rest0 = sum(float(a.min()) for a in acc0[1:])
        level(0, 0.0, acc0, rest0)
        return {n: best[i] for i, n in enumerate(order)}

    def back_substitute(self, fixed: dict[int, int]) -> list[int]:
        choice = dict(fixed)
        for record in reversed(self.records):
            if record[0] == "free":
                choice[record[1]] = record[2]
            elif record[0] == "leaf":
                _, t, a, best = record
                choice[t] = int(best[choice[a]])
            else:
                _, t, a, c, arg = record
                choice[t] = int(arg[choice[a], choice[c]])
        return [choice[i] for i in range(len(self.unary))]


def solve_model(
    model: CostModel,
    time_limit: float = 60.0,
    max_entries: int | None = MAX_TABLE_ENTRIES,
    start: float | None = None,
) -> tuple[list[int], float, DpStats]:
    """(choice per op, its cost, statistics); SolverError when the limit is hit."""
    start = time.perf_counter() if start is None else start
    dp = _Dp(model, start + time_limit, time_limit, max_entries)
    t0 = time.perf_counter()
    remaining = dp.eliminate()
    fixed = dp.enumerate(remaining)
    choice = dp.back_substitute(fixed)
    dp.stats.seconds = time.perf_counter() - t0
    return choice, model.objective(choice), dp.stats


def solve_dp(
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    time_limit: float = 60.0,
    max_entries: int | None = MAX_TABLE_ENTRIES,
    max_strategies: int | None = MAX_STRATEGIES,
) -> Plan:
    """The optimal plan of our cost model by graph elimination + enumeration (see module doc)."""
    start = time.perf_counter()
    model = build_timed_model(
        graph, mesh, opts, "dp", start, time_limit, max_strategies, max_entries
    )
    choice, _, stats = solve_model(model, time_limit, max_entries, start)
    return model.plan(choice, "dp", opts, start, "optimal", (stats.text(),))
