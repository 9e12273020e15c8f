"""Expert plans as ordinary strategies, so the one evaluator scores them like any search result.

* data-parallel: every op cuts its batch loop dim in every round (the loop dim that carries dim 0
  of the graph inputs, followed through the graph); ops without a batch dim replicate.
* megatron: rounds of the innermost mesh axis are tensor-parallel — an op with a parameter cuts
  the REDUCE dim its activation arrives split on (row-parallel), else a parameter-only REDUCE dim
  (vocab-parallel embedding), else a PARALLEL dim only its parameter carries (column-parallel);
  ops without parameters follow their input's split (heads through reshape/transpose/bmm).
  Column-parallel is taken only where Megatron takes it, recognised from structure, never names
  (`paired_columns`): the column-parallel ops reading one activation (q/k/v, gate/up) are a
  group; their split features, followed forward through the ops without parameters, must all
  end in a row-parallel op (one that reduces them against its parameter: out-proj, down-proj),
  a loss that normalises them away (vocab-parallel cross-entropy) or a graph output, meeting
  only activations of the same group on the way. A reduction over the split features without a
  parameter (a norm's statistics, however written), a residual add, or a FROZEN dim stops the
  group, so norms, residual streams and conv stems stay replicated as in Megatron-LM.
  Rounds of outer axes are data-parallel.
* context parallel (`context_parallel`): the sequence (dim 1 of the graph inputs) cut instead
  of the batch in given rounds, followed through the graph the same way.
* fsdp: data-parallel cuts, with every parameter stored split along its largest divisible dims
  across all rounds (ZeRO-3): all-gathers before use, sharded gradients and optimizer state.
Each is one pass in topological order per round: O(|V| + |E|) per round; `paired_columns` walks
each group's block once (O(|V| + |E|) over the ops its splits reach).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence

from shardplan.errors import PlanError
from shardplan.ir.dims import DimKind
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role
from shardplan.ir.signature import loop_names, major_positions
from shardplan.ir.traits import Trait, has_trait
from shardplan.mesh import Mesh
from shardplan.sharding import Layout, Strategy, cut_problem

Chooser = Callable[[Op, dict[int, int]], list[str]]
"""(op, {input position: split tensor dim}) -> loop dims to try in order."""


def _propagate(
    graph: Graph,
    mesh: Mesh,
    rounds_to_use: set[int],
    seed: Callable[[str], int | None],
    choose: Chooser,
    classes: Sequence[int] | None = None,
) -> dict[str, list[str | None]]:
    """Per round, walk ops in order: each cuts the first valid loop dim `choose` proposes, and
    the split tensor dim of its outputs is recorded for its consumers. Ops of one signature and
    input roles (repeated layers) with the same earlier cuts and arriving splits decide alike,
    so each such case is decided once (`classes`: op class ids that refine that, e.g. a
    `ScoreCache`'s)."""
    cuts: dict[str, list[str | None]] = {op.name: [] for op in graph.ops}
    class_of = classes if classes is not None else op_classes(graph)
    decided: dict[tuple[object, ...], tuple[str | None, tuple[tuple[int, int], ...]]] = {}
    # per op, its inputs in order: (position, name, produced?, seed of an unproduced one); only
    # produced tensors are ever recorded split, so the others arrive as seeded in every round
    seeds: dict[str, int | None] = {}
    reads = []
    for op in graph.ops:
        row = []
        for pos, name in enumerate(op.inputs):
            produced = name in graph.producer
            if not produced and name not in seeds:
                seeds[name] = seed(name)
            row.append((pos, name, produced, None if produced else seeds[name]))
        reads.append(row)
    for r in range(len(mesh.rounds)):
        if r not in rounds_to_use:  # every op stays whole in this round
            for made in cuts.values():
                made.append(None)
            continue
        split: dict[str, int] = {}
        for op, cid, row in zip(graph.ops, class_of, reads, strict=True):
            arriving: dict[int, int] = {}
            for pos, name, produced, seeded in row:
                dim = split.get(name) if produced else seeded
                if dim is not None:
                    arriving[pos] = dim
            made = cuts[op.name]
            key = (cid, tuple(made), tuple(arriving.items()))
            found = decided.get(key)
            if found is None:
                found = decided[key] = _decide(op, made, arriving, True, mesh, choose)
            chosen, outputs = found
            made.append(chosen)
            for pos, position in outputs:
                split[op.outputs[pos]] = position
    return cuts


def op_classes(graph: Graph) -> list[int]:
    """Per op, a class id shared by the ops of equal signature and input roles (O(ops))."""
    ids: dict[tuple[object, ...], int] = {}
    return [
        ids.setdefault((op.signature, tuple(graph.tensors[t].role for t in op.inputs)), len(ids))
        for op in graph.ops
    ]


def _decide(
    op: Op,
    earlier: list[str | None],
    arriving: dict[int, int],
    use: bool,
    mesh: Mesh,
    choose: Chooser,
) -> tuple[str | None, tuple[tuple[int, int], ...]]:
    """One op's cut in the next round (the first valid one `choose` proposes) and the tensor dim
    each output it splits is split along."""
    if not use:
        return None, ()
    extents = op.signature.extents
    for rnd, cut in zip(mesh.rounds, earlier, strict=False):
        if cut is not None:
            extents[cut] //= rnd.q
    q = mesh.rounds[len(earlier)].q
    for loop_dim in choose(op, arriving):
        if cut_problem(op, loop_dim, extents[loop_dim], q) is None:
            outputs = []
            for pos, dims in enumerate(op.signature.outputs):
                position = major_positions(dims).get(loop_dim)
                if position is not None:
                    outputs.append((pos, position))
            return loop_dim, tuple(outputs)
    return None, ()


def _follow(op: Op, arriving: dict[int, int]) -> list[str]:
    """Loop dims that keep the arriving splits in place (first arriving input first)."""
    out = []
    for pos, dim in sorted(arriving.items()):
        group = op.signature.inputs[pos][dim]
        if group and group[0] not in out:
            out.append(group[0])
    return out


def _batch_seed(graph: Graph) -> Callable[[str], int | None]:
    def seed(name: str) -> int | None:
        t = graph.tensors[name]
        return 0 if t.role is Role.INPUT and t.shape else None

    return seed


def data_parallel(
    graph: Graph, mesh: Mesh, classes: Sequence[int] | None = None
) -> dict[str, Strategy]:
    every = set(range(len(mesh.rounds)))
    cuts = _propagate(graph, mesh, every, _batch_seed(graph), _follow, classes)
    return {k: tuple(v) for k, v in cuts.items()}


def context_parallel(
    graph: Graph,
    mesh: Mesh,
    strategies: Mapping[str, Strategy],
    rounds: Sequence[int],
    classes: Sequence[int] | None = None,
) -> dict[str, Strategy]:
    """`strategies` with the sequence split in `rounds` (context parallelism): dim 1 of the
    graph inputs of rank >= 2 (the sequence of token ids, hidden states, labels) followed
    through the graph as the data-parallel walk follows dim 0; an op whose followed cut is not
    valid with its other cuts stays whole in that round (its reader then gathers)."""
    use = set(rounds)

    def seed(name: str) -> int | None:
        t = graph.tensors[name]
        return 1 if t.role is Role.INPUT and len(t.shape) >= 2 else None

    cuts = _propagate(graph, mesh, use, seed, _follow, classes)
    out: dict[str, Strategy] = {}
    for op in graph.ops:
        strategy = list(strategies[op.name])
        for r in sorted(use):
            strategy[r] = None
        extents = op.signature.extents
        for rnd, cut in zip(mesh.rounds, strategy, strict=True):
            if cut is not None:
                extents[cut] //= rnd.q
        for r in sorted(use):
            cut = cuts[op.name][r]
            if cut is not None and cut not in strategy:
                if cut_problem(op, cut, extents[cut], mesh.rounds[r].q) is None:
                    extents[cut] //= mesh.rounds[r].q
                    strategy[r] = cut
        out[op.name] = tuple(strategy)
    return out


def _activations(graph: Graph, op: Op) -> list[int]:
    """Positions of `op`'s inputs that are computed values (not parameters or constants)."""
    return [
        i for i, t in enumerate(op.inputs) if graph.tensors[t].role in (Role.INPUT, Role.ACTIVATION)
    ]


def _column_dim(graph: Graph, op: Op) -> str | None:
    """The first PARALLEL loop dim only `op`'s parameters carry (its column-parallel cut)."""
    params = [i for i, t in enumerate(op.inputs) if graph.tensors[t].role is Role.PARAMETER]
    if not params:
        return None
    acts = set().union(*(loop_names(op.signature.inputs[i]) for i in _activations(graph, op)))
    owned = set().union(*(loop_names(op.signature.inputs[i]) for i in params)) - acts
    return next(
        (d.name for d in op.signature.loop_dims if d.kind is DimKind.PARALLEL and d.name in owned),
        None,
    )


def paired_columns(graph: Graph, classes: Sequence[int] | None = None) -> frozenset[str]:
    """The ops that may be column-parallel in a Megatron plan (see the module docstring): per
    group of candidates reading the same activations, one forward walk of their split features
    in op order; the group is kept when every path ends well (`classes`: `op_classes`, whose
    ops share their column dim)."""
    groups: dict[tuple[str, ...], list[int]] = {}
    columns: dict[int, str] = {}  # candidate op index -> its column-parallel loop dim
    by_class: dict[int, str | None] = {}
    for i, op in enumerate(graph.ops):
        if classes is None:
            dim = _column_dim(graph, op)
        else:
            if classes[i] not in by_class:
                by_class[classes[i]] = _column_dim(graph, op)
            dim = by_class[classes[i]]
        if dim is not None:
            columns[i] = dim
            source = tuple(op.inputs[j] for j in _activations(graph, op))
            groups.setdefault(source, []).append(i)
    keep: set[str] = set()
    for members in groups.values():
        if _group_pairs(graph, members, columns):
            keep.update(graph.ops[i].name for i in members)
    return frozenset(keep)


def _group_pairs(graph: Graph, members: list[int], columns: dict[int, str]) -> bool:
    """Whether the split features of the column candidates `members` (their loop dims in
    `columns`) all end well."""
    split: dict[str, int] = {}  # tensor -> the tensor dim carrying the split features
    for i in members:
        op = graph.ops[i]
        dim = columns[i]
        for pos, dims in enumerate(op.signature.outputs):
            at = major_positions(dims).get(dim)  # type: ignore[arg-type]
            if at is not None:
                split[op.outputs[pos]] = at
    todo = sorted({c for t in split for c, _ in graph.consumers.get(t, ())})
    seen = set(members)
    while todo:
        index = heapq.heappop(todo)
        if index in seen:
            continue
        seen.add(index)
        outs = _carry(graph, graph.ops[index], split)
        if outs is None:
            return False
        for t, at in outs.items():
            split[t] = at
            for c, _ in graph.consumers.get(t, ()):
                heapq.heappush(todo, c)
    return True


def _carry(graph: Graph, op: Op, split: dict[str, int]) -> dict[str, int] | None:
    """Where `op` takes the split features arriving on its inputs: {output: tensor dim} to go
    on, {} when they end well here (row-parallel, a loss normalising them away), None when the
    group cannot be Megatron's (statistics over them, a residual partner, a FROZEN dim)."""
    dims = {
        op.signature.inputs[i][split[t]][0] if op.signature.inputs[i][split[t]] else None
        for i, t in enumerate(op.inputs)
        if t in split
    }
    if len(dims) != 1 or None in dims:
        return None
    (loop,) = dims
    for i in _activations(graph, op):  # every activation reading the features must be split
        if op.inputs[i] not in split and loop in loop_names(op.signature.inputs[i]):
            return None
    kind = op.signature.loop_dim(loop).kind
    params = [i for i, t in enumerate(op.inputs) if graph.tensors[t].role is Role.PARAMETER]
    in_param = any(loop in loop_names(op.signature.inputs[i]) for i in params)
    outs = {}
    for pos, out_dims in enumerate(op.signature.outputs):
        at = major_positions(out_dims).get(loop)
        if at is not None:
            outs[op.outputs[pos]] = at
    if kind is DimKind.REDUCE and in_param:
        return {}  # row-parallel: reduced against its parameter (a partial sum, all-reduced)
    if kind is not DimKind.PARALLEL:
        loss = has_trait(op.kind, Trait.NORMALISES) and not outs
        return {} if loss else None
    return outs or None


def _tensor_parallel_choice(graph: Graph, classes: Sequence[int] | None = None) -> Chooser:
    paired = paired_columns(graph, classes)
    # per op with a parameter: its loop dims' kinds and its vocab + column candidates, which
    # read the op alone (an op is decided once per round)
    static: dict[str, tuple[dict[str, DimKind], list[str]]] = {}

    def own(op: Op, params: list[int]) -> tuple[dict[str, DimKind], list[str]]:
        kinds = {d.name: d.kind for d in op.signature.loop_dims}
        activation_dims: set[str] = set()
        for i, dims in enumerate(op.signature.inputs):
            if i not in params:
                activation_dims |= loop_names(dims)
        param_dims = set().union(*(loop_names(op.signature.inputs[i]) for i in params))
        vocab = [
            d.name
            for d in op.signature.loop_dims
            if d.kind is DimKind.REDUCE and d.name in param_dims - activation_dims
        ]
        column = [
            d.name
            for d in op.signature.loop_dims
            if d.kind is DimKind.PARALLEL
            and d.name in param_dims - activation_dims
            and op.name in paired
        ]
        return kinds, vocab + column

    def choose(op: Op, arriving: dict[int, int]) -> list[str]:
        found = static.get(op.name)
        if found is None:
            params = [i for i, t in enumerate(op.inputs) if graph.tensors[t].role is Role.PARAMETER]
            if not params:
                return _follow(op, arriving)
            found = static[op.name] = own(op, params)
        kinds, rest = found
        followed = _follow(op, arriving)
        row = [d for d in followed if kinds[d] is DimKind.REDUCE]
        along = [d for d in followed if kinds[d] is not DimKind.REDUCE]
        return row + along + rest

    return choose


def megatron(
    graph: Graph,
    mesh: Mesh,
    tensor_ways: int | None = None,
    classes: Sequence[int] | None = None,
    data: Mapping[str, Strategy] | None = None,
) -> dict[str, Strategy]:
    """Tensor parallel on the innermost mesh axis, data parallel on the outer ones.

    `tensor_ways` (a product of the innermost rounds' q, default the whole innermost axis) keeps
    tensor parallelism on that many innermost ways; the other rounds are data-parallel. `data`:
    `data_parallel(graph, mesh, classes)` when known — its walk's first rounds are this plan's
    data-parallel walk (the data-parallel rounds come first and a round reads only earlier
    ones), so the plans at every tensor degree share one walk."""
    inner = len(mesh.shape) - 1
    rounds = mesh.rounds
    tp: set[int] = set()
    ways = mesh.shape[inner] if tensor_ways is None else tensor_ways
    for r in reversed(rounds):
        if ways % r.q or ways == 1:
            break
        tp.add(r.index)
        ways //= r.q
    if ways != 1:
        raise PlanError(
            f"tensor-parallel degree {tensor_ways} is not a product of the innermost rounds "
            f"{[r.q for r in rounds]} of mesh {mesh.text()}; pick a divisor of the innermost axis"
        )
    dp = {r.index for r in rounds} - tp
    classes = classes if classes is not None else op_classes(graph)
    if data is None:
        dp_cuts = _propagate(graph, mesh, dp, _batch_seed(graph), _follow, classes)
    else:
        dp_cuts = {
            name: [cut if r in dp else None for r, cut in enumerate(cuts)]
            for name, cuts in data.items()
        }
    tp_choice = _tensor_parallel_choice(graph, classes)
    tp_cuts = _propagate(graph, mesh, tp, lambda name: None, tp_choice, classes)
    # both walks shrink extents independently; re-check the merged strategy round by round
    merged: dict[str, Strategy] = {}
    checked: dict[tuple[object, ...], Strategy] = {}  # repeated layers are checked once
    from_dp = [r in dp for r in range(len(rounds))]
    for op, cid in zip(graph.ops, classes, strict=True):
        pairs = zip(from_dp, dp_cuts[op.name], tp_cuts[op.name], strict=True)
        proposed = tuple(a if data else b for data, a, b in pairs)
        key = (cid, proposed)
        if key not in checked:
            extents = op.signature.extents
            strategy: list[str | None] = []
            for rnd, cut in zip(rounds, proposed, strict=True):
                if cut is not None and cut_problem(op, cut, extents[cut], rnd.q) is None:
                    extents[cut] //= rnd.q
                    strategy.append(cut)
                else:
                    strategy.append(None)
            checked[key] = tuple(strategy)
        merged[op.name] = checked[key]
    return merged


def fsdp_param_layouts(graph: Graph, mesh: Mesh) -> dict[str, Layout]:
    """Every parameter split across all rounds: each round splits its largest divisible dim."""
    layouts: dict[str, Layout] = {}
    for t in graph.parameters:
        local = list(t.shape)
        layout: list[int] = []
        for rnd in mesh.rounds:
            options = [d for d in range(len(local)) if local[d] % rnd.q == 0]
            if not options:
                layout.append(-1)
                continue
            d = max(options, key=lambda k: (local[k], -k))
            local[d] //= rnd.q
            layout.append(d)
        layouts[t.name] = tuple(layout)
    return layouts


EXPERTS = ("data-parallel", "megatron", "fsdp")
