"""The solver registry: each method's runner and its typed options, looked up once by name.

`SOLVERS[method]` is a `Solver`: a runner `(problem, options, start) -> Plan` and the frozen
dataclass of the options the method takes. `solver_options(method, given)` turns the keyword
options of `shardplan.plan` into that dataclass: an unknown method or option is a SolverError that
lists the valid ones, so nothing is passed to a solver blindly. Options left out keep the solver's
own defaults (they are not repeated here). O(1) per lookup.

Methods: "drec" (default; memory-aware driver in `search.drec.driver`), "ilp" (HiGHS), "dp"
(graph elimination), the expert plans "data-parallel", "megatron", "fsdp" — each returns a Plan —
and the training step: "step" (the search over pipeline stages, micro-batches, levers and stage
plans, `search.step.search`) and "megatron-recipe" (the hand recipe with its knobs,
`search.step.recipes`), which return a TrainingPlan.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from types import MappingProxyType
from typing import Any

from shardplan import checks
from shardplan.errors import SolverError
from shardplan.plans import Plan
from shardplan.problem import Problem
from shardplan.search import experts
from shardplan.sharding import check_fixed
from shardplan.training import TrainingPlan


class _Unset:
    def __repr__(self) -> str:
        return "<solver default>"


UNSET: Any = _Unset()
"""An option left to the solver's own default."""


@dataclass(frozen=True, slots=True)
class NoOptions:
    """The expert plans take no options."""


@dataclass(frozen=True, slots=True)
class DrecOptions:
    """D-Rec's options: `fixed` op name -> strategy the plan keeps (`--force`)."""

    fixed: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class IlpOptions:
    """`search.ilp.solve_ilp`'s options: seconds, MIP gap, enumeration limits, table split."""

    time_limit: float = UNSET
    mip_rel_gap: float = UNSET
    max_strategies: int | None = UNSET
    max_pair_columns: int | None = UNSET
    split: str = UNSET
    max_table_entries: int | None = UNSET
    fixed: Mapping[str, Any] | None = UNSET
    incumbent: Mapping[str, Any] | None = UNSET


@dataclass(frozen=True, slots=True)
class DpOptions:
    """`search.dp.solve_dp`'s options: seconds and enumeration limits."""

    time_limit: float = UNSET
    max_entries: int | None = UNSET
    max_strategies: int | None = UNSET


@dataclass(frozen=True, slots=True)
class StepOptions:
    """The training-step search's options: `stages` (the pipeline depths to try; None: every
    divisor of the outermost mesh axis the model's segments allow), `progress` (a callable
    that receives one line per candidate tried) and what the engine overlaps beyond tensor and
    context parallelism (`cost.overlap`; off: every collective added, the plans engine-neutral):
    `overlap_grad_reduce`, `overlap_p2p`, `prefetch` (ZeRO-3), `tp_comm_overlap` (sequence
    parallelism's collectives under their GEMMs, on the stages that run it)."""

    stages: tuple[int, ...] | None = None
    progress: Callable[[str], None] | None = None
    overlap_grad_reduce: bool = False
    overlap_p2p: bool = False
    prefetch: bool = False
    tp_comm_overlap: bool = False


@dataclass(frozen=True, slots=True)
class RecipeOptions:
    """The Megatron-LM recipe's knobs (`search.step.recipes.megatron_recipe`): tensor-parallel
    ways (default: the innermost mesh axis, one node), pipeline stages (default 1), micro-batch
    size, recomputation ("full", "selective", "none"); the step model's further levers where it
    has them (sequence_parallel, virtual_stages, context, distributed_optimizer, expert); the
    overlap knobs at Megatron-LM's defaults unless given (overlap_grad_reduce off, overlap_p2p
    on for the interleaved schedule, tp_comm_overlap off)."""

    tensor: int = UNSET
    pipeline: int = UNSET
    micro_batch_size: int = UNSET
    recompute: str = UNSET
    sequence_parallel: bool = UNSET
    virtual_stages: int = UNSET
    context: int = UNSET
    distributed_optimizer: bool = UNSET
    expert: int = UNSET
    overlap_grad_reduce: bool = UNSET
    overlap_p2p: bool = UNSET
    tp_comm_overlap: bool = UNSET


def given(options: Any) -> dict[str, Any]:
    """The options a caller set (the rest keep the solver's defaults)."""
    return {
        f.name: getattr(options, f.name)
        for f in fields(options)
        if getattr(options, f.name) is not UNSET
    }


@dataclass(frozen=True, slots=True)
class Solver:
    name: str
    options: type
    run: Callable[[Problem, Any, float], Plan | TrainingPlan]
    summary: str
    training: bool = False
    """Returns a TrainingPlan of the whole step (needs training options, a global batch)."""


def _run_drec(problem: Problem, options: DrecOptions, start: float) -> Plan:
    from shardplan.search.drec.driver import drec_within

    return drec_within(problem, start, options.fixed)


def _run_ilp(problem: Problem, options: IlpOptions, start: float) -> Plan:
    from shardplan.search.exact.ilp import solve_ilp

    p = problem
    kwargs = given(options)
    if kwargs.get("fixed"):
        kwargs["fixed"] = check_fixed(p.graph, p.mesh, kwargs["fixed"])
    return solve_ilp(p.graph, p.mesh, p.options, memory=p.budget, **kwargs)


def _run_dp(problem: Problem, options: DpOptions, start: float) -> Plan:
    from shardplan.search.exact.dp import solve_dp

    return solve_dp(problem.graph, problem.mesh, problem.options, **given(options))


def _expert(method: str) -> Callable[[Problem, NoOptions, float], Plan]:
    def run(problem: Problem, options: NoOptions, start: float) -> Plan:
        graph, mesh = problem.graph, problem.mesh
        params: dict[str, tuple[int, ...]] = {}
        strategies = (experts.megatron if method == "megatron" else experts.data_parallel)(
            graph, mesh
        )
        if method == "fsdp":
            params = experts.fsdp_param_layouts(graph, mesh)
        return Plan(
            graph, mesh, strategies, method, problem.options, time.perf_counter() - start, params
        )

    return run


def _check_step(problem: Problem, method: str) -> None:
    """The training-step model prices training with the shardplan preset, ZeRO per stage."""
    opts = problem.options
    if not opts.train or opts.preset.symbolic:
        raise SolverError(
            f"method {method!r} plans a training step: it needs train=True and the 'shardplan' "
            "preset (the symbolic preset has no compute or ZeRO prices)"
        )
    if problem.zero is not None and method == "step":
        raise SolverError(
            "method 'step' chooses the ZeRO stage per pipeline stage under the memory budget; "
            "drop zero= (or plan one SPMD plan with method 'drec' and zero=N)"
        )


def _run_step(problem: Problem, options: StepOptions, start: float) -> TrainingPlan:
    from shardplan.cost.levers import Levers
    from shardplan.cost.overlap import MEGATRON_BUCKET_FLOOR
    from shardplan.search.step.search import search_step

    _check_step(problem, "step")
    overlap = Levers(
        overlap_grad_reduce=options.overlap_grad_reduce,
        overlap_p2p=options.overlap_p2p,
        prefetch=options.prefetch,
        bucket_elements=MEGATRON_BUCKET_FLOOR if options.overlap_grad_reduce else 0,
        tp_comm_overlap=options.tp_comm_overlap,
    )
    return search_step(problem, options.progress, stages=options.stages, overlap=overlap)


def _run_recipe(problem: Problem, options: RecipeOptions, start: float) -> TrainingPlan:
    from shardplan.cost.step import Recompute
    from shardplan.search.step.recipes import megatron_recipe

    _check_step(problem, "megatron-recipe")
    knobs = given(options)
    if "recompute" in knobs:
        knobs["recompute"] = Recompute(knobs["recompute"])
    tensor = knobs.pop("tensor", problem.mesh.shape[-1])
    pipeline = knobs.pop("pipeline", 1)
    tp = megatron_recipe(
        problem.builder(),
        problem.global_batch,
        problem.mesh,
        problem.options,
        tensor,
        pipeline,
        **knobs,
    )
    return replace(tp, search_seconds=time.perf_counter() - start, step=tp.step)


SOLVERS: Mapping[str, Solver] = MappingProxyType(
    {
        s.name: s
        for s in (
            Solver("drec", DrecOptions, _run_drec, "D-Rec (default), memory-aware"),
            Solver("ilp", IlpOptions, _run_ilp, "exact ILP (HiGHS), time-limited"),
            Solver("dp", DpOptions, _run_dp, "OptCNN-style DP by graph elimination"),
            *(Solver(m, NoOptions, _expert(m), f"expert plan: {m}") for m in experts.EXPERTS),
            Solver(
                "step",
                StepOptions,
                _run_step,
                "training step: pipeline stages, micro-batches, levers, D-Rec stage plans",
                training=True,
            ),
            Solver(
                "megatron-recipe",
                RecipeOptions,
                _run_recipe,
                "training step: the Megatron-LM recipe with its knobs (tensor, pipeline, ...)",
                training=True,
            ),
        )
    }
)

METHODS = tuple(SOLVERS)


def get_solver(method: str) -> Solver:
    if not isinstance(method, str) or method not in SOLVERS:
        raise SolverError(f"unknown method {method!r}; choose one of {list(SOLVERS)}")
    return SOLVERS[method]


def solver_options(method: str, options: Mapping[str, Any]) -> Any:
    """The typed options of `method` from keyword options; SolverError naming any unknown one."""
    solver = get_solver(method)
    known = [f.name for f in fields(solver.options)]
    unknown = sorted(set(options) - set(known))
    if unknown:
        takes = f"it takes {known}" if known else "it takes none"
        raise SolverError(f"method {method!r} has no option(s) {unknown}; {takes}")
    for key in ("time_limit", "mip_rel_gap"):
        if key in options:
            checks.finite_number(options[key], key)
    for key in ("max_strategies", "max_pair_columns", "max_table_entries", "max_entries"):
        if options.get(key) is not None:
            checks.positive_int(options[key], key)
    if "split" in options:
        checks.choice(options["split"], "split", ["auto", "never", "always"])
    for key in ("tensor", "pipeline", "micro_batch_size", "virtual_stages", "context", "expert"):
        if key in options:
            checks.positive_int(options[key], key)
    if "recompute" in options:
        checks.choice(options["recompute"], "recompute", ["full", "selective", "none"])
    for key in (
        "sequence_parallel",
        "distributed_optimizer",
        "overlap_grad_reduce",
        "overlap_p2p",
        "prefetch",
        "tp_comm_overlap",
    ):
        if key in options:
            checks.boolean(options[key], key)
    if options.get("stages") is not None:
        stages = options["stages"]
        if not isinstance(stages, (tuple, list)) or not stages:
            raise SolverError(f"stages must be a non-empty list of stage counts, got {stages!r}")
        options = {**options, "stages": tuple(checks.positive_int(s, "stages") for s in stages)}
    if options.get("progress") is not None and not callable(options["progress"]):
        raise SolverError("progress must be a callable taking one line of text")
    return solver.options(**options)


__all__ = [
    "METHODS",
    "SOLVERS",
    "DpOptions",
    "DrecOptions",
    "IlpOptions",
    "NoOptions",
    "RecipeOptions",
    "Solver",
    "StepOptions",
    "UNSET",
    "get_solver",
    "given",
    "solver_options",
]
