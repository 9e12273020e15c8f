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
  4. per stage, the levers (recomputation none/selective/full x ZeRO 0-3) with the shortest step
     share that fits the budget, preferring the least intrusive among equals — so a lever is on
     only where memory needs it;
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

import numpy as np

from shardplan import units
from shardplan.cost import CostOptions
from shardplan.cost.evaluate import op_bytes
from shardplan.cost.step import (
    Levers,
    Recompute,
    StageProfile,
    profile_stage,
    stage_cost,
)
from shardplan.cost.terms import compute_cost
from shardplan.errors import InfeasibleError, SolverError
from shardplan.ir.graph import Graph
from shardplan.ir.segments import segments, subgraph
from shardplan.mesh import Mesh
from shardplan.plans import Plan
from shardplan.search import experts
from shardplan.search.drec import drec
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


def stage_mesh(mesh: Mesh, stages: int) -> Mesh:
    """The devices of one stage: the outermost axis divided by the number of stages."""
    shape = (mesh.shape[0] // stages, *mesh.shape[1:])
    return replace(mesh, shape=shape)


def balanced_stages(costs: Sequence[float], stages: int) -> list[int]:
    """Start index of each of `stages` contiguous groups of `costs` minimising the largest
    group's sum (DP over prefixes, see the module docstring). Needs len(costs) >= stages."""
    k = len(costs)
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(costs, dtype=float))])
    f = np.full((stages + 1, k + 1), np.inf)
    arg = np.zeros((stages + 1, k + 1), dtype=int)
    f[0, 0] = 0.0
    for s in range(1, stages + 1):
        for j in range(s, k + 1):
            i = np.arange(s - 1, j)
            vals = np.maximum(f[s - 1, i], prefix[j] - prefix[i])
            best = int(np.argmin(vals))
            f[s, j], arg[s, j] = vals[best], i[best]
    starts, j = [], k
    for s in range(stages, 0, -1):
        j = int(arg[s, j])
        starts.append(j)
    return starts[::-1]


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
            if len(mesh.shape) > 1 and mesh.shape[-1] > 1:
                found.append(("megatron", experts.megatron(graph, mesh)))
            hit = self.stages[key] = [
                (
                    method,
                    tuple(st[op.name] for op in graph.ops),
                    profile_stage(graph, mesh, st, self.opts),
                )
                for method, st in found
            ]
        out = []
        for method, cached, prof in hit:
            mapped = {op.name: s for op, s in zip(graph.ops, cached, strict=True)}
            out.append((Plan(graph, mesh, mapped, method, self.opts, cost=prof.breakdown), prof))
        return out


def choose_levers(
    profile: StageProfile, m: int, in_flight: int, slots: int, budget: float | None
) -> tuple[float, Levers] | None:
    """The levers giving this stage the shortest (slots x slot share + sync) within `budget`,
    with that time; None when no combination fits."""
    best: tuple[float, Levers] | None = None
    for lv in LEVERS:
        c = stage_cost(profile, lv, m, in_flight)
        if budget is not None and c.memory_bytes > budget:
            continue
        t = slots * (c.fwd_s + c.bwd_s) + c.sync_s
        if best is None or t < best[0] * (1 - 1e-9):
            best = (t, lv)
    return best


def micro_batch_options(batch: int, stage: Mesh) -> list[int]:
    """Values of m, largest first: micro-batches of one sample per device of the stage (data
    parallelism can use every device) and of one sample per way of its outermost axis (the
    rest is left to tensor parallelism), when they divide the batch; else the largest m that
    keeps one sample per way of the outermost axis."""
    sizes = {stage.size, stage.shape[0] if len(stage.shape) > 1 else stage.size}
    ms = sorted({batch // b for b in sizes if b <= batch and batch % b == 0}, reverse=True)
    if ms:
        return ms
    need = stage.shape[0] if len(stage.shape) > 1 else 1
    return [max(m for m in range(1, batch + 1) if batch % m == 0 and batch // m >= need)]


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
    """Search S, m, boundaries and levers (module docstring); `build(b)` returns the model at
    batch b. Raises InfeasibleError naming the leanest candidate when nothing fits."""
    mesh = at_precision(mesh, opts)
    say = progress or (lambda _msg: None)
    start = time.perf_counter()
    stage_planner = _StagePlanner(opts, planner or (lambda g, m, o: drec(g, m, o)))
    probe = build(batch)
    if probe is None:
        raise SolverError(f"the model builder returned no graph at the global batch {batch}")
    segs = segments(probe)
    flops = [sum(op.flops for op in probe.ops[s.start : s.stop]) for s in segs]
    outer = mesh.shape[0]
    s_options = stages or [s for s in range(1, outer + 1) if outer % s == 0 and 2 * s <= len(segs)]
    sizes = [(op.flops, op_bytes(probe, op, (), (), opts)) for op in probe.ops]
    candidates = []  # (lower bound of the step, S, m, stage starts)
    for n_stages in s_options:
        smesh = stage_mesh(mesh, n_stages)
        starts = balanced_stages(flops, n_stages)
        ends = [*starts[1:], len(segs)]
        for m in micro_batch_options(batch, smesh):
            # m + S - 1 slots of at least the heaviest stage's compute, every op split ideally
            k = m * smesh.size
            slot = max(
                sum(
                    compute_cost(f / k, b / k, opts, smesh)
                    for f, b in sizes[segs[a].start : segs[e - 1].stop]
                )
                for a, e in zip(starts, ends, strict=True)
            )
            candidates.append(((m + n_stages - 1) * slot, n_stages, m, starts))
    best: TrainingPlan | None = None
    leanest: tuple[float, str] | None = None
    tried = 0
    built: dict[int, Graph | None] = {}
    # candidates in order of their bound; stop at the first that cannot beat the best found
    for bound, n_stages, m, starts in sorted(candidates, key=lambda c: (c[0], c[1], c[2])):
        smesh = stage_mesh(mesh, n_stages)
        if best is not None and best.step is not None and bound >= best.step.step_s:
            say(f"  the remaining candidates cannot beat {units.seconds(best.step.step_s)} (bound)")
            break
        tried += 1
        if m not in built:
            built[m] = build(batch // m)
        graph = built[m]
        if graph is None:
            say(f"  m={m}: the model cannot be rebuilt at micro-batch {batch // m}; skipped")
            continue
        gsegs = segments(graph)
        bounds = [gsegs[i].start for i in starts] + [len(graph.ops)]
        plans, profiles, levers = [], [], []
        for s in range(n_stages):
            sub = subgraph(graph, bounds[s], bounds[s + 1], f"{graph.name}.stage{s}")
            in_flight = min(n_stages - s, m)
            options = []
            for plan, prof in stage_planner.stage(sub, smesh):
                chosen = choose_levers(prof, m, in_flight, m + n_stages - 1, budget)
                if chosen is not None:
                    options.append((chosen[0], len(options), plan, prof, chosen[1]))
                else:
                    need = min(stage_cost(prof, x, m, in_flight).memory_bytes for x in LEVERS)
                    if leanest is None or need < leanest[0]:
                        leanest = (need, f"S={n_stages} m={m} stage {s}")
            if not options:
                break
            _, _, plan, prof, lv = min(options, key=lambda o: (o[0], o[1]))
            plans.append(plan)
            profiles.append(prof)
            levers.append(lv)
        label = f"S={n_stages} m={m} (micro-batch {batch // m})"
        elapsed = time.perf_counter() - start
        if len(levers) < n_stages:
            say(f"  {label}: does not fit ({elapsed:.1f} s)")
            continue
        tp = assemble(
            probe.name,
            mesh,
            batch,
            list(zip(plans, profiles, levers, strict=True)),
            m,
            "drec",
            _tokens_per_sample(probe, batch),
        )
        assert tp.step is not None
        say(
            f"  {label}: step {units.seconds(tp.step.step_s)}, "
            f"{units.nbytes(tp.step.memory_per_device)}/device, "
            f"{stage_planner.runs} D-Rec runs so far ({elapsed:.1f} s)"
        )
        if best is None or _better(tp, best):
            best = tp
    if best is None:
        detail = f"; the leanest ({leanest[1]}) needs {units.nbytes(leanest[0])}" if leanest else ""
        raise InfeasibleError(
            f"no training plan of {probe.name!r} fits "
            f"{units.nbytes(budget or 0)} per device on mesh {mesh.text()} with any of "
            f"{tried} (stages, micro-batches) candidates, recomputation and ZeRO{detail}; use "
            "more devices or a larger --memory"
        )
    notes = lever_notes(best, budget)
    return replace(
        best,
        axes=axis_summary(best),
        search_seconds=time.perf_counter() - start,
        notes=notes,
        step=best.step,
    )


def _better(a: TrainingPlan, b: TrainingPlan) -> bool:
    """Faster wins; on a tie, fewer stages, then fewer micro-batches (the simpler plan)."""
    assert a.step is not None and b.step is not None
    if a.step.step_s < b.step.step_s * (1 - 1e-9):
        return True
    tie = a.step.step_s <= b.step.step_s * (1 + 1e-9)
    return tie and (a.pipeline_stages, a.micro_batches) < (b.pipeline_stages, b.micro_batches)


def _tokens_per_sample(graph: Graph, batch: int) -> int:
    """Tokens per sample: the second dim of the first rank-2 graph input of leading dim `batch`
    (token ids), else 1 (then tokens/s equals samples/s)."""
    for t in graph.tensors.values():
        if t.role.value == "input" and len(t.shape) == 2 and t.shape[0] == batch:
            return t.shape[1]
    return 1


def lever_notes(tp: TrainingPlan, budget: float | None) -> tuple[str, ...]:
    """Say which levers the plan needed and why (each one is on only to meet the budget)."""
    notes: list[str] = []
    if tp.pipeline_stages > 1:
        step = tp.step
        assert step is not None
        notes.append(
            f"{tp.pipeline_stages} pipeline stages (1F1B) with {tp.micro_batches} micro-batches: "
            f"bubble {step.bubble_s / step.step_s:.1%} of the step"
        )
    elif tp.micro_batches > 1:
        notes.append(f"{tp.micro_batches} micro-batches (gradient accumulation)")
    methods: dict[str, list[int]] = {}
    for s, stage in enumerate(tp.stages):
        methods.setdefault(stage.plan.method, []).append(s)
    if set(methods) != {"drec"}:
        notes.append(
            "stage plans: "
            + "; ".join(
                f"{m} on stage{'s' if len(v) > 1 else ''} {_ranges(v)}"
                for m, v in sorted(methods.items())
            )
            + " (each stage keeps the fastest of D-Rec's plan and the expert plans under the "
            "step model)"
        )
    for s, stage in enumerate(tp.stages):
        lv = stage.levers
        used = []
        if lv.recompute is not Recompute.NONE:
            used.append(f"{lv.recompute.value} recomputation")
        if lv.zero:
            used.append(f"ZeRO-{lv.zero}")
        if used:
            why = (
                f"to fit {units.nbytes(budget)} per device" if budget else "faster under the model"
            )
            notes.append(f"stage {s}: {' and '.join(used)} {why}")
    return tuple(notes)


def _ranges(xs: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2, 5"."""
    out: list[str] = []
    for x in xs:
        if out and out[-1][1] == x - 1:
            out[-1] = (out[-1][0], x)
        else:
            out.append((x, x))  # type: ignore[arg-type]
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in out)  # type: ignore[misc]


def axis_summary(tp: TrainingPlan) -> tuple[str, ...]:
    """Per mesh axis: "pipeline xS", then what the stage plans' parameter ops cut on it
    (data: the batch loop dim, which the data-parallel expert cuts; tensor: any other dim)."""
    from shardplan.search.experts import data_parallel

    plan = max((s.plan for s in tp.stages), key=lambda p: p.graph.flops)
    dp = data_parallel(plan.graph, plan.mesh)
    param_ops = [
        op
        for op in plan.graph.ops
        if any(plan.graph.tensors[t].role.value == "parameter" for t in op.inputs)
    ]
    out = []
    for axis, name in enumerate(tp.mesh.names):
        parts = []
        if axis == 0 and tp.pipeline_stages > 1:
            parts.append(f"pipeline x{tp.pipeline_stages}")
        kinds: dict[str, int] = {}
        for r in plan.mesh.rounds:
            if r.mesh_axis != axis:
                continue
            weight = {"data": 0.0, "tensor": 0.0, "replicated": 0.0}
            for op in param_ops:
                cut = plan.strategies[op.name][r.index]
                kind = (
                    "replicated"
                    if cut is None
                    else "data"
                    if cut == dp[op.name][r.index]
                    else "tensor"
                )
                weight[kind] += op.flops
            kind = max(weight, key=lambda k: weight[k])
            kinds[kind] = kinds.get(kind, 1) * r.q
        parts += [f"{k} x{v}" for k, v in kinds.items()]
        out.append(f"{name} axis: {' + '.join(parts) or 'unused'}")
    return tuple(out)


def steps_note(tp: TrainingPlan) -> str:
    step = tp.step
    assert step is not None
    return (
        f"step {units.seconds(step.step_s)}, {units.rate(step.tokens_per_s, 'tokens')}, "
        f"{units.flop_rate(step.tflops_per_device * 1e12)} per device "
        f"({step.peak_fraction:.1%} of peak)"
    )
