"""Per-round cost terms of one cut (intra-operator) and of one edge (redistribution).

Both the evaluator and the searches call these two functions, so a plan is scored exactly as it
was searched. Sizes are the local sizes before the round (already divided by earlier cuts).

Intra-operator, cutting loop dim d q ways in round r over bandwidth B:
  * each input T that d does not index is replicated across the q parts; in training its gradient
    is partial: all-reduce |T| backward (for a parameter: the data-parallel gradient sync);
  * an output that d does not index (d is REDUCE) holds partial sums: all-reduce |Y| forward;
  * a WINDOW d exchanges `halo` rows with both neighbours, forward and (training) backward.
Redistribution of a tensor between the producer's layout s and the consumer's layout t in round r:
  s == t -> 0; split i -> split j: all-to-all (both directions in training); split -> replicated:
  all-gather forward (its backward is a local slice of the already-reduced gradient);
  replicated -> split: a free local slice forward, an all-gather of the gradient backward.
In the symbolic "mindspore" preset the same structure counts elements: (q-1)/q of each
non-indexed tensor (x mu for parameters), and 16 x the local size for any mismatch.

An edge over all rounds (`edge_sizes`, `edge_redistribution`) is priced as the collectives an
engine runs, one piece per round whose layouts differ, each at its round's bandwidth:
  * all-to-all rounds (split on both sides, different dims), set A with Q = prod of their q: an
    engine runs ONE all-to-all over the Q devices; each device keeps 1/Q of its local piece L and
    sends (Q-1)/Q L. Round r in A carries the bytes bound for devices whose slowest differing
    round is r: (q_r-1)/q_r * L / prod(q of A rounds slower than r). These telescope (slowest
    first) to exactly (Q-1)/Q L bytes; time prices each byte at the slowest link it crosses (a
    sum over rounds, the hierarchical bound; with one bandwidth it is one collective's time).
    Per-round all-to-alls would send sum_r (q_r-1)/q_r L instead (1.5 L vs 7/8 L on 2,2,2).
  * all-gather rounds (split -> replicated, or the gradient's replicated -> split): a round
    faster than r shrinks r's piece (hierarchical gathers run on the slow links while pieces are
    small). Bytes telescope without any extra rule: on rounds q_s (slow) and q_f (fast),
    (q_s-1)/q_s * N/q_f + (q_f-1)/q_f * N = (q_s q_f - 1)/(q_s q_f) N = (Q-1)/Q N, one
    all-gather over the product, whatever the bandwidths (checked by hand and in
    tests/cost/test_edge_rounds.py).
  * a round split on both sides (equal dims, or an all-to-all) shrinks every other round's piece.
The symbolic preset keeps MindSpore's per-round count (no all-to-all grouping).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardplan.cost import collectives as coll
from shardplan.cost.backward import Piece, backward_bytes
from shardplan.cost.presets import CostOptions, CostPreset
from shardplan.ir.dims import DimKind
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role
from shardplan.ir.traits import backward_recompute
from shardplan.mesh import Mesh, Round
from shardplan.sharding import REPLICATED, Layout, layout_of_cut


@dataclass(frozen=True, slots=True)
class CommTerms:
    """Cost (seconds, or elements when symbolic) by category, plus bytes per collective kind.

    `*_bytes` are the bytes one device sends with ring algorithms (all-reduce 2(q-1)/q |T|,
    all-gather (q-1)/q |T|, all-to-all (q-1)/q |T|/q, halo both neighbours), so a collective an
    engine runs once over q0*q1 devices compares equal to our per-round pieces.
    """

    intra_fwd: float = 0.0
    intra_bwd: float = 0.0
    grad_sync: float = 0.0
    halo: float = 0.0
    redistribution_fwd: float = 0.0
    redistribution_bwd: float = 0.0
    all_reduce_bytes: float = 0.0
    all_gather_bytes: float = 0.0
    all_to_all_bytes: float = 0.0
    halo_bytes: float = 0.0
    reduce_scatter_bytes: float = 0.0
    """ZeRO's gradient reduce-scatter (`cost/zero.py`): (q-1)/q |T| per device."""

    @property
    def total(self) -> float:
        return (
            self.intra_fwd
            + self.intra_bwd
            + self.grad_sync
            + self.halo
            + self.redistribution_fwd
            + self.redistribution_bwd
        )

    def values(self) -> tuple[float, ...]:
        """Every field, in declaration order (what `+` adds field by field)."""
        return _fields(self)

    def __add__(self, other: CommTerms) -> CommTerms:
        # field by field, written out: the hot sum of the evaluator
        return CommTerms(
            self.intra_fwd + other.intra_fwd,
            self.intra_bwd + other.intra_bwd,
            self.grad_sync + other.grad_sync,
            self.halo + other.halo,
            self.redistribution_fwd + other.redistribution_fwd,
            self.redistribution_bwd + other.redistribution_bwd,
            self.all_reduce_bytes + other.all_reduce_bytes,
            self.all_gather_bytes + other.all_gather_bytes,
            self.all_to_all_bytes + other.all_to_all_bytes,
            self.halo_bytes + other.halo_bytes,
            self.reduce_scatter_bytes + other.reduce_scatter_bytes,
        )

    def __sub__(self, other: CommTerms) -> CommTerms:
        return CommTerms(*(a - b for a, b in zip(_fields(self), _fields(other), strict=True)))


def _fields(t: CommTerms) -> tuple[float, ...]:
    return (
        t.intra_fwd,
        t.intra_bwd,
        t.grad_sync,
        t.halo,
        t.redistribution_fwd,
        t.redistribution_bwd,
        t.all_reduce_bytes,
        t.all_gather_bytes,
        t.all_to_all_bytes,
        t.halo_bytes,
        t.reduce_scatter_bytes,
    )


ZERO = CommTerms()


def _indexes(dims: object, loop_dim: str) -> bool:
    """Does this operand (tensor dims as groups of loop dims) carry `loop_dim`?"""
    for group in dims:  # type: ignore[attr-defined]
        if loop_dim in group:
            return True
    return False


@dataclass(frozen=True, slots=True)
class OperandInfo:
    """What the cost terms need to know about one operand of an op at one round.

    `ar_divisor` shrinks this operand's all-reduce volume by the q of faster rounds that reduce
    it hierarchically first (see `faster`): a multi-round all-reduce then telescopes to the ring
    volume 2(1 - 1/Q)|T|, the slow links carrying the smallest pieces. `grad_shared` says another
    consumer with the same layout already all-reduces this tensor's gradient in this round
    (gradients of a fan-out tensor are summed locally first, then reduced once).
    """

    numel: float
    dtype_bytes: int
    role: Role
    requires_grad: bool
    ar_divisor: float = 1.0
    grad_shared: bool = False


def intra_terms(
    op: Op,
    loop_dim: str | None,
    rnd: Round,
    inputs: Sequence[OperandInfo],
    outputs: Sequence[OperandInfo],
    local_extent: int,
    opts: CostOptions,
) -> CommTerms:
    """Intra-operator communication of cutting `loop_dim` in round `rnd` (None: replicate -> 0).

    `local_extent` is the loop dim's extent before the round (used for the halo of WINDOW cuts).
    """
    if loop_dim is None:
        return ZERO
    q, bandwidth = rnd.q, rnd.bandwidth_bytes_per_s
    preset = opts.preset
    dim = op.signature.loop_dim(loop_dim)
    share = (q - 1) / q
    fwd = bwd = sync = halo = ar_bytes = halo_bytes = 0.0
    for info, dims in zip(inputs, op.signature.inputs, strict=True):
        if _indexes(dims, loop_dim):
            if dim.kind is DimKind.WINDOW and dim.halo:
                rows = info.numel / max(local_extent, 1) * dim.halo
                if preset.symbolic:
                    halo += share * info.numel
                else:
                    hb = rows * info.dtype_bytes
                    passes = 2 if (opts.train and info.requires_grad) else 1
                    halo += passes * coll.halo_exchange_s(hb, bandwidth)
                    halo_bytes += passes * 2 * hb
            continue
        if preset.symbolic:
            cost = share * info.numel * (preset.param_coef if info.role is Role.PARAMETER else 1)
        elif opts.train and info.requires_grad and not info.grad_shared:
            nbytes = info.numel * info.dtype_bytes / info.ar_divisor
            cost = coll.all_reduce_s(nbytes, q, bandwidth)
            ar_bytes += coll.all_reduce_bytes(nbytes, q)
        else:
            continue
        if info.role is Role.PARAMETER:
            sync += cost * opts.grad_sync_weight
        else:
            bwd += cost
    if dim.kind is DimKind.REDUCE:
        for info, dims in zip(outputs, op.signature.outputs, strict=True):
            if _indexes(dims, loop_dim):
                continue
            if preset.symbolic:
                fwd += share * info.numel
            else:
                nbytes = info.numel * info.dtype_bytes / info.ar_divisor
                fwd += coll.all_reduce_s(nbytes, q, bandwidth)
                ar_bytes += coll.all_reduce_bytes(nbytes, q)
    return CommTerms(
        intra_fwd=fwd,
        intra_bwd=bwd,
        grad_sync=sync,
        halo=halo,
        all_reduce_bytes=ar_bytes,
        halo_bytes=halo_bytes,
    )


def faster(j: Round, r: Round) -> bool:
    """Hierarchical collectives run on faster links first (ties: the inner round first)."""
    if j.bandwidth_bytes_per_s != r.bandwidth_bytes_per_s:
        return j.bandwidth_bytes_per_s > r.bandwidth_bytes_per_s
    return j.index > r.index


def reduces(
    op: Op, loop_dim: str | None, dims: object, is_output: bool, requires_grad: bool, train: bool
) -> bool:
    """Does cutting `loop_dim` all-reduce this operand (its gradient, or its partial sums)?"""
    if loop_dim is None or _indexes(dims, loop_dim):  # type: ignore[arg-type]
        return False
    if is_output:
        return op.signature.loop_dim(loop_dim).kind is DimKind.REDUCE
    return train and requires_grad


def replicate_symbolic(min_cut_cost: float, preset: CostPreset) -> float:
    """D-Rec's "no cut" option: attractive only for tiny operators."""
    return (preset.expert_coef * min_cut_cost) ** 2 / preset.replicate_below


def redistribution_terms(
    src: int,
    dst: int,
    numel: float,
    dtype_bytes: int,
    rnd: Round,
    requires_grad: bool,
    opts: CostOptions,
) -> CommTerms:
    """Cost of one edge in one round: producer layout `src` -> consumer layout `dst`.

    `numel` is the tensor's size local to the round (before this round's split).
    """
    if src == dst:
        return ZERO
    if opts.preset.symbolic:
        return CommTerms(redistribution_fwd=opts.preset.redis_coef * numel)
    q, bandwidth = rnd.q, rnd.bandwidth_bytes_per_s
    nbytes = numel * dtype_bytes
    backward = opts.train and requires_grad
    if src >= 0 and dst >= 0:
        cost = coll.all_to_all_s(nbytes, q, bandwidth)
        passes = 2 if backward else 1
        return CommTerms(
            redistribution_fwd=cost,
            redistribution_bwd=cost if backward else 0.0,
            all_to_all_bytes=passes * coll.all_gather_bytes(nbytes, q) / q,
        )
    if src >= 0 and dst == REPLICATED:
        return CommTerms(
            redistribution_fwd=coll.all_gather_s(nbytes, q, bandwidth),
            all_gather_bytes=coll.all_gather_bytes(nbytes, q),
        )
    if src == REPLICATED and dst >= 0:
        if not backward:
            return ZERO
        return CommTerms(
            redistribution_bwd=coll.all_gather_s(nbytes, q, bandwidth),
            all_gather_bytes=coll.all_gather_bytes(nbytes, q),
        )
    raise AssertionError(f"unexpected layout pair {src} -> {dst}")


def edge_sizes(
    numel: float,
    src: Sequence[int],
    dst: Sequence[int],
    rounds: Sequence[Round],
    grouped: bool,
    wanted: Sequence[int] | None = None,
) -> list[float]:
    """Per round of `wanted` (default: every round), the size of the tensor that round's
    collective works on (see the module docstring): round j != r divides it when the data stays
    split along j while r runs (split on both sides), or j differs and is faster than r
    (hierarchical gathers); with `grouped`, an all-to-all round r is also divided by the
    all-to-all rounds slower than it (one all-to-all over their product). O(rounds x wanted)."""
    out = []
    bw = [rnd.bandwidth_bytes_per_s for rnd in rounds]
    idx = [rnd.index for rnd in rounds]
    n = len(rounds)
    for r in range(n) if wanted is None else wanted:
        a2a = grouped and src[r] >= 0 and dst[r] >= 0 and src[r] != dst[r]
        divisor = 1.0
        for j in range(n):
            if j == r:
                continue
            both = src[j] >= 0 and dst[j] >= 0
            # `faster(rounds[j], rounds[r])` and its converse, read off the two lists
            if bw[j] != bw[r]:
                j_first, r_first = bw[j] > bw[r], bw[r] > bw[j]
            else:
                j_first, r_first = idx[j] > idx[r], idx[r] > idx[j]
            if both or (src[j] != dst[j] and j_first):
                divisor *= rounds[j].q
            if a2a and both and src[j] != dst[j] and r_first:
                divisor *= rounds[j].q  # bytes for devices across a slower round go there
        out.append(numel / divisor)
    return out


def edge_redistribution(
    src: Sequence[int],
    dst: Sequence[int],
    numel: float,
    dtype_bytes: int,
    rounds: Sequence[Round],
    requires_grad: bool,
    opts: CostOptions,
    only: int | None = None,
) -> CommTerms:
    """Redistribution of a tensor of `numel` elements from layout `src` to `dst` over `rounds`
    (any prefix of a mesh's rounds): the evaluator's, the ILP tables' and, as differences of
    prefixes, D-Rec's edge price; `only`: round `only`'s piece alone. O(rounds ** 2)."""
    moved = [r for r in range(len(rounds)) if src[r] != dst[r] and (only is None or r == only)]
    sizes = edge_sizes(numel, src, dst, rounds, not opts.preset.symbolic, moved)  # those alone
    total = ZERO
    for r, size in zip(moved, sizes, strict=True):
        total = total + redistribution_terms(
            src[r], dst[r], size, dtype_bytes, rounds[r], requires_grad, opts
        )
    return total


def param_bytes(numel: float, dtype_bytes: int, opts: CostOptions) -> float:
    """Bytes `numel` elements of a parameter stored in `dtype_bytes` take on a device: the weights,
    and in training their gradients (same dtype) and the optimizer's state (fp32 whatever the
    weights' dtype: `state_bytes_per_param` bytes per element), plus the fp32 master copy under
    mixed precision (`CostOptions.state_bytes_for`). The evaluator's memory, the ILP's
    memory pieces and D-Rec's price of kept replicas all use this one formula."""
    if not opts.train:
        return numel * dtype_bytes
    return numel * opts.state_bytes_for(dtype_bytes)


def round_numels(numel: float, layout: Layout, rounds: Sequence[Round]) -> list[float]:
    """Local size before each round, and after the last: [n_0, ..., n_R]."""
    sizes = [float(numel)]
    for r, s in zip(rounds, layout, strict=True):
        sizes.append(sizes[-1] / r.q if s >= 0 else sizes[-1])
    return sizes


def local_bytes(
    graph: Graph,
    name: str,
    layout: Layout,
    rounds: Sequence[Round],
    opts: CostOptions | None = None,
) -> float:
    """Bytes of tensor `name` on one device in `layout` (at `opts`' precision when given)."""
    t = graph.tensors[name]
    width = opts.element_bytes(t) if opts is not None else t.dtype_bytes
    return round_numels(t.numel, layout, rounds)[-1] * width


def compute_cost(
    flops_local: float,
    bytes_local: float,
    opts: CostOptions,
    mesh: Mesh,
    bwd_bytes_local: float | None = None,
    backward_recompute: float = 0.0,
) -> float:
    """Seconds of compute of one op on one device: a roofline with a launch floor.

    time = max(flops / (peak x flops_efficiency), bytes / (HBM x hbm_efficiency), launch_s),
    `bytes_local` being the op's local input + output bytes. Training adds the backward:
    given `bwd_bytes_local` (`cost.backward.backward_bytes`: what the op's own backward reads and
    writes), the same roofline of (training_flops_factor - 1) x the FLOPs and those bytes (0
    bytes: no backward kernel); without it (an estimate that knows only sizes), the preset's
    factor x the forward; `backward_recompute` (`ir.traits.backward_recompute`: fused
    attention's scores) adds that fraction of the forward FLOPs to the backward. An op of 0 FLOPs
    is a view (reshape, transpose, concat in the catalogue): free. Peak is the mesh's rate (the
    dtype's, see `hardware.peak_flops`); the other constants are its machine's
    (`hardware.Machine`). 0 in the symbolic preset. O(1).
    """
    if opts.preset.symbolic or flops_local <= 0:
        return 0.0
    m = mesh.hardware
    assert m is not None  # a Mesh always binds its Machine

    def roofline(flops: float, nbytes: float) -> float:
        return max(
            flops / (mesh.flops_per_s * m.flops_efficiency),
            nbytes / (m.hbm_bytes_per_s * m.hbm_efficiency),
            m.launch_s,
        )

    t = roofline(flops_local, bytes_local)
    factor = opts.preset.training_flops_factor
    if not opts.train:
        return t
    if bwd_bytes_local is None:
        return t * (factor + backward_recompute)
    if bwd_bytes_local <= 0:  # autograd hands the gradient on: no kernel
        return t
    return t + roofline((factor - 1 + backward_recompute) * flops_local, bwd_bytes_local)


def piece_compute(
    op: Op,
    loop_dim: str | None,
    q: int,
    flops: float,
    inputs: Sequence[OperandInfo],
    outputs: Sequence[OperandInfo],
    opts: CostOptions,
    mesh: Mesh,
    ideal: bool = False,
) -> float:
    """`compute_cost` of one device's piece of `op` after cutting `loop_dim` q ways (None: uncut),
    from its FLOPs and operand sizes before the round: an operand the cut does not split (a
    weight under a batch cut) is read whole; the backward by its own bytes (`cost.backward`).
    `ideal`: the ideal 1/q piece instead (FLOPs and every operand split q ways)."""
    sig = op.signature
    pieces: tuple[list[Piece], list[Piece]] = ([], [])
    for is_output, infos, groups in ((False, inputs, sig.inputs), (True, outputs, sig.outputs)):
        for info, dims in zip(infos, groups, strict=True):
            split = ideal or (
                loop_dim is not None and layout_of_cut(dims, loop_dim, is_output, op) >= 0
            )
            nbytes = info.numel * info.dtype_bytes / (q if split else 1)
            parameter = info.role is Role.PARAMETER
            piece = Piece(nbytes, info.numel, info.dtype_bytes, parameter, info.requires_grad)
            pieces[is_output].append(piece)
    nbytes = sum(p.nbytes for side in pieces for p in side)
    bwd = backward_bytes(op.kind, *pieces)
    cut = ideal or loop_dim is not None
    extra = backward_recompute(op.kind)
    return compute_cost(flops / q if cut else flops, nbytes, opts, mesh, bwd, extra)
