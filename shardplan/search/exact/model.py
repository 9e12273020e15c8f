"""The pairwise cost model the exact searches (ILP, DP) optimise over the strategy space of
`shardplan.search.exact.space`.

`build_model` turns the space into the pairwise cost model both exact methods optimise, computed
with the evaluator's own functions, so that for any choice of strategies
    model.objective(choice) == evaluate_strategies(...).total   (up to float rounding):
  * unary: `unary_terms` (intra-operator terms + compute) of each strategy of each op;
  * "edge" pair terms: `edge_terms` from the producer's resolved output layout to the consumer's
    input layout, one table per (producer, consumer operand);
  * "home" pair terms: a parameter lives where its first consumer reads it, so every other
    consumer pays `edge_terms` from that layout: a table between the first and the other consumer;
  * "share" pair terms: `share_credit` (<= 0) between consecutive consumers of one tensor.
Pair tables are indexed by classes, not strategies: an edge's cost depends only on the two
layouts, a credit on the previous consumer's (layout, rounds that reduce the gradient) and the
current consumer's strategy; a layout table is priced with one `edge_terms` call per distinct
per-round relation pattern of its two layouts (spot-checked against direct calls). Edge and home
terms also carry their round-by-round form (`RoundSplit`: each piece priced by `edge_terms` on a
pair, checked against direct calls on sampled pairs), which the ILP
uses for large tables; with `table_limit` those large class tables are not built at all.
Identical rows / columns are merged, a table with one row (column)
folds into the other op's unary vector, a constant table into `constant`, and terms between two
operands of one op into that op's unary vector. Tables repeated across identical layers are
computed once (keyed by signatures and tensor sizes), so building is linear in the graph times
the table sizes.
"""

from __future__ import annotations

import time
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardplan.cost.evaluate import edge_terms, previous_consumer, share_credit, unary_terms
from shardplan.cost.presets import CostOptions
from shardplan.cost.terms import reduces
from shardplan.errors import SolverError
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role
from shardplan.mesh import Mesh
from shardplan.plans import Plan
from shardplan.search.exact.round_split import ASPLIT, RoundSplit, can_move_split, round_features
from shardplan.search.exact.space import StrategySpace, build_space
from shardplan.sharding import (
    REPLICATED,
    Layout,
    Strategy,
    operand_layout,
    resolved,
)


@dataclass(frozen=True, slots=True)
class PairTerm:
    """A cost between op `u`'s and op `v`'s strategies: table[u_class[s], v_class[t]].

    kind: "edge" (u produces what v reads), "home" (u is a parameter's first consumer, v another
    one) or "share" (u and v are consecutive consumers of `tensor`: a gradient credit, <= 0).
    Large edge/home terms may keep only their round-by-round form (`table` is None then).
    """

    kind: str
    tensor: str
    u: int
    v: int
    u_class: np.ndarray | None
    v_class: np.ndarray | None
    table: np.ndarray | None
    split: RoundSplit | None = None

    @property
    def entries(self) -> int:
        """Entries of the class table (0 when only the round split is kept)."""
        return 0 if self.table is None else int(self.table.size)

    def dense(self) -> np.ndarray:
        """The cost over strategies (|S_u| x |S_v|)."""
        if self.table is not None:
            return self.table[np.ix_(self.u_class, self.v_class)]
        assert self.split is not None
        return self.split.dense()

    def value(self, s: int, t: int) -> float:
        if self.table is not None:
            return float(self.table[self.u_class[s], self.v_class[t]])  # type: ignore[index]
        assert self.split is not None
        return self.split.value(self.split.src[s], self.split.dst[t])


@dataclass(frozen=True, slots=True)
class CostModel:
    """unary[u][s] + sum of pair terms + constant == the evaluator's total for that choice."""

    space: StrategySpace
    unary: tuple[np.ndarray, ...]
    pairs: tuple[PairTerm, ...]
    constant: float
    build_seconds: float

    def objective(self, choice: Sequence[int]) -> float:
        total = self.constant + sum(float(u[c]) for u, c in zip(self.unary, choice, strict=True))
        for p in self.pairs:
            total += p.value(choice[p.u], choice[p.v])
        return total

    def strategies(self, choice: Sequence[int]) -> dict[str, Strategy]:
        ops, options = self.space.graph.ops, self.space.strategies
        return {op.name: o[c] for op, o, c in zip(ops, options, choice, strict=True)}

    def plan(
        self,
        choice: Sequence[int],
        method: str,
        opts: CostOptions,
        start: float,
        status: str,
        notes: tuple[str, ...],
    ) -> Plan:
        """The Plan of `choice`, its search time counted from `start` (perf_counter)."""
        space = self.space
        seconds = time.perf_counter() - start
        strategies = self.strategies(choice)
        return Plan(
            space.graph, space.mesh, strategies, method, opts, seconds, status=status, notes=notes
        )

    def choice_of(self, strategies: Mapping[str, Strategy]) -> list[int]:
        """Indices of given strategies (e.g. a D-Rec plan) in the space."""
        out = []
        for op, options in zip(self.space.graph.ops, self.space.strategies, strict=True):
            out.append(options.index(tuple(strategies[op.name])))
        return out

    def size(self) -> dict[str, int]:
        return {
            "ops": len(self.unary),
            "strategies": int(sum(len(u) for u in self.unary)),
            "pair_terms": len(self.pairs),
            "pair_entries": int(sum(p.entries for p in self.pairs)),
        }


def _tensor_key(graph: Graph, name: str) -> tuple[Any, ...]:
    t = graph.tensors[name]
    return (t.numel, t.dtype_bytes, t.role, name in graph.requires_grad)


def _op_key(graph: Graph, op: Op) -> tuple[Any, ...]:
    """Everything unary_terms reads about an op: equal keys give equal cost vectors."""
    return (
        op.kind,
        op.signature,
        op.flops,
        tuple(_tensor_key(graph, t) for t in op.inputs),
        tuple(_tensor_key(graph, t) for t in op.outputs),
    )


def _classes(keys: Sequence[Hashable]) -> tuple[np.ndarray, list[Hashable]]:
    """Class index of each key (classes numbered by first appearance) and the class keys."""
    index: dict[Hashable, int] = {}
    out = np.empty(len(keys), dtype=np.int64)
    for i, k in enumerate(keys):
        out[i] = index.setdefault(k, len(index))
    return out, list(index)


def _compress(table: np.ndarray, u_class: np.ndarray, v_class: np.ndarray):
    """Merge identical rows and identical columns of a class table (exact)."""
    rows, row_inv = np.unique(table, axis=0, return_inverse=True)
    cols, col_inv = np.unique(rows, axis=1, return_inverse=True)
    return cols, row_inv.reshape(-1)[u_class], col_inv.reshape(-1)[v_class]


class _Builder:
    def __init__(
        self,
        space: StrategySpace,
        opts: CostOptions,
        deadline: float | None,
        max_entries: int | None,
        method: str,
        time_limit: float | None = None,
        table_limit: int | None = None,
    ) -> None:
        self.space, self.opts = space, opts
        self.table_limit = table_limit
        self.graph, self.mesh = space.graph, space.mesh
        self.rounds = self.mesh.rounds
        self.deadline, self.max_entries, self.method = deadline, max_entries, method
        self.limit = "the time limit" if time_limit is None else f"{time_limit:g} s"
        self.entries = 0
        self.unary_cache: dict[Hashable, np.ndarray] = {}
        self.table_cache: dict[Hashable, Any] = {}
        self.edge_cache: dict[Hashable, float] = {}
        self.pattern_cache: dict[Hashable, float] = {}
        self.unary = [np.zeros(len(s)) for s in space.strategies]
        self.pairs: list[PairTerm] = []
        self.constant = 0.0

    def _tick(self, what: str) -> None:
        if self.deadline is not None and time.perf_counter() > self.deadline:
            raise SolverError(f"{self.method} did not finish within {self.limit} ({what})")

    def _count(self, tensor: str, rows: int, columns: int, more: bool = False) -> None:
        """SolverError when a rows x columns class table for `tensor` would take the tables
        past `max_entries` (checked before it is built: a table that size takes seconds of
        numpy no deadline can interrupt, and its memory); `more`: rows is a count so far."""
        if self.max_entries is not None and self.entries + rows * columns > self.max_entries:
            raise SolverError(
                f"{self.method} did not finish: the pairwise cost tables of {self.graph.name!r} on "
                "mesh "
                f"{self.mesh.text()} exceed {self.max_entries:,} entries (tensor {tensor!r} alone "
                f"needs {rows}{' or more' if more else ''} x {columns}); the exact methods grow as "
                "layouts ** 2 per edge: use drec, a smaller model or fewer devices"
            )

    # -- unary ----------------------------------------------------------------------------------
    def op_unary(self, i: int) -> np.ndarray:
        graph, op = self.graph, self.graph.ops[i]
        key = _op_key(graph, op)
        if key not in self.unary_cache:
            values = []
            for n, s in enumerate(self.space.strategies[i]):
                if n % 64 == 0:
                    self._tick(f"pricing the strategies of op {op.name!r}")
                comm, compute = unary_terms(graph, op, s, self.mesh, self.opts)
                values.append(comm.total + compute)
            self.unary_cache[key] = np.array(values, dtype=float)
        return self.unary_cache[key]

    # -- tables ---------------------------------------------------------------------------------
    def _edge_cost(self, tensor: str, src: Layout, dst: Layout, only: int | None = None) -> float:
        """`edge_terms` (of round `only` alone, when given: other rounds may move too)."""
        if src == dst:
            return 0.0
        key = (_tensor_key(self.graph, tensor), src, dst, only)
        value = self.edge_cache.get(key)
        if value is None:
            value = edge_terms(self.graph, tensor, src, dst, self.rounds, self.opts, only).total
            self.edge_cache[key] = value
        return value

    def _pattern_table(
        self, tensor: str, src: Sequence[Layout], dst: Sequence[Layout]
    ) -> np.ndarray:
        """edge_terms(src[a], dst[b]) for every pair, one evaluator call per relation pattern.

        `edge_terms` depends on the two layouts only through, per round, how they relate: equal
        and split, equal and replicated, split -> other split, split -> replicated, replicated ->
        split (which tensor dims are split never enters the volumes). So each distinct pattern
        (at most 5 ** rounds) is priced once, on a representative pair. A few entries are
        re-priced directly as a guard; if the evaluator ever breaks that property, every entry
        is priced directly.
        """
        a = np.array(src, dtype=np.int64).reshape(len(src), -1)
        b = np.array(dst, dtype=np.int64).reshape(len(dst), -1)
        weights = 5 ** np.arange(a.shape[1], dtype=np.int64)
        pattern = np.empty((len(src), len(dst)), dtype=np.int64)
        rows = max(1, 2_000_000 // max(1, len(dst) * a.shape[1]))
        for i in range(0, len(src), rows):
            x, y = a[i : i + rows, None, :], b[None, :, :]
            code = np.where(
                x == y, np.where(y >= 0, 0, 1), np.where(x >= 0, np.where(y >= 0, 2, 3), 4)
            )
            pattern[i : i + rows] = code @ weights
        kinds, first, inverse = np.unique(pattern, return_index=True, return_inverse=True)
        tk = _tensor_key(self.graph, tensor)
        values = np.empty(len(kinds))
        for k, (p, flat) in enumerate(zip(kinds, first, strict=True)):
            if k % 64 == 0:
                self._tick(f"pricing the redistributions of {tensor!r}")
            key = (tk, int(p))
            if key not in self.pattern_cache:
                i, j = divmod(int(flat), len(dst))
                self.pattern_cache[key] = self._edge_cost(tensor, src[i], dst[j])
            values[k] = self.pattern_cache[key]
        table = values[inverse.reshape(-1)].reshape(len(src), len(dst))
        rng = np.random.default_rng(len(src) * 7919 + len(dst))
        for _ in range(3):
            i, j = int(rng.integers(len(src))), int(rng.integers(len(dst)))
            direct = self._edge_cost(tensor, src[i], dst[j])
            if abs(direct - table[i, j]) > 1e-12 * max(abs(direct), 1e-300):
                for i, la in enumerate(src):  # pragma: no cover - guard against model drift
                    for j, lb in enumerate(dst):
                        table[i, j] = self._edge_cost(tensor, la, lb)
                break
        return table

    def _layout_table(
        self, tensor: str, src: Sequence[Layout], dst: Sequence[Layout], key: Hashable
    ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None, RoundSplit | None]:
        """(table, u_class, v_class, split) of one edge or home term; the class table is skipped
        (None) when it is larger than `table_limit` and the round split stands in for it."""
        cached = self.table_cache.get(key)
        if cached is not None:
            return cached
        u_class, u_keys = _classes(src)
        v_class, v_keys = _classes(dst)
        n = len(u_keys) * len(v_keys)
        split = self._round_split(tensor, u_keys, v_keys)  # type: ignore[arg-type]
        if split is not None:
            split = RoundSplit(
                split.src[u_class],
                split.dst[v_class],
                split.features,
                split.src_values,
                split.dst_values,
                split.values,
            )
            big = self.table_limit is not None and n > self.table_limit
            if big and len(u_keys) > 1 and len(v_keys) > 1:
                result = (None, None, None, split)
                self.table_cache[key] = result
                return result
        self._count(tensor, len(u_keys), len(v_keys))
        self.entries += n
        table = self._pattern_table(tensor, u_keys, v_keys)  # type: ignore[arg-type]
        result = (*_compress(table, u_class, v_class), split)
        self.table_cache[key] = result
        return result

    def _round_split(
        self, tensor: str, src: Sequence[Layout], dst: Sequence[Layout]
    ) -> RoundSplit | None:
        """The round-by-round form of a layout table (class level), checked against `edge_terms`
        on sampled pairs (None: not applicable, or the evaluator no longer splits that way)."""
        rounds = self.rounds
        if not len(self.graph.tensors[tensor].shape):
            return None
        a = np.array(src, dtype=np.int64).reshape(len(src), len(rounds))
        b = np.array(dst, dtype=np.int64).reshape(len(dst), len(rounds))
        # round r can be an all-to-all if some src split differs from some dst split
        features = round_features(
            rounds, [can_move_split(a[:, r], b[:, r]) for r in range(len(rounds))]
        )
        src_values, dst_values, values = [], [], []
        for r, feats in enumerate(features):
            self._tick(f"splitting the redistributions of {tensor!r} by rounds")
            sv, dv = np.unique(a[:, r]), np.unique(b[:, r])
            v = np.zeros((len(sv), len(dv), 1 << len(feats)))
            for i, alpha in enumerate(sv):
                for k, beta in enumerate(dv):
                    if alpha == beta:
                        continue
                    for f in range(v.shape[2]):
                        la = [REPLICATED] * len(rounds)
                        lb = list(la)
                        for bit, (j, kind) in enumerate(feats):
                            if (f >> bit) & 1 and kind == ASPLIT:
                                la[j], lb[j] = 0, 1  # (BSPLIT off, ASPLIT on) cannot occur
                            elif (f >> bit) & 1 and la[j] == REPLICATED:
                                la[j] = lb[j] = 0
                        la[r], lb[r] = int(alpha), int(beta)
                        v[i, k, f] = self._edge_cost(tensor, tuple(la), tuple(lb), r)
            src_values.append(sv)
            dst_values.append(dv)
            values.append(v)
        split = RoundSplit(a, b, features, tuple(src_values), tuple(dst_values), tuple(values))
        rng = np.random.default_rng(len(src) * 104729 + len(dst))
        for _ in range(16):
            i, k = int(rng.integers(len(src))), int(rng.integers(len(dst)))
            want = self._edge_cost(tensor, src[i], dst[k])
            if abs(split.value(a[i], b[k]) - want) > 1e-9 * max(abs(want), 1e-300):
                return None  # pragma: no cover - the evaluator changed shape; use the tables
        return split

    def _share_table(
        self, tensor: str, prev: tuple[int, int], cur: tuple[int, int], key: Hashable
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        cached = self.table_cache.get(key)
        if cached is not None:
            return cached
        graph, opts = self.graph, self.opts
        grad = tensor in graph.requires_grad
        (pi, p_pos), (ci, c_pos) = prev, cur
        p_op, c_op = graph.ops[pi], graph.ops[ci]
        p_dims, c_dims = p_op.signature.inputs[p_pos], c_op.signature.inputs[c_pos]

        def signature(op: Op, s: Strategy, pos: int, dims: Any) -> tuple[Layout, tuple[bool, ...]]:
            mask = tuple(reduces(op, d, dims, False, grad, opts.train) for d in s)
            return operand_layout(op, s, pos), mask

        p_strategies = self.space.strategies[pi]
        c_strategies = self.space.strategies[ci]
        u_class, u_keys = _classes([signature(p_op, s, p_pos, p_dims) for s in p_strategies])
        rep = {}
        for s, c in zip(p_strategies, u_class, strict=True):
            rep.setdefault(int(c), s)
        by_layout: dict[Layout, list[int]] = {}
        for c, (layout, _) in enumerate(u_keys):  # type: ignore[misc]
            by_layout.setdefault(layout, []).append(c)
        width = len(u_keys)

        def credits(s: Strategy) -> np.ndarray:
            """Strategy s's credit against each class of the previous consumer."""
            row = np.zeros(width)
            layout, mask = signature(c_op, s, c_pos, c_dims)
            done: dict[tuple[bool, ...], float] = {}
            for c in by_layout.get(layout, ()) if any(mask) else ():
                both = tuple(a and b for a, b in zip(u_keys[c][1], mask, strict=True))  # type: ignore[index]
                if any(both) and both not in done:
                    done[both] = share_credit(
                        graph, tensor, (p_op, p_pos, rep[c]), (c_op, c_pos, s), self.mesh, opts
                    ).total
                row[c] = done.get(both, 0.0)
            return row

        rows: dict[bytes, int] = {}  # a row's bytes -> its class (first appearance)
        kept: list[np.ndarray] = []  # one row per class: the dense table is never built
        v_class = np.empty(len(c_strategies), dtype=np.int64)
        for t, s in enumerate(c_strategies):
            if t % 64 == 0:
                self._tick(f"pricing the gradient credits of {tensor!r}")
            row = credits(s)
            found = rows.setdefault((row + 0.0).tobytes(), len(kept))  # + 0.0: -0.0 is 0.0
            if found == len(kept):
                self._count(tensor, len(kept) + 1, width, more=True)
                kept.append(row)
            v_class[t] = found
        table = np.array(kept, dtype=float).reshape(len(kept), width).T
        self.entries += table.size
        result = _compress(table, u_class, v_class)
        self.table_cache[key] = result
        return result

    def add_pair(
        self,
        kind: str,
        tensor: str,
        u: int,
        v: int,
        table: np.ndarray | None,
        uc: np.ndarray | None,
        vc: np.ndarray | None,
        split: RoundSplit | None = None,
    ) -> None:
        if table is None:
            self.pairs.append(PairTerm(kind, tensor, u, v, None, None, None, split))
        elif table.shape[0] == 1 and table.shape[1] == 1:
            self.constant += float(table[0, 0])
        elif table.shape[0] == 1:
            self.unary[v] = self.unary[v] + table[0, vc]  # type: ignore[index]
        elif table.shape[1] == 1:
            self.unary[u] = self.unary[u] + table[uc, 0]  # type: ignore[index]
        else:
            self.pairs.append(PairTerm(kind, tensor, u, v, uc, vc, table, split))

    # -- the walk -------------------------------------------------------------------------------
    def build(self) -> None:
        graph, space = self.graph, self.space
        for i in range(len(graph.ops)):
            self._tick(f"pricing strategies (op {i} of {len(graph.ops)})")
            self.unary[i] = self.unary[i] + self.op_unary(i)
        if not self.rounds:
            return
        for ci, op in enumerate(graph.ops):
            self._tick(f"building cost tables (op {ci} of {len(graph.ops)})")
            c_strategies = space.strategies[ci]
            for c_pos, tensor in enumerate(op.inputs):
                dst = [operand_layout(op, s, c_pos) for s in c_strategies]
                tk = _tensor_key(graph, tensor)
                pi = graph.producer.get(tensor)
                if pi is not None:
                    producer = graph.ops[pi]
                    out_pos = producer.outputs.index(tensor)
                    src = [
                        resolved(operand_layout(producer, s, out_pos, True))
                        for s in space.strategies[pi]
                    ]
                    key = ("edge", tk, producer.signature, out_pos, op.signature, c_pos)
                    table, uc, vc, split = self._layout_table(tensor, src, dst, key)
                    self.add_pair("edge", tensor, pi, ci, table, uc, vc, split)
                elif graph.tensors[tensor].role is Role.PARAMETER:
                    fi, f_pos = graph.consumers[tensor][0]
                    if (fi, f_pos) != (ci, c_pos):
                        first = graph.ops[fi]
                        homes = [operand_layout(first, s, f_pos) for s in space.strategies[fi]]
                        if fi == ci:  # the same op reads the parameter twice: a unary term
                            pairs = zip(homes, dst, strict=True)
                            self.unary[ci] = self.unary[ci] + np.array(
                                [self._edge_cost(tensor, h, d) for h, d in pairs]
                            )
                        else:
                            key = ("home", tk, first.signature, f_pos, op.signature, c_pos)
                            table, uc, vc, split = self._layout_table(tensor, homes, dst, key)
                            self.add_pair("home", tensor, fi, ci, table, uc, vc, split)
                prev = previous_consumer(graph, tensor, ci, c_pos)
                if prev is None:
                    continue
                pi2, p_pos = prev
                if pi2 == ci:  # two operands of one op read the tensor: a unary term
                    self.unary[ci] = self.unary[ci] + np.array(
                        [
                            share_credit(
                                graph, tensor, (op, p_pos, s), (op, c_pos, s), self.mesh, self.opts
                            ).total
                            for s in c_strategies
                        ]
                    )
                    continue
                key = (
                    "share",
                    tk,
                    _op_key(graph, graph.ops[pi2]),
                    p_pos,
                    _op_key(graph, op),
                    c_pos,
                )
                table, uc, vc = self._share_table(tensor, prev, (ci, c_pos), key)
                self.add_pair("share", tensor, pi2, ci, table, uc, vc)


def build_timed_model(
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    method: str,
    start: float,
    time_limit: float,
    max_strategies: int | None,
    max_entries: int | None,
    table_limit: int | None = None,
) -> CostModel:
    """`build_model` for an exact solver `method` started at `start` (perf_counter) with
    `time_limit` seconds: the deadline is start + time_limit."""
    return build_model(
        graph,
        mesh,
        opts,
        deadline=start + time_limit,
        max_strategies=max_strategies,
        max_entries=max_entries,
        method=method,
        time_limit=time_limit,
        table_limit=table_limit,
    )


def build_model(
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    space: StrategySpace | None = None,
    deadline: float | None = None,
    max_strategies: int | None = None,
    max_entries: int | None = None,
    method: str = "search",
    time_limit: float | None = None,
    table_limit: int | None = None,
) -> CostModel:
    """The pairwise cost model of `graph` on `mesh` (see the module docstring).

    Edge and home terms whose class table would exceed `table_limit` entries keep only their
    round split (None: every table is built). Raises SolverError when the space has more than
    `max_strategies` strategies, the class tables more than `max_entries` entries, or the
    `deadline` (perf_counter seconds) passes
    (`time_limit` only words that message).
    """
    start = time.perf_counter()
    if space is None:
        space = build_space(graph, mesh, max_strategies, deadline, method, time_limit)
    builder = _Builder(space, opts, deadline, max_entries, method, time_limit, table_limit)
    builder.build()
    return CostModel(
        space,
        tuple(builder.unary),
        tuple(builder.pairs),
        builder.constant,
        time.perf_counter() - start,
    )
