"""Ranks that never wait for each other: agreement before the first collective, and a failure
inside a forward that reaches every rank at once.

`agree` is one `all_gather_object` at set-up (each rank sends its error or its plan's hash and a
seed), so a rank that failed to trace or plan stops every rank before any of them enters a
collective. `failed` turns a node's error into a BackendError naming the rank and node and closes
the process group: with gloo, the other ranks' pending collectives then fail within a fraction
of a second (a closed connection) instead of blocking until the group's timeout. O(world) bytes.
"""

from __future__ import annotations

from typing import Any

from shardplan.errors import BackendError, PlanError, ShardplanError
from shardplan.plans import Plan


def agree(torch: Any, failure: BaseException | None, plan: Plan | None) -> int:
    """Before the first collective: every rank learns whether any rank failed to trace or plan
    (then all raise, naming the first failed rank and its error) and that all ranks hold the
    same plan; returns rank 0's seed for random ops (dropout masks: `_rewrites.dropout`). One
    all_gather_object of a short text and a number per rank."""
    import hashlib

    if failure is not None:
        mine = f"{type(failure).__name__}: {failure}".splitlines()[0][:400]
    else:
        # the decided parts only: search_seconds differs from rank to rank
        decided = repr((sorted(plan.strategies.items()), sorted(plan.param_layouts.items())))
        mine = "plan " + hashlib.sha256(decided.encode()).hexdigest() if plan else "-"
    dist = torch.distributed
    drawn = int(torch.initial_seed())  # the caller's seed; its generator's state is untouched
    pairs: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(pairs, (mine, drawn))
    seen = [p[0] if isinstance(p, tuple) else p for p in pairs]
    bad = [(r, t) for r, t in enumerate(seen) if not str(t).startswith(("plan ", "-"))]
    if failure is not None and (not bad or bad[0][0] == dist.get_rank()):
        raise failure
    if bad:
        raise BackendError(
            f"parallelize: rank {bad[0][0]} failed to set up ({bad[0][1]}); every rank stops "
            "before any collective"
        )
    if len({str(t) for t in seen}) > 1:
        raise PlanError(
            "parallelize: the ranks planned different plans (a plan must be deterministic and "
            "the module and example inputs the same on every rank); pass one plan= to all"
        )
    first = pairs[0]
    return int(first[1]) if isinstance(first, tuple) else drawn  # (a fake group sends nothing)


def failed(torch: Any, node: Any, error: Exception) -> ShardplanError:
    """A node failed on this rank: the process group is destroyed so that the other ranks'
    collectives fail at once instead of waiting for this rank (a peer's forward then stops
    with this same error type, naming its own rank and node)."""
    dist = torch.distributed
    rank = dist.get_rank() if dist.is_initialized() else 0
    if dist.is_initialized():
        dist.destroy_process_group()
    first = str(error).strip().splitlines()[0][:300] if str(error).strip() else ""
    return BackendError(
        f"parallelize: rank {rank} failed running node {node.name!r} ({node.target}) of the "
        f"module's exported program: {type(error).__name__}: {first}; the process group is "
        "closed so no rank waits (if another rank failed first, its error is the cause)"
    )
