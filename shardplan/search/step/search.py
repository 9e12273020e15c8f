"""The training-step search: pipeline stages S, micro-batches m, stage boundaries and per-stage
recomputation and ZeRO stage, with D-Rec planning each stage's sub-graph on the stage's devices.

For each S dividing the outermost mesh axis (at most one stage per two segments) and a few m
(divisors of the global batch, largest first, keeping at least one sample per way of the stage's
outer axis):
  1. build the graph at the micro-batch size (batch / m) and cut it into segments (ir/segments);
  2. stage boundaries: a DP over segment prefixes minimising the largest stage's FLOPs,
     f[s][j] = min_i max(f[s-1][i], F[j] - F[i]) — O(K^2 S) with numpy over i;
  3. each stage's sub-graph is planned by D-Rec on the stage mesh (outer axis / S x the rest);
     sub-graphs of the same structure (the middle stages of a uniform model) are planned once
     and the strategies mapped by op position, so a candidate costs at most a few D-Rec runs;
  4. per stage, the levers (recomputation none/selective/full x ZeRO 0-3, and sequence
     parallelism for a stage plan with tensor-parallel rounds, `cost/sequence.py`) with the
     shortest step share that fits the budget, preferring the least intrusive among equals — so
     a lever is on only where memory or time needs it;
  5. the step model (cost/step.py) scores the candidate; the fastest that fits wins.
Each candidate's step is bounded below by m + S - 1 slots of its heaviest stage's compute with
every op split ideally (its FLOPs and bytes at the global batch divided by m x the stage's
devices, priced by the roofline: a real piece moves and computes at least that much); candidates
run in order of that bound and the search stops when it reaches the best step found.
Progress goes to `progress` (the CLI prints it on stderr).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from shardplan import checks, units
from shardplan.cost import CostOptions
from shardplan.cost.sequence import tensor_rounds
from shardplan.cost.step import (
    Levers,
    Recompute,
    StageProfile,
    profile_stage,
    stage_cost,
)
from shardplan.cost.work import ideal_compute, whole_op_bytes
from shardplan.errors import InfeasibleError, PlanError, SolverError
from shardplan.ir.graph import Graph
from shardplan.ir.segments import segments, subgraph
from shardplan.mesh import Mesh
from shardplan.plans import Plan
from shardplan.problem import Problem
from shardplan.search import experts
from shardplan.search.drec.search import drec
from shardplan.search.step.notes import axis_summary, lever_notes
from shardplan.search.step.stages import (
    stage_graphs,
    stage_mesh,
    stage_starts,
    tokens_per_sample,
)
from shardplan.sharding import Strategy
from shardplan.training import TrainingPlan, assemble, at_precision

Progress = Callable[[str], None]
Planner = Callable[[Graph, Mesh, CostOptions], Mapping[str, Strategy]]

LEVERS: tuple[Levers, ...] = tuple(
    Levers(r, z)
    for z in (0, 1, 2, 3)
    for r in (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
)
"""Every lever combination, least intrusive first (ties go to the earlier one)."""


def _fingerprint(graph: Graph) -> tuple[object, ...]:
    """Structure of a graph up to names: equal fingerprints get equal D-Rec strategies."""
    seen: dict[str, int] = {}
    out: list[object] = []
    for i, op in enumerate(graph.ops):
        refs: list[object] = []
        for name in op.inputs:
            t = graph.tensors[name]
            p = graph.producer.get(name)
            if p is not None:
                refs.append(("op", i - p, graph.ops[p].outputs.index(name)))
            else:
                refs.append(("t", t.shape, t.role.value, t.dtype_bytes, seen.setdefault(name, i)))
        out.append((op.kind, op.signature.text(), op.flops, op.attrs, tuple(refs)))
    return tuple(out)


class _StagePlanner:
    """D-Rec per distinct segment of a stage (cached by fingerprint and stage mesh); the stage's
    strategies are its segments' strategies side by side, scored by the evaluator as a whole
    (the redistributions between segments included)."""

    def __init__(self, opts: CostOptions, planner: Planner) -> None:
        self.opts, self.planner = opts, planner
        self.cache: dict[tuple[object, ...], tuple[Strategy, ...]] = {}
        self.stages: dict[
            tuple[object, ...], list[tuple[str, tuple[Strategy, ...], StageProfile]]
        ] = {}
        self.runs = 0

    def strategies(self, graph: Graph, mesh: Mesh) -> dict[str, Strategy]:
        key = (mesh.shape, _fingerprint(graph))
        cached = self.cache.get(key)
        if cached is None:
            found = self.planner(graph, mesh, self.opts)
            cached = self.cache[key] = tuple(found[op.name] for op in graph.ops)
            self.runs += 1
        return {op.name: s for op, s in zip(graph.ops, cached, strict=True)}

    def plan(self, graph: Graph, mesh: Mesh, whole: bool = False) -> Plan:
        """`whole`: one D-Rec run on the stage; else one per distinct segment."""
        if whole:
            strategies = self.strategies(graph, mesh)
        else:
            strategies = {}
            for seg in segments(graph):
                strategies.update(self.strategies(subgraph(graph, seg.start, seg.stop), mesh))
        return Plan(graph, mesh, strategies, "drec", self.opts)

    def stage(self, graph: Graph, mesh: Mesh) -> list[tuple[Plan, StageProfile]]:
        """Candidate plans of a stage with their profiles: D-Rec (per segment), and the
        data-parallel and Megatron expert plans (whole-plan alternatives, as D-Rec compares
        its rounds with). Stages of one structure (the middle stages of a uniform model) are
        planned and evaluated once."""
        key = (mesh.shape, _fingerprint(graph))
        hit = self.stages.get(key)
        if hit is None:
            strategies: dict[str, Strategy] = {}
            for seg in segments(graph):
                strategies.update(self.strategies(subgraph(graph, seg.start, seg.stop), mesh))
            found = [("drec", strategies)]
            found.append(("data-parallel", experts.data_parallel(graph, mesh)))
            if mesh.shape[-1] > 1:  # tensor parallelism on the innermost axis (1-D meshes too)
                found.append(("megatron", experts.megatron(graph, mesh)))
            hit = self.stages[key] = [
                (
                    method,
                    tuple(st[op.name] for op in graph.ops),
                    profile_stage(graph, mesh, st, self.opts, sequence_parallel=sp),
                    tuple(op.name for op in graph.ops),
                )
                for method, st in found
                # a tensor-parallel plan is also tried with sequence parallelism
                for sp in ((False, True) if tensor_rounds(graph, mesh, st) else (False,))
            ]
        out = []
        for method, cached, prof, names in hit:
            mapped = {op.name: s for op, s in zip(graph.ops, cached, strict=True)}
            # the per-op rows were priced on the first stage of this structure: same position,
            # same cost, under this stage's own op names
            rename = {old: op.name for old, op in zip(names, graph.ops, strict=True)}
            rows = tuple(replace(c, name=rename.get(c.name, c.name)) for c in prof.breakdown.ops)
            cost = replace(prof.breakdown, ops=rows)
            out.append((Plan(graph, mesh, mapped, method, self.opts, cost=cost), prof))
        return out


def choose_levers(
    profile: StageProfile, m: int, in_flight: int, slots: int, budget: float | None
) -> tuple[float, Levers] | None:
    """The levers giving this stage the shortest (slots x slot share + sync) within `budget`,
    with that time; None when no combination fits."""
    best: tuple[float, Levers] | None = None
    for lv in LEVERS:
        lv = replace(lv, sequence_parallel=profile.sequence_parallel)
        c = stage_cost(profile, lv, m, in_flight)
        if budget is not None and c.memory_bytes > budget:
            continue
        t = slots * (c.fwd_s + c.bwd_s) + c.sync_s
        if best is None or t < best[0] * (1 - 1e-9):
            best = (t, lv)
    return best


def micro_batch_options(batch: int, stage: Mesh) -> list[int]:
    """Values of m, largest first: micro-batches of one sample per device of the stage (data
    parallelism can use every device), per way of its outermost axis and per way of all axes
    but the innermost (the rest is left to tensor parallelism), when they divide the batch, and
    m = 1 when the stage has more devices than the batch has samples; else the largest m that
    keeps one sample per way of the outermost axis."""
    # per device; per way of the outer axis; per data-parallel way with the innermost axis
    # tensor-parallel (the Megatron recipe's micro-batch of one sample)
    sizes = {
        stage.size,
        stage.shape[0] if len(stage.shape) > 1 else stage.size,
        stage.size // stage.shape[-1],
    }
    ms = {batch // b for b in sizes if b <= batch and batch % b == 0}
    if any(b > batch for b in sizes):  # more devices than samples: the whole batch at once
        ms.add(1)
    if ms:
        return sorted(ms, reverse=True)
    need = stage.shape[0] if len(stage.shape) > 1 else 1
    # a batch smaller than the outer axis (batch 1 on 2x4): one micro-batch, the batch unsplit
    fits = [m for m in range(1, batch + 1) if batch % m == 0 and batch // m >= need]
    return [max(fits, default=1)]


def plan_training(
    build: Callable[[int], Graph | None],
    batch: int,
    mesh: Mesh,
    opts: CostOptions,
    budget: float | None,
    progress: Progress | None = None,
    planner: Planner | None = None,
    stages: Sequence[int] | None = None,
) -> TrainingPlan:
    """The pre-issue-22 entry point, kept for scripts: `search_step` on the Problem of these
    arguments (`sp.plan(build, mesh, method="step", batch=..., ...)` is the front door)."""
    probe = build(batch)
    if probe is None:
        raise SolverError(f"the model builder returned no graph at the global batch {batch}")
    problem = Problem(probe, mesh, opts, budget, None, batch, build)
    return search_step(problem, progress, planner, stages)


def search_step(
    problem: Problem,
    progress: Progress | None = None,
    planner: Planner | None = None,
    stages: Sequence[int] | None = None,
) -> TrainingPlan:
    """Search S, m, boundaries and levers (module docstring) for `problem` (its builder gives
    the model at each micro-batch size). InfeasibleError naming the leanest candidate when
    nothing fits the budget."""
    opts, budget, batch = problem.options, problem.budget, problem.global_batch
    if budget is not None:
        checks.memory_bytes(budget, "training memory budget")  # NaN, inf, <= 0: MeshError
    mesh = at_precision(problem.mesh, opts)
    say = progress or (lambda _msg: None)
    start = time.perf_counter()
    search = _StepSearch(problem, mesh, _StagePlanner(opts, planner or _drec_planner))
    best: TrainingPlan | None = None
    tried = 0
    # candidates in order of their bound; stop at the first that cannot beat the best found
    for bound, n_stages, m, starts in _candidates(problem.graph, mesh, batch, opts, stages):
        if best is not None and best.step is not None and bound >= best.step.step_s:
            say(f"  the remaining candidates cannot beat {units.seconds(best.step.step_s)} (bound)")
            break
        tried += 1
        label = f"S={n_stages} m={m} (micro-batch {batch // m})"
        tp = search.candidate(n_stages, m, starts, say)
        elapsed = time.perf_counter() - start
        if tp is None:
            say(f"  {label}: does not fit ({elapsed:.1f} s)")
            continue
        assert tp.step is not None
        say(
            f"  {label}: step {units.seconds(tp.step.step_s)}, "
            f"{units.nbytes(tp.step.memory_per_device)}/device, "
            f"{search.stage_planner.runs} D-Rec runs so far ({elapsed:.1f} s)"
        )
        if best is None or _better(tp, best):
            best = tp
    if best is None:
        raise search.infeasible(tried)
    return replace(
        best,
        axes=axis_summary(best),
        search_seconds=time.perf_counter() - start,
        notes=lever_notes(best, budget),
        step=best.step,
    )


def _drec_planner(graph: Graph, mesh: Mesh, opts: CostOptions) -> Mapping[str, Strategy]:
    return drec(graph, mesh, opts)


def _candidates(
    probe: Graph, mesh: Mesh, batch: int, opts: CostOptions, stages: Sequence[int] | None
) -> list[tuple[float, int, int, list[int]]]:
    """(lower bound of the step, S, m, stage starts) of every candidate, in bound order: m + S
    - 1 slots of at least the heaviest stage's compute with every op split ideally."""
    segs = segments(probe)
    outer = mesh.shape[0]
    s_options = [s for s in range(1, outer + 1) if outer % s == 0 and 2 * s <= len(segs)]
    if stages is not None:
        s_options = [checks.positive_int(s, "pipeline stages") for s in stages]
    sizes = [(op.flops, whole_op_bytes(probe, op, opts)) for op in probe.ops]
    candidates = []
    for n_stages in s_options:
        if outer % n_stages:
            raise PlanError(
                f"{n_stages} pipeline stages must divide the outermost mesh axis {outer}"
            )
        smesh = stage_mesh(mesh, n_stages)
        starts = stage_starts(probe, n_stages)  # PlanError: more stages than segments
        ends = [*starts[1:], len(segs)]
        for m in micro_batch_options(batch, smesh):
            k = m * smesh.size
            slot = max(
                sum(
                    ideal_compute(f, b, k, opts, smesh)
                    for f, b in sizes[segs[a].start : segs[e - 1].stop]
                )
                for a, e in zip(starts, ends, strict=True)
            )
            candidates.append(((m + n_stages - 1) * slot, n_stages, m, starts))
    return sorted(candidates, key=lambda c: (c[0], c[1], c[2]))


class _StepSearch:
    """One candidate (S, m, stage starts) at a time: its stages' plans and levers, assembled
    into a TrainingPlan; remembers the leanest stage that did not fit, for the error."""

    def __init__(self, problem: Problem, mesh: Mesh, stage_planner: _StagePlanner) -> None:
        self.problem, self.mesh, self.stage_planner = problem, mesh, stage_planner
        self.build = problem.builder()
        self.built: dict[int, Graph | None] = {}
        self.leanest: tuple[float, str] | None = None

    def candidate(
        self, n_stages: int, m: int, starts: Sequence[int], say: Progress
    ) -> TrainingPlan | None:
        """The best plan of this candidate, or None when a stage fits no lever."""
        batch, budget = self.problem.global_batch, self.problem.budget
        if m not in self.built:
            self.built[m] = self.build(batch // m)
        graph = self.built[m]
        if graph is None:
            say(f"  m={m}: the model cannot be rebuilt at micro-batch {batch // m}; skipped")
            return None
        smesh = stage_mesh(self.mesh, n_stages)
        chosen = []
        for s, sub in enumerate(stage_graphs(graph, starts)):
            in_flight = min(n_stages - s, m)
            options = []
            for plan, prof in self.stage_planner.stage(sub, smesh):
                fit = choose_levers(prof, m, in_flight, m + n_stages - 1, budget)
                if fit is not None:
                    options.append((fit[0], len(options), plan, prof, fit[1]))
                else:
                    need = min(
                        stage_cost(
                            prof, replace(x, sequence_parallel=prof.sequence_parallel), m, in_flight
                        ).memory_bytes
                        for x in LEVERS
                    )
                    if self.leanest is None or need < self.leanest[0]:
                        self.leanest = (need, f"S={n_stages} m={m} stage {s}")
            if not options:
                return None
            _, _, plan, prof, lv = min(options, key=lambda o: (o[0], o[1]))
            chosen.append((plan, prof, lv))
        probe = self.problem.graph
        return assemble(
            probe.name, self.mesh, batch, chosen, m, "drec", tokens_per_sample(probe, batch)
        )

    def infeasible(self, tried: int) -> InfeasibleError:
        leanest, budget = self.leanest, self.problem.budget
        detail = f"; the leanest ({leanest[1]}) needs {units.nbytes(leanest[0])}" if leanest else ""
        return InfeasibleError(
            f"no training plan of {self.problem.graph.name!r} fits "
            f"{units.nbytes(budget or 0)} per device on mesh {self.mesh.text()} with any of "
            f"{tried} (stages, micro-batches) candidates, recomputation and ZeRO{detail}; use "
            "more devices or a larger --memory"
        )


def _better(a: TrainingPlan, b: TrainingPlan) -> bool:
    """Faster wins; on a tie, fewer stages, then fewer micro-batches (the simpler plan)."""
    assert a.step is not None and b.step is not None
    if a.step.step_s < b.step.step_s * (1 - 1e-9):
        return True
    tie = a.step.step_s <= b.step.step_s * (1 + 1e-9)
    return tie and (a.pipeline_stages, a.micro_batches) < (b.pipeline_stages, b.micro_batches)
