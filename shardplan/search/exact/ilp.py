"""The exact method: an integer linear program over the whole strategy space, solved by HiGHS.

It minimises the evaluator's own cost (see `model.build_model`: unary + pairwise terms computed
with the evaluator's functions), so its optimum is the yardstick for D-Rec's quality.

Formulation (one block of columns per op, one per pair term):
  variables
    x[u, s] in {0, 1}      op u takes strategy s (every valid strategy: space.py);
    y[e, a, b] in [0, 1]   table form of pair term e: its first op is in class a, its second in b
                           (classes = layouts for edges, (layout, reducing rounds) for credits;
                           identical rows/columns merged; one-row/one-column tables are folded
                           into the unary costs and constant tables into the objective);
    p[e, j, al, be], z[e, r, al, be, f] in [0, 1]
                           round-split form of an edge (tables over 4096 entries, `SPLIT_ABOVE`):
                           p = the two layouts in round j; z = the pair moves from al to be in
                           round r while the other rounds show the feature bits f that set the
                           volume (see space.RoundSplit);
    P >= 0                 only for an inference memory budget: parameter bytes per device.
  objective
    min  sum U[u, s] x[u, s] + sum T_e[a, b] y[e, a, b] + sum V_e,r[al, be, f] z[e, r, al, be, f]
  constraints
    one-hot        sum_s x[u, s] = 1                                      one row per op;
    table form     edges: sum_b y[e, a, b] = sum_{s in a} x[u, s] and the column analogue (the
                   local polytope: at integer x the only feasible y is the product of the two
                   one-hot class vectors); credits (entries <= 0) keep only their non-zero
                   entries with <= instead of =: minimising pushes y up to the product, and at
                   integer x nothing above it is feasible; a table with both signs is split;
    round form     per round j, p is a transportation between the round-j layouts of the two
                   ops (equalities as above); per round r and moved cell (al != be):
                   sum_f z[.., f] = p[e, r, al, be]; per feature bit i of round r (round j):
                   sum_{f: bit i set} z <= F_j and sum_{f: bit i clear} z <= 1 - F_j, F_j linear
                   in p[e, j] (split on both sides in j; split on both sides along different
                   dims; or not both replicated in j). At integer x
                   every marginal is one-hot, so z is the one cell of the true (move, features);
    memory         training: sum_{u, s} M[u, s] x[u, s] <= budget (parameter state of the ops
                   that first read each parameter + kept activations, see cost/linear.py);
                   inference: P = sum of parameter pieces, P + W[u, s] x[u, s] <= budget per op.
  size: sum_u |S_u| binaries with |S_u| <= (dims + 1) ** rounds; the table form has |A_e| |B_e|
  columns per edge (layouts ** 2, i.e. up to 16 ** rounds), the round form
  rounds * (layouts per round) ** 2 * 2 ** (rounds - 1). A 1-layer GPT (batch 8, seq 512, hidden
  512): mesh 8: 3.4 k binaries, 94 k continuous; 2x8: 16 k and 22 k; 4x8: 78 k and 68 k.

Costs are divided by a scale (the sum of the ops' cheapest unary costs) so HiGHS works on O(1)
numbers; the relative MIP gap defaults to 1e-7. The reported status is HiGHS's: "optimal", or
"time-limit (gap X%)" when the limit stopped it with a feasible plan; no plan at all within the
limit raises SolverError, an infeasible memory budget raises InfeasibleError. Formulations over
`MAX_STRATEGIES` binaries or `MAX_PAIR_COLUMNS` pair columns are refused as "did not finish".
scipy's `milp` takes no starting solution, so HiGHS cannot be seeded with D-Rec's plan; instead
`solve_ilp(incumbent=...)` keeps a given plan (D-Rec's, from the CLI) when HiGHS ends without a
plan or with a costlier one, and says so in the status. `fixed` ops (`--force`) have every other
strategy's binary bounded to 0.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from shardplan import units
from shardplan.cost.linear import memory_piece_arrays
from shardplan.cost.presets import CostOptions
from shardplan.errors import InfeasibleError, SolverError
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.plans import Plan
from shardplan.search.exact.model import CostModel, PairTerm, build_timed_model
from shardplan.search.exact.round_split import ASPLIT, BSPLIT
from shardplan.sharding import Strategy

MAX_STRATEGIES = 2_000_000
"""Refuse (SolverError) spaces with more binaries than this: HiGHS would not finish anyway."""
MAX_PAIR_COLUMNS = 4_000_000
"""Refuse formulations with more pair columns than this (about 1 GB of matrix)."""
MAX_TABLE_ENTRIES = 40_000_000
"""Refuse models whose class tables (kept for scoring and the DP) exceed this many entries."""
SPLIT_ABOVE = 4096
"""With split="auto", tables with more entries than this are formulated round by round."""


@dataclass(frozen=True, slots=True)
class IlpResult:
    """What one HiGHS run gave: the choice per op, its objective (evaluator units), the status."""

    choice: tuple[int, ...]
    objective: float
    solver_objective: float
    status: str
    gap: float
    size: dict[str, int]
    seconds: float
    bound: float = float("nan")
    """HiGHS's dual bound (evaluator units): no plan costs less than this."""


class _Matrix:
    """COO triplets of the constraint matrix, appended block by block with numpy arrays."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []
        self.cols: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.lower: list[np.ndarray] = []
        self.upper: list[np.ndarray] = []
        self.n_rows = 0

    def add(self, rows: np.ndarray, cols: np.ndarray, vals: np.ndarray) -> None:
        self.rows.append(rows + self.n_rows)
        self.cols.append(cols)
        self.vals.append(vals)

    def close_rows(self, count: int, lower: float | np.ndarray, upper: float | np.ndarray) -> None:
        self.lower.append(np.broadcast_to(np.asarray(lower, dtype=float), (count,)))
        self.upper.append(np.broadcast_to(np.asarray(upper, dtype=float), (count,)))
        self.n_rows += count

    def build(self, n_cols: int) -> tuple[sparse.csr_array, np.ndarray, np.ndarray]:
        a = sparse.coo_array(
            (np.concatenate(self.vals), (np.concatenate(self.rows), np.concatenate(self.cols))),
            shape=(self.n_rows, n_cols),
        ).tocsr()
        return a, np.concatenate(self.lower), np.concatenate(self.upper)


def _marginals(
    m: _Matrix,
    y_index: np.ndarray,
    classes: np.ndarray,
    x_offset: int,
    by: int,
    n_classes: int,
    equal: bool,
) -> None:
    """Rows  sum_{y in class c} y  -/=  sum_{s: classes[s] = c} x[s]  (<= 0 or == 0).

    `y_index` is (n_rows_classes, n_col_classes) of column indices (-1: no variable); `by` = 0
    sums over columns (row classes), 1 over rows (column classes).
    """
    grid = y_index if by == 0 else y_index.T
    keep = grid >= 0
    r, _ = np.nonzero(keep)
    m.add(r, grid[keep], np.ones(len(r)))
    s = np.arange(len(classes))
    m.add(classes, x_offset + s, -np.ones(len(s)))
    m.close_rows(n_classes, 0.0 if equal else -np.inf, 0.0)


def _uses_split(p: PairTerm, split: str) -> bool:
    """Formulate this pair term round by round? ("auto": when that needs fewer columns)."""
    if p.table is None:
        return True
    if p.split is None or split == "never":
        return False
    if split == "always":
        return True
    return p.table.size > SPLIT_ABOVE and p.split.columns() < p.table.size


def _pair_columns(p: PairTerm, split: str) -> int:
    if _uses_split(p, split):
        return p.split.columns()  # type: ignore[union-attr]
    t = p.table
    assert t is not None
    return (t.size if (t > 0).any() else 0) + int((t < 0).sum())


def _table_block(
    m: _Matrix, p: PairTerm, x_off: np.ndarray, n_cols: int, scale: float, costs: list
) -> int:
    """Local-polytope rows for one class table (positive part: equalities; credits: <=)."""
    t = p.table
    assert t is not None and p.u_class is not None and p.v_class is not None
    parts = []
    if (t > 0).any():
        parts.append((np.where(t > 0, t, 0.0), np.ones(t.shape, dtype=bool), True))
    if (t < 0).any():
        parts.append((np.where(t < 0, t, 0.0), t < 0, False))
    for values, present, equal in parts:
        count = int(present.sum())
        y_index = np.full(t.shape, -1, dtype=np.int64)
        y_index[present] = n_cols + np.arange(count)
        costs.append(values[present] / scale)
        _marginals(m, y_index, p.u_class, int(x_off[p.u]), 0, t.shape[0], equal)
        _marginals(m, y_index, p.v_class, int(x_off[p.v]), 1, t.shape[1], equal)
        n_cols += count
    return n_cols


def _split_block(
    m: _Matrix, p: PairTerm, x_off: np.ndarray, n_cols: int, scale: float, costs: list
) -> int:
    """Round-by-round rows for one edge (see the module docstring)."""
    split = p.split
    assert split is not None
    u0, v0 = int(x_off[p.u]), int(x_off[p.v])
    pair: list[np.ndarray] = []
    for j in range(split.src.shape[1]):
        sv, dv = split.src_values[j], split.dst_values[j]
        idx = n_cols + np.arange(len(sv) * len(dv)).reshape(len(sv), len(dv))
        n_cols += idx.size
        costs.append(np.zeros(idx.size))
        _marginals(m, idx, np.searchsorted(sv, split.src[:, j]), u0, 0, len(sv), True)
        _marginals(m, idx, np.searchsorted(dv, split.dst[:, j]), v0, 1, len(dv), True)
        pair.append(idx)
    for r, values in enumerate(split.values):
        ci, ck = np.nonzero((values != 0).any(axis=2))
        if not len(ci):
            continue
        nf = values.shape[2]
        y = n_cols + np.arange(len(ci) * nf).reshape(len(ci), nf)
        n_cols += y.size
        costs.append(values[ci, ck, :].ravel() / scale)
        m.add(np.repeat(np.arange(len(ci)), nf), y.ravel(), np.ones(y.size))
        m.add(np.arange(len(ci)), pair[r][ci, ck], -np.ones(len(ci)))
        m.close_rows(len(ci), 0.0, 0.0)
        for bit, (j, kind) in enumerate(split.features[r]):
            on = ((np.arange(nf) >> bit) & 1).astype(bool)
            sv, dv = split.src_values[j], split.dst_values[j]
            if kind == BSPLIT:  # F = sum of p_j over cells split on both sides
                f_cols, coef, c0 = pair[j][np.ix_(sv >= 0, dv >= 0)].ravel(), 1.0, 0.0
            elif kind == ASPLIT:  # F = sum of p_j over cells split on both sides, dims differ
                moved = (sv[:, None] >= 0) & (dv[None, :] >= 0) & (sv[:, None] != dv[None, :])
                f_cols, coef, c0 = pair[j][moved].ravel(), 1.0, 0.0
            else:  # F = 1 - p_j[replicated, replicated]
                f_cols, coef, c0 = pair[j][np.ix_(sv < 0, dv < 0)].ravel(), -1.0, 1.0
            for cells, sign, rhs in ((y[:, on], -1.0, c0), (y[:, ~on], 1.0, 1.0 - c0)):
                cells = cells.ravel()
                m.add(np.zeros(len(cells), dtype=np.int64), cells, np.ones(len(cells)))
                m.add(
                    np.zeros(len(f_cols), dtype=np.int64),
                    f_cols,
                    np.full(len(f_cols), sign * coef),
                )
                m.close_rows(1, -np.inf, rhs)
    return n_cols


def formulate(
    model: CostModel,
    memory: float | None,
    opts: CostOptions,
    max_pair_columns: int | None = MAX_PAIR_COLUMNS,
    split: str = "auto",
):
    """The MILP arrays: (c, integrality, bounds, constraint, scale, size, x offsets)."""
    unary = model.unary
    n_x = int(sum(len(u) for u in unary))
    x_off = np.concatenate([[0], np.cumsum([len(u) for u in unary])]).astype(np.int64)
    pair_cols = sum(_pair_columns(p, split) for p in model.pairs)
    if max_pair_columns is not None and pair_cols > max_pair_columns:
        raise SolverError(
            f"ilp did not finish: the formulation of {model.space.graph.name!r} on mesh "
            f"{model.space.mesh.text()} would have {pair_cols:,} pair columns (limit "
            f"{max_pair_columns:,}) and {n_x:,} binaries; use drec, a smaller model or fewer "
            "devices"
        )
    mins = sum(float(u.min()) for u in unary)
    scale = mins if mins > 0 else max(float(max(np.abs(u).max() for u in unary)), 1e-30)
    costs = [np.concatenate(unary) / scale]
    m = _Matrix()
    # one-hot rows
    m.add(np.repeat(np.arange(len(unary)), [len(u) for u in unary]), np.arange(n_x), np.ones(n_x))
    m.close_rows(len(unary), 1.0, 1.0)
    n_cols = n_x
    n_split = 0
    for p in model.pairs:
        if _uses_split(p, split):
            n_split += 1
            n_cols = _split_block(m, p, x_off, n_cols, scale, costs)
        else:
            n_cols = _table_block(m, p, x_off, n_cols, scale, costs)
    integrality = np.concatenate([np.ones(n_x), np.zeros(n_cols - n_x)])
    lower = np.zeros(n_cols)
    upper = np.ones(n_cols)
    if memory is not None:
        graph, mesh = model.space.graph, model.space.mesh
        pieces = memory_piece_arrays(graph, mesh.rounds, model.space.strategies, opts)
        additive = np.concatenate([pc.param + pc.activation for pc in pieces]) / memory
        if opts.train:
            m.add(np.zeros(n_x, dtype=np.int64), np.arange(n_x), additive)
            m.close_rows(1, -np.inf, 1.0)
        else:
            p_col = n_cols
            n_cols += 1
            costs.append(np.zeros(1))
            integrality = np.append(integrality, 0.0)
            lower, upper = np.append(lower, 0.0), np.append(upper, np.inf)
            m.add(np.zeros(n_x, dtype=np.int64), np.arange(n_x), additive)
            m.add(np.zeros(1, dtype=np.int64), np.array([p_col]), np.array([-1.0]))
            m.close_rows(1, 0.0, 0.0)
            for u, pc in enumerate(pieces):
                k = len(pc.working_set)
                m.add(np.zeros(k, dtype=np.int64), x_off[u] + np.arange(k), pc.working_set / memory)
                m.add(np.zeros(1, dtype=np.int64), np.array([p_col]), np.array([1.0]))
                m.close_rows(1, -np.inf, 1.0)
    a, lo, hi = m.build(n_cols)
    size = {
        "binaries": n_x,
        "continuous": n_cols - n_x,
        "rows": int(a.shape[0]),
        "nonzeros": int(a.nnz),
        "split_terms": n_split,
    }
    return (
        np.concatenate(costs),
        integrality,
        Bounds(lower, upper),
        LinearConstraint(a, lo, hi),
        scale,
        size,
        x_off,
    )


def solve_model(
    model: CostModel,
    opts: CostOptions,
    memory: float | None = None,
    time_limit: float = 60.0,
    mip_rel_gap: float = 1e-7,
    max_pair_columns: int | None = MAX_PAIR_COLUMNS,
    split: str = "auto",
    fixed: Mapping[int, int] | None = None,
) -> IlpResult:
    """Run HiGHS on the model; raise InfeasibleError / SolverError as the module doc says.
    `fixed` maps an op index to the only strategy index it may take."""
    start = time.perf_counter()
    graph, mesh = model.space.graph, model.space.mesh
    c, integrality, bounds, constraint, scale, size, x_off = formulate(
        model, memory, opts, max_pair_columns, split
    )
    for u, k in (fixed or {}).items():  # pin: every other strategy of op u is bounded to 0
        bounds.ub[x_off[u] : x_off[u + 1]] = 0.0
        bounds.ub[x_off[u] + k] = 1.0
    remaining = time_limit - (time.perf_counter() - start)
    if remaining <= 0:
        raise SolverError(f"ilp did not finish within {time_limit:g} s (building the MILP)")
    res = milp(
        c,
        integrality=integrality,
        bounds=bounds,
        constraints=constraint,
        options={"time_limit": remaining, "mip_rel_gap": mip_rel_gap, "disp": False},
    )
    where = f"{graph.name!r} on mesh {mesh.text()}"
    if res.status == 2:
        budget = f" within {units.nbytes(memory)} per device" if memory is not None else ""
        raise InfeasibleError(
            f"ilp: no plan of {where} fits{budget}: HiGHS proved the MILP infeasible; use more "
            "devices, a smaller batch or a larger --memory"
        )
    if res.x is None:
        raise SolverError(
            f"ilp did not finish within {time_limit:g} s on {where}: HiGHS found no feasible "
            f"plan ({res.message}); formulation {size}"
        )
    choice = []
    for u in range(len(model.unary)):
        block = res.x[x_off[u] : x_off[u + 1]]
        choice.append(int(np.argmax(block)))
    gap = float(getattr(res, "mip_gap", 0.0) or 0.0)
    if res.status == 0:
        status = "optimal"
    elif res.status == 1:
        status = f"time-limit (gap {100 * gap:.2f}%)"
    else:  # pragma: no cover - HiGHS reports other failures without a usable point
        status = f"solver stopped: {res.message} (gap {100 * gap:.2f}%)"
    return IlpResult(
        tuple(choice),
        model.objective(choice),
        float(res.fun) * scale + model.constant,
        status,
        gap,
        size,
        time.perf_counter() - start,
        float(getattr(res, "mip_dual_bound", float("nan")) or 0.0) * scale + model.constant,
    )


def solve_ilp(
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    memory: float | None = None,
    time_limit: float = 60.0,
    mip_rel_gap: float = 1e-7,
    max_strategies: int | None = MAX_STRATEGIES,
    max_pair_columns: int | None = MAX_PAIR_COLUMNS,
    split: str = "auto",
    max_table_entries: int | None = MAX_TABLE_ENTRIES,
    fixed: Mapping[str, Strategy] | None = None,
    incumbent: Mapping[str, Strategy] | None = None,
) -> Plan:
    """The optimal plan of our cost model (or the best HiGHS found within `time_limit` seconds,
    with the gap in its status); `memory` bounds the bytes per device. `fixed` pins ops to a
    strategy; `incumbent` (e.g. D-Rec's plan) is returned instead when HiGHS ends without a plan
    or with a costlier one, with a status saying so (scipy's HiGHS takes no starting point)."""
    start = time.perf_counter()

    def keep(status: str, notes: tuple[str, ...]) -> Plan:
        """The incumbent as the answer, with a status saying why."""
        assert incumbent is not None
        seconds = time.perf_counter() - start
        return Plan(graph, mesh, incumbent, "ilp", opts, seconds, status=status, notes=notes)

    try:
        result = _solve_ilp(
            graph,
            mesh,
            opts,
            memory,
            time_limit,
            mip_rel_gap,
            max_strategies,
            max_pair_columns,
            split,
            max_table_entries,
            fixed,
        )
    except SolverError as e:
        if incumbent is None:
            raise
        reason = "did not finish" if "did not finish" in str(e) else "failed"
        return keep(
            f"{reason}: no ILP plan, D-Rec's plan kept (not proven optimal)", (f"ilp: {e}",)
        )
    if incumbent is not None and result.status != "optimal":
        kept = Plan(graph, mesh, incumbent, "ilp", opts)
        assert kept.cost is not None and result.cost is not None
        if kept.cost.total < result.cost.total:
            return keep(f"{result.status}: D-Rec's plan kept, cheaper than the ILP's", result.notes)
    return result


def _solve_ilp(
    graph: Graph,
    mesh: Mesh,
    opts: CostOptions,
    memory: float | None,
    time_limit: float,
    mip_rel_gap: float,
    max_strategies: int | None,
    max_pair_columns: int | None,
    split: str,
    max_table_entries: int | None,
    fixed: Mapping[str, Strategy] | None,
) -> Plan:
    start = time.perf_counter()
    table_limit = None if split == "never" else SPLIT_ABOVE
    model = build_timed_model(
        graph, mesh, opts, "ilp", start, time_limit, max_strategies, max_table_entries, table_limit
    )
    remaining = time_limit - (time.perf_counter() - start)
    if remaining <= 0:
        raise SolverError(f"ilp did not finish within {time_limit:g} s (building the cost tables)")
    pins: dict[int, int] = {}
    for name, strategy in (fixed or {}).items():
        options = model.space.of(name)
        if tuple(strategy) not in options:
            raise SolverError(f"ilp: fixed strategy {strategy} of op {name!r} is not in its space")
        pins[graph.op_index[name]] = options.index(tuple(strategy))
    result = solve_model(model, opts, memory, remaining, mip_rel_gap, max_pair_columns, split, pins)
    size = result.size
    note = (
        f"ilp: {size['binaries']} binaries, {size['continuous']} continuous, {size['rows']} rows, "
        f"{size['nonzeros']} nonzeros; tables {units.seconds(model.build_seconds)}, "
        f"HiGHS {units.seconds(result.seconds)}; dual bound "
        f"{units.cost(result.bound, 'elements' if opts.preset.symbolic else 's')}"
    )
    return model.plan(result.choice, "ilp", opts, start, result.status, (note,))
