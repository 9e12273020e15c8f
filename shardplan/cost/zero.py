"""ZeRO stages of a plain plan: which parameter state is split over the data-parallel group, and
the collectives that pays for (Rajbhandari et al., SC'20).

A parameter P is read in its home layout H (its first consumer's layout). Its data-parallel group
is the set D of rounds in which H replicates it and the ZeRO shard S (`zero_layout`) splits it
further: per round, along the largest local tensor dim the round's q divides (ties: the first
dim); W = prod_{r in D} q_r. A is the set of rounds in which a consumer of P all-reduces its
gradient at stage 0 (it cuts the round along a loop dim that does not index P); A' = the rounds
of A where H replicates P. With n the elements of P under H, w their width and s the optimizer +
master bytes per element (G(R): all-gather of P over rounds R; RS(R): reduce-scatter, same cost):

  stage  memory per device        collectives per step
  0      n (w + w + s)            the evaluator's gradient all-reduce over A
  1      n (w + w + s / W)        RS(A) of the gradient, G(D u A') of the updated weights
  2      n (w + w / W + s / W)    as stage 1 (RS + G is one ring all-reduce's volume)
  3      n (w + w + s) / W        G(D) before the forward and again before the backward, RS(A),
                                  and G(A' - D) where S keeps P whole (an all-reduce's second half)

Stages >= 1 drop every parameter operand's gradient all-reduce from the op terms
(`OperandInfo.grad_shared`, set in `price.operand_infos`): the consumers' gradients are summed
locally and reduce-scattered once per parameter, priced here. G(R) is the
hierarchical gather of `terms.edge_redistribution` (slow rounds first, while pieces are small;
bytes telescope to (1 - 1/Q) n w over Q = prod_{r in R} q_r); a reduce-scatter has the same ring
cost. Stage 3 stores S as the plan's `param_layouts` (what exporters and engines read); its
gathers are priced here, not as edges. Inference keeps weights only: stage 3 gathers them
before the forward. The training-step model (`cost/step.py`) uses the same gather and memory
functions per pipeline stage. O(rounds^2) per parameter.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardplan.cost.presets import CostOptions
from shardplan.cost.terms import ZERO, CommTerms, edge_redistribution, param_bytes
from shardplan.errors import PlanError
from shardplan.ir.graph import Graph
from shardplan.ir.op import Role
from shardplan.mesh import Round
from shardplan.sharding import REPLICATED, Layout, Strategy, operand_layout

STAGES = (0, 1, 2, 3)
WHAT = {
    0: "nothing split by ZeRO",
    1: "optimizer state and fp32 master weights split over each parameter's data-parallel group",
    2: "optimizer state, master weights and gradients split over each parameter's "
    "data-parallel group (reduce-scatter instead of all-reduce)",
    3: "optimizer state, gradients and parameters split over each parameter's data-parallel "
    "group (all-gathered before use, forward and backward)",
}


def check_stage(zero: object) -> int:
    """`zero` as a ZeRO stage (0-3), or PlanError saying which values exist."""
    if isinstance(zero, bool) or zero not in STAGES:
        raise PlanError(f"ZeRO stage must be 0, 1, 2 or 3, got {zero!r}")
    return int(zero)  # type: ignore[call-overload]


def zero_bytes(weight: float, grad: float, state: float, ways: float, zero: int) -> float:
    """Bytes per device of a parameter's weights, gradients and optimizer state (+ fp32 master)
    under ZeRO `zero`, `ways` being its data-parallel group's size: stage 1 divides the state,
    2 also the gradients, 3 also the weights."""
    return (
        weight / (ways if zero >= 3 else 1)
        + grad / (ways if zero >= 2 else 1)
        + state / (ways if zero >= 1 else 1)
    )


_FORWARD = CostOptions(train=False)  # a gather's own price: no backward pass implied


def gather_terms(
    numel: float, width: int, home: Layout, gathered: Sequence[int], rounds: Sequence[Round]
) -> CommTerms:
    """One all-gather (forward terms) of a tensor of `numel` elements, laid out as `home` apart
    from being split in the `gathered` rounds, to replicated in those rounds: the hierarchical
    gather of `terms.edge_redistribution` (a reduce-scatter costs the same)."""
    if not gathered:
        return ZERO
    src = tuple((max(s, 0) if r in gathered else s) for r, s in enumerate(home))
    dst = tuple((REPLICATED if r in gathered else s) for r, s in enumerate(home))
    return edge_redistribution(src, dst, numel, width, rounds, False, _FORWARD)


def zero_layout(shape: Sequence[int], home: Layout, rounds: Sequence[Round]) -> Layout:
    """The ZeRO shard of a parameter read in `home`: each round that replicates it (q > 1) splits
    the largest local dim it divides (ties: the first); a round no dim divides stays replicated."""
    layout = list(home)
    local = list(shape)
    for r, rnd in enumerate(rounds):
        if layout[r] >= 0:
            local[layout[r]] //= rnd.q
    for r, rnd in enumerate(rounds):
        if layout[r] < 0 and rnd.q > 1:
            options = [d for d in range(len(local)) if local[d] % rnd.q == 0]
            if options:
                d = max(options, key=lambda k: (local[k], -k))
                local[d] //= rnd.q
                layout[r] = d
    return tuple(layout)


@dataclass(frozen=True, slots=True)
class ZeroParam:
    """One parameter's ZeRO facts (module docstring): home layout H, shard S, the gathered rounds
    D, the gradient's reduced rounds A, the group size W and the index of its first reader."""

    name: str
    home: Layout
    shard: Layout
    gathered: tuple[int, ...]
    reduced: tuple[int, ...]
    ways: int
    first_reader: int


def param_reads(graph: Graph) -> list[tuple[int, int, str]]:
    """Every read of a parameter: (op index, operand position, name), in graph order."""
    tensors = graph.tensors
    return [
        (index, pos, name)
        for index, op in enumerate(graph.ops)
        for pos, name in enumerate(op.inputs)
        if tensors[name].role is Role.PARAMETER
    ]


def zero_params(
    graph: Graph,
    rounds: Sequence[Round],
    strategies: Mapping[str, Strategy],
    train: bool,
    layouts: Sequence[Sequence[Layout]] | None = None,
    reads: Sequence[tuple[int, int, str]] | None = None,
    memo: dict[tuple[object, ...], Any] | None = None,
) -> dict[str, ZeroParam]:
    """The ZeRO facts of every parameter some op reads (see the module docstring); `layouts`:
    per op, its inputs' layouts when known; `reads`: the graph's `param_reads` when kept;
    `memo`: a caller's dict kept across calls under the same `rounds` (one graph's plans): each
    (shape, home layout)'s ZeRO shard, gathered rounds and ways (`zero_layout`), and each
    ("cut", strategy)'s rounds of more than one way it cuts."""
    homes: dict[str, tuple[Layout, int]] = {}
    reduced: dict[str, set[int]] = {}
    tensors, requires_grad, ops = graph.tensors, graph.requires_grad, graph.ops
    big = [rnd.q > 1 for rnd in rounds]
    memo = {} if memo is None else memo
    for index, pos, name in param_reads(graph) if reads is None else reads:
        if layouts is not None:
            layout = layouts[index][pos]
        else:
            op = ops[index]
            layout = operand_layout(op, strategies[op.name], pos)
        if name not in homes:
            homes[name] = (layout, index)
        if train and name in requires_grad:  # where stage 0 all-reduces its gradient
            key = ("cut", tuple(strategies[ops[index].name]))  # a caller's list hashes too
            cut = memo.get(key)
            if cut is None:  # the rounds of q > 1 the reader cuts
                cut = memo[key] = tuple(r for r, c in enumerate(key[1]) if c is not None and big[r])
            if cut:
                red = reduced.get(name)
                if red is None:
                    red = reduced[name] = set()
                red.update(r for r in cut if layout[r] < 0)
    out: dict[str, ZeroParam] = {}
    # repeated layers: one shard, group and size per shape and home
    for name, (home, first) in homes.items():
        shape = tensors[name].shape
        found = memo.get((shape, home))
        if found is None:
            shard = zero_layout(shape, home, rounds)
            gathered = tuple(r for r, (h, s) in enumerate(zip(home, shard, strict=True)) if s != h)
            ways = 1
            for r in gathered:
                ways *= rounds[r].q
            found = memo[shape, home] = (shard, gathered, ways)
        shard, gathered, ways = found
        red = tuple(sorted(reduced.get(name, ())))
        out[name] = ZeroParam(name, home, shard, gathered, red, ways, first)
    return out


@dataclass(frozen=True, slots=True)
class ZeroParts:
    """One parameter's ZeRO collectives by when they run (the module docstring's table):
    `reduce` RS(A) of the gradient; `gather` G(D), ZeRO-3's gather before a pass; `rest`
    G(A' - D), ZeRO-3's second half of an all-reduce where S keeps P whole; `update` G(D u A'),
    stages 1-2's gather of the updated weights (ZERO for a frozen parameter)."""

    reduce: CommTerms
    gather: CommTerms
    rest: CommTerms
    update: CommTerms


def zero_parts(
    graph: Graph,
    rounds: Sequence[Round],
    p: ZeroParam,
    opts: CostOptions,
    memo: dict[tuple[object, ...], CommTerms] | None = None,
) -> ZeroParts:
    """The collectives of parameter `p` under ZeRO, one term per kind (see `ZeroParts`);
    `memo` keeps gathers already priced (a pure function of size, home and rounds)."""
    t = graph.tensors[p.name]
    width = opts.element_bytes(t)

    def gather(rs: Sequence[int]) -> CommTerms:
        if memo is None:
            return gather_terms(t.numel, width, p.home, rs, rounds)
        key = (t.numel, width, p.home, tuple(rs))
        found = memo.get(key)
        if found is None:
            found = memo[key] = gather_terms(t.numel, width, p.home, rs, rounds)
        return found

    replicated = [r for r in p.reduced if p.home[r] < 0]
    frozen = p.name not in graph.requires_grad  # a frozen parameter is never updated
    return ZeroParts(
        reduce=gather(p.reduced),
        gather=gather(p.gathered),
        rest=gather([r for r in replicated if r not in p.gathered]),
        update=ZERO if frozen else gather(sorted(set(p.gathered) | set(replicated))),
    )


def zero_terms(
    graph: Graph, rounds: Sequence[Round], p: ZeroParam, zero: int, opts: CostOptions
) -> CommTerms:
    """The collectives stage `zero` runs for parameter `p` (the module docstring's table)."""
    if zero == 0:
        return ZERO
    parts = zero_parts(graph, rounds, p, opts)
    scatter = parts.reduce
    terms = CommTerms(
        grad_sync=scatter.redistribution_fwd, reduce_scatter_bytes=scatter.all_gather_bytes
    )
    if zero == 3:
        g, rest = parts.gather, parts.rest
        backward = opts.train  # freed after the forward, gathered again for the backward
        return terms + CommTerms(
            redistribution_fwd=g.redistribution_fwd,
            redistribution_bwd=g.redistribution_fwd if backward else 0.0,
            grad_sync=rest.redistribution_fwd,
            all_gather_bytes=g.all_gather_bytes * (2 if backward else 1) + rest.all_gather_bytes,
        )
    if p.name not in graph.requires_grad:
        return terms
    updated = parts.update
    return terms + CommTerms(
        grad_sync=updated.redistribution_fwd, all_gather_bytes=updated.all_gather_bytes
    )


@dataclass(frozen=True, slots=True)
class ZeroStep:
    """A pipeline stage's ZeRO collectives (seconds) and parameter state (bytes per device) at one
    ZeRO stage, under gradient accumulation over micro-batches: stages 2-3 keep only a gradient
    shard, so they reduce-scatter each micro-batch's gradient (`bwd_s`); stage 3 gathers the
    weights before each forward (`fwd_s`) and backward; stages 1-2 gather the updated weights
    once per step and stage 1 reduce-scatters the accumulated gradient once (`step_s`). With one
    micro-batch, fwd_s + bwd_s + step_s is the sum of `zero_terms`' seconds over the parameters."""

    fwd_s: float
    bwd_s: float
    step_s: float
    param_bytes: float


def zero_steps(
    graph: Graph,
    rounds: Sequence[Round],
    strategies: Mapping[str, Strategy],
    opts: CostOptions,
    params: Mapping[str, ZeroParam] | None = None,
    memo: dict[tuple[object, ...], Any] | None = None,
) -> tuple[ZeroStep, ...]:
    """`ZeroStep` of a stage's plan at ZeRO stages 1, 2 and 3 (in that order): the parameters'
    `zero_parts` summed, state split by `zero_bytes` over each one's group (O(params rounds^2));
    `params`: the plan's `zero_params` when known; `memo`: prices kept between calls on the same
    rounds and options (a `cost.evaluate.PriceTable`'s)."""
    if params is None:
        params = zero_params(graph, rounds, strategies, opts.train)
    fwd = reduce = rest = update = 0.0
    state = [0.0, 0.0, 0.0]
    # repeated layers: one price and one state split per shape (key "parts"), one per gather
    memo = {} if memo is None else memo
    seen: dict[tuple[object, ...], tuple[ZeroParts, tuple[float, ...]]]
    seen = memo.setdefault(("parts",), {})
    gathers: dict[tuple[object, ...], CommTerms] = memo.setdefault(("gathers",), {})
    for p in params.values():
        t = graph.tensors[p.name]
        width = opts.element_bytes(t)
        key = (t.numel, width, p.home, p.gathered, p.reduced, p.name in graph.requires_grad)
        found = seen.get(key)
        if found is None:
            elems = _local_numel(t.numel, p.home, rounds)
            w = elems * width
            grad = w if opts.train else 0.0
            extra = param_bytes(elems, width, opts) - w - grad  # master weights + optimizer
            split = tuple(zero_bytes(w, grad, extra, p.ways, z) for z in (1, 2, 3))
            found = seen[key] = (zero_parts(graph, rounds, p, opts, gathers), split)
        parts, split = found
        fwd += parts.gather.redistribution_fwd
        reduce += parts.reduce.redistribution_fwd
        rest += parts.rest.redistribution_fwd
        update += parts.update.redistribution_fwd
        for z in range(3):
            state[z] += split[z]
    backward = fwd if opts.train else 0.0
    return (
        ZeroStep(0.0, 0.0, reduce + update, state[0]),
        ZeroStep(0.0, reduce, update, state[1]),
        ZeroStep(fwd, backward + reduce + rest, 0.0, state[2]),
    )


def update_bytes(
    graph: Graph,
    rounds: Sequence[Round],
    strategies: Mapping[str, Strategy],
    opts: CostOptions,
    params: Mapping[str, ZeroParam] | None = None,
    memo: dict[tuple[object, ...], Any] | None = None,
) -> tuple[float, float]:
    """Bytes one device's optimizer step reads and writes (`CostOptions.update_bytes_for` per
    element it updates): (without ZeRO, with ZeRO 1-3, where each device updates its 1/ways shard
    of each parameter). O(params x rounds); `params`: the plan's `zero_params` when known;
    `memo`: each (parameter, home)'s bytes, kept across calls on one graph, rounds and options."""
    plain = sharded = 0.0
    if not opts.train:
        return plain, sharded
    if params is None:
        params = zero_params(graph, rounds, strategies, opts.train)
    memo = {} if memo is None else memo
    for p in params.values():
        if p.name not in graph.requires_grad:
            continue
        key = ("update", p.name, p.home)
        per = memo.get(key)
        if per is None:
            t = graph.tensors[p.name]
            width = opts.update_bytes_for(opts.element_bytes(t))
            per = memo[key] = _local_numel(t.numel, p.home, rounds) * width
        plain += per
        sharded += per / p.ways
    return plain, sharded


def gradient_elements(
    graph: Graph,
    rounds: Sequence[Round],
    params: Mapping[str, ZeroParam],
    memo: dict[tuple[object, ...], Any] | None = None,
) -> float:
    """Gradient elements one device holds: each parameter needing a gradient, in its home
    layout (what the data-parallel all-reduce or reduce-scatter moves). O(params x rounds);
    `memo`: each (parameter, home)'s count, kept across calls on one graph and rounds."""
    memo = {} if memo is None else memo
    out = []
    for p in params.values():
        if p.name in graph.requires_grad:
            key = ("local", p.name, p.home)
            local = memo.get(key)
            if local is None:
                local = memo[key] = _local_numel(graph.tensors[p.name].numel, p.home, rounds)
            out.append(local)
    return sum(out)


def _local_numel(numel: int, layout: Layout, rounds: Sequence[Round]) -> float:
    """Elements of a tensor held by one device in `layout` (its split rounds divide it)."""
    local = float(numel)
    for r, s in enumerate(layout):
        if s >= 0:
            local /= rounds[r].q
    return local


def zero_layouts(
    graph: Graph, rounds: Sequence[Round], strategies: Mapping[str, Strategy]
) -> dict[str, Layout]:
    """The stored layouts of stage 3 (`Plan.param_layouts`): each read parameter's ZeRO shard."""
    return {name: p.shard for name, p in zero_params(graph, rounds, strategies, False).items()}


def check_zero_options(opts: CostOptions) -> None:
    """PlanError unless `opts.zero` is a stage the options can price."""
    check_stage(opts.zero)
    if opts.zero and opts.preset.symbolic:
        raise PlanError(
            f"ZeRO stage {opts.zero} is priced in the 'shardplan' cost preset only; "
            "plan with preset 'shardplan' or without --zero"
        )
    if opts.zero in (1, 2) and not opts.train:
        raise PlanError(
            f"ZeRO stage {opts.zero} splits gradients and optimizer state, which inference does "
            "not have; use stage 3 (weights split) or plan training"
        )


@dataclass(frozen=True, slots=True)
class ZeroPricing:
    """What the evaluator adds for a plan's ZeRO stage: every read parameter's facts (None at
    stage 0) and the ZeRO collectives charged to the row of each parameter's first reader."""

    params: Mapping[str, ZeroParam] | None
    by_reader: Mapping[int, CommTerms]


def zero_pricing(
    graph: Graph,
    rounds: Sequence[Round],
    strategies: Mapping[str, Strategy],
    opts: CostOptions,
    param_layouts: Mapping[str, Layout] | None,
) -> ZeroPricing:
    """The ZeRO facts and collectives of a plan at stage `opts.zero`; PlanError if its stored
    parameter layouts are not the stage's (none for 1-2, the ZeRO shards for 3)."""
    if opts.zero == 0:
        return ZeroPricing(None, {})
    check_zero_options(opts)
    params = zero_params(graph, rounds, strategies, opts.train)
    stored = {name: tuple(layout) for name, layout in (param_layouts or {}).items()}
    expected = {name: p.shard for name, p in params.items()} if opts.zero == 3 else {}
    if stored != expected:
        wrong = sorted(
            n for n in stored.keys() | expected.keys() if stored.get(n) != expected.get(n)
        )
        kept = "each parameter as its ZeRO shard" if opts.zero == 3 else "no parameter split"
        raise PlanError(
            f"ZeRO stage {opts.zero} stores {kept}, but the plan's param_layouts differ for "
            f"{wrong[:3]}; build the plan with `shardplan.plans.with_zero(plan, {opts.zero})`"
        )
    by_reader: dict[int, CommTerms] = {}
    for p in params.values():
        terms = zero_terms(graph, rounds, p, opts.zero, opts)
        by_reader[p.first_reader] = by_reader.get(p.first_reader, ZERO) + terms
    return ZeroPricing(params, by_reader)


__all__ = [
    "STAGES",
    "WHAT",
    "ZeroParam",
    "ZeroPricing",
    "check_stage",
    "check_zero_options",
    "gather_terms",
    "gradient_elements",
    "param_reads",
    "update_bytes",
    "zero_bytes",
    "zero_layout",
    "zero_layouts",
    "zero_params",
    "ZeroParts",
    "ZeroStep",
    "zero_parts",
    "zero_pricing",
    "zero_steps",
    "zero_terms",
]
