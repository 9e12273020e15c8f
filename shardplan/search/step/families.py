"""The families a stage can be planned by and the levers each stage may pull.

`Family` names how a stage is planned (D-Rec, the data-parallel expert, the Megatron expert at a
tensor degree, with sequence, context or expert parallelism); `stage_tensor_degrees` and
`data_degrees` give the degrees a stage mesh allows; `LEVERS`, `lever_menu` and `choose_levers`
walk recomputation x ZeRO for a stage's profile (`cost.step.stage_cost`). O(rounds) and
O(levers) each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from shardplan.cost.levers import with_overlap
from shardplan.cost.step import Levers, Recompute, StageProfile, stage_cost
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.search.step.recipes import expert_dim

LEVERS: tuple[Levers, ...] = tuple(
    Levers(r, z)
    for z in (0, 1, 2, 3)
    for r in (Recompute.NONE, Recompute.SELECTIVE, Recompute.FULL)
)
"""Every recomputation x ZeRO combination, least intrusive first (ties go to the earlier one)."""


@dataclass(frozen=True, slots=True)
class Family:
    """How a stage is planned: "drec", "data-parallel" or "megatron" (at `tensor` ways), and
    whether it runs sequence parallel."""

    method: str
    tensor: int = 1
    sequence_parallel: bool = False
    context: int = 1
    expert: int = 1

    def text(self) -> str:
        t = f" t={self.tensor}" if self.method == "megatron" else ""
        cp = f" +CP{self.context}" if self.context > 1 else ""
        ep = f" +EP{self.expert}" if self.expert > 1 else ""
        return f"{self.method}{t}{' +SP' if self.sequence_parallel else ''}{cp}{ep}"


def data_degrees(mesh: Mesh, tensor: int) -> tuple[int, ...]:
    """Degrees > 1 of expert or context parallelism next to tensor parallelism `tensor`: products
    of the rounds outside its innermost rounds, from the innermost outwards."""
    out, ways, skipped = [], 1, 1
    for r in reversed(mesh.rounds):
        if skipped < tensor:
            skipped *= r.q
            continue
        ways *= r.q
        out.append(ways)
    return tuple(out)


def stage_tensor_degrees(mesh: Mesh) -> tuple[int, ...]:
    """Tensor degrees > 1 of a stage mesh: products of the rounds of its innermost axis, from
    the last round inwards (a one-axis mesh included: its pipeline ways are already taken)."""
    out, ways = [], 1
    inner = len(mesh.shape) - 1
    for r in reversed(mesh.rounds):
        if r.mesh_axis != inner:
            break
        ways *= r.q
        out.append(ways)
    return tuple(out)


def heavier_than_fitted(lv: Levers, fitted: set[int], overlap: Levers | None) -> bool:
    """Whether `lv` (walking `LEVERS` in order) recomputes more than a lever of its ZeRO stage
    that already fits (`fitted`): with nothing overlapped, more recomputation only adds time,
    so it cannot be faster."""
    return lv.zero in fitted and (overlap is None or not overlap.overlaps)


def lever_menu(
    sequence_parallel: bool, context_parallel: bool, overlap: Levers | None
) -> tuple[Levers, ...]:
    """`LEVERS` in order, each with a stage's sequence and context parallelism and the overlap
    fields of `overlap` (`cost.levers.with_overlap`; None: nothing overlapped)."""
    staged = (
        replace(lv, sequence_parallel=sequence_parallel, context_parallel=context_parallel)
        for lv in LEVERS
    )
    return tuple(lv if overlap is None else with_overlap(lv, overlap) for lv in staged)


def choose_levers(
    profile: StageProfile,
    m: int,
    in_flight: int,
    slots: int,
    budget: float | None,
    overlap: Levers | None = None,
    menu: Sequence[Levers] | None = None,
) -> tuple[float, Levers] | None:
    """The levers giving this stage the shortest (slots x slot share + sync + optimizer step)
    within `budget`, with that time; None when no combination fits. `overlap`: the overlap
    fields every lever carries (`cost.levers.with_overlap`); `menu`: the profile's
    `lever_menu` under `overlap` when made already."""
    best: tuple[float, Levers] | None = None
    fitted: set[int] = set()  # ZeRO stages a lighter recomputation already fits
    if menu is None:
        menu = lever_menu(profile.sequence_parallel, profile.context_parallel, overlap)
    for lv in menu:
        if heavier_than_fitted(lv, fitted, overlap):
            continue
        c = stage_cost(profile, lv, m, in_flight)
        if budget is not None and c.memory_bytes > budget:
            continue
        fitted.add(lv.zero)
        t = slots * (c.fwd_s + c.bwd_s) + c.sync_s + c.optimizer_s
        if best is None or t < best[0] * (1 - 1e-9):
            best = (t, lv)
    return best


def expert_counts(graph: Graph) -> frozenset[int]:
    """The expert count of each expert layer of `graph` (`recipes.expert_dim`), O(ops)."""
    return frozenset(
        op.signature.extents[d] for op in graph.ops if (d := expert_dim(graph, op)) is not None
    )


__all__ = [
    "LEVERS",
    "Family",
    "choose_levers",
    "data_degrees",
    "expert_counts",
    "heavier_than_fitted",
    "lever_menu",
    "stage_tensor_degrees",
]
