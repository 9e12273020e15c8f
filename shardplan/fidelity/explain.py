"""The `_Explainer` of `shardplan.fidelity.verify`: rules that read the compiled HLO and the plan
to attribute each per-operator difference between measured and predicted bytes to a cause
(see `shardplan.fidelity.causes.CAUSES`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from shardplan.cost.collectives import CollectiveKind as Kind
from shardplan.fidelity.causes import _Delta, _significant
from shardplan.fidelity.measure import MeasuredCollective, _dims, _numel, sent_bytes
from shardplan.fidelity.predict import OpPrediction, kind_bytes
from shardplan.ir.op import Role
from shardplan.ir.traits import Trait, traits_of
from shardplan.plans import Plan


class _Explainer:
    """Rules that attribute each per-operator difference to a cause (see CAUSES)."""

    def __init__(
        self,
        plan: Plan,
        pred: Mapping[str, OpPrediction],
        measured: Sequence[MeasuredCollective],
        sizes: Mapping[str, int] | None = None,
    ) -> None:
        self.plan, self.graph, self.pred = plan, plan.graph, pred
        self.sizes = dict(sizes or {})
        self.elems: dict[tuple[str, str], list[MeasuredCollective]] = defaultdict(list)
        for m in measured:
            self.elems[(m.op, m.kind)].append(m)
        self.merged: dict[str, float] = defaultdict(float)
        for m in measured:
            for other in m.ops[1:]:
                self.merged[other] += m.sent_bytes
        self._adj: dict[str, set[str]] | None = None
        self.used_shortfall: dict[tuple[str, str, int], float] = defaultdict(float)

    # -- graph helpers --------------------------------------------------------------------------
    def neighbours(self, op: str, hops: int) -> list[str]:
        """Operators within `hops` edges of `op`, nearest first (not `op` itself)."""
        if self._adj is None:
            adj: dict[str, set[str]] = defaultdict(set)
            g = self.graph
            for o in g.ops:
                for t in o.inputs:
                    p = g.producer.get(t)
                    if p is not None:
                        adj[o.name].add(g.ops[p].name)
                        adj[g.ops[p].name].add(o.name)
            self._adj = adj
        seen, frontier, order = {op}, [op], []
        for _ in range(hops):
            nxt = []
            for x in frontier:
                for y in sorted(self._adj.get(x, ())):
                    if y not in seen:
                        seen.add(y)
                        nxt.append(y)
                        order.append(y)
            frontier = nxt
        return order

    def params_of(self, op: str) -> list[str]:
        return [t for t in self.graph.op(op).inputs if self.graph.tensors[t].role is Role.PARAMETER]

    # -- excess rules ---------------------------------------------------------------------------
    def statistics(self, d: _Delta) -> None:
        if not d.op or d.kind not in (Kind.ALL_REDUCE, Kind.ALL_GATHER):
            return
        op = self.graph.op(d.op)
        traits = traits_of(op.kind)
        if Trait.NORMALISES not in traits:
            return
        x = self.graph.tensors[op.inputs[0]].shape
        kept = traits.statistics_kept
        if Trait.STATISTICS_OVER_PARALLEL in traits and kept is not None:
            per_row = x[kept] if len(x) > kept else 1
        else:
            frozen = _numel(dm.extent for dm in op.signature.loop_dims if dm.kind.name == "FROZEN")
            per_row = _numel(x) // max(frozen, 1)
        small = [m for m in self.elems[(d.op, d.kind)] if _numel(_dims(m.shape)[1]) <= per_row]
        d.take(
            sum(m.sent_bytes for m in small),
            "norm-statistics",
            f"{len(small)} statistic-sized collectives",
        )

    def shared_gradient(self, d: _Delta) -> None:
        if d.kind != Kind.ALL_REDUCE or not d.op:
            return
        credit = self.pred[d.op].shared_credit_bytes
        bwd = sum(m.sent_bytes for m in self.elems[(d.op, d.kind)] if m.backward)
        if credit > 0 and bwd > 0:
            d.take(
                min(credit, bwd),
                "shared-gradient",
                f"model credits {credit:.0f} B of gradient all-reduce to an earlier reader",
            )

    def gradient_steps(self, d: _Delta) -> None:
        if d.kind != Kind.ALL_REDUCE or not d.op:
            return
        by_shape: dict[str, list[MeasuredCollective]] = defaultdict(list)
        for m in self.elems[(d.op, d.kind)]:
            if m.backward:
                by_shape[m.shape].append(m)
        extra = 0.0
        for ms in by_shape.values():
            if len(ms) < 2 or len({m.group_size for m in ms}) < 2:
                continue
            group = _numel(m.group_size for m in ms)
            extra += sum(m.sent_bytes for m in ms) - sent_bytes(
                Kind.ALL_REDUCE, ms[0].buffer_bytes, group
            )
        if extra > 0:
            d.take(
                extra,
                "gradient-in-steps",
                f"{extra:.0f} B above one ring all-reduce of the same buffers",
            )

    def gradient_steps_gather(self, d: _Delta) -> None:
        """An all-gather closing a stepwise all-reduce of an activation gradient (`add_any`)."""
        if d.kind != Kind.ALL_GATHER or not d.op:
            return
        op = self.graph.op(d.op)
        shapes = {self.graph.tensors[t].shape for t in op.inputs}
        ms = [
            m
            for m in self.elems[(d.op, d.kind)]
            if m.backward and "add_any" in m.op_name and _dims(m.shape)[1] in shapes
        ]
        stepped = any(
            len(
                {
                    m.group_size
                    for m in self.elems[(self.graph.ops[i].name, Kind.ALL_REDUCE)]
                    if m.backward
                }
            )
            > 1
            for t in op.inputs
            for i, _ in self.graph.consumers.get(t, ())
        )
        if ms and stepped:
            d.take(
                sum(m.sent_bytes for m in ms),
                "gradient-in-steps",
                "all-gather after sub-group all-reduces of an activation gradient",
            )

    def _param_shaped(self, op: str, shape: str) -> bool:
        """Is `shape` (a piece of) a parameter of `op` rather than one of its activations?"""
        _, dims = _dims(shape)
        o = self.graph.op(op)
        if any(
            self.graph.tensors[t].shape == dims
            for t in (*o.inputs, *o.outputs)
            if self.graph.tensors[t].role is not Role.PARAMETER
        ):
            return False
        for p in self.params_of(op):
            ps = self.graph.tensors[p].shape
            if len(ps) == len(dims) and all(
                a and b % a == 0 for a, b in zip(dims, ps, strict=True)
            ):
                return True
        return False

    def weight_regather(self, d: _Delta) -> None:
        if d.kind != Kind.ALL_GATHER or not d.op:
            return
        ms = [
            m
            for m in self.elems[(d.op, d.kind)]
            if m.backward and self._param_shaped(d.op, m.shape)
        ]
        d.take(
            sum(m.sent_bytes for m in ms),
            "weight-regather",
            f"{len(ms)} parameter gather(s) in the backward pass",
        )

    def _round_permuted(self, op: str) -> bool:
        for name in (op, *self.neighbours(op, 1)):
            for e in self.pred[name].edges:
                src = {d: {r for r, s in enumerate(e.src) if s == d} for d in set(e.src) if d >= 0}
                dst = {d: {r for r, s in enumerate(e.dst) if s == d} for d in set(e.dst) if d >= 0}
                if any(d in dst and src[d] != dst[d] for d in src):
                    return True
        return False

    def round_order(self, d: _Delta, late: bool = False) -> None:
        """collective-permute (early) or backward all-gather (late, after neighbour moves) next
        to an edge that splits the same tensor dim in other rounds."""
        if not d.op or d.kind != (Kind.ALL_GATHER if late else Kind.COLLECTIVE_PERMUTE):
            return
        if self._round_permuted(d.op):
            ms = self.elems[(d.op, d.kind)]
            if d.kind == Kind.COLLECTIVE_PERMUTE:
                d.take(sum(m.sent_bytes for m in ms), "round-order")
            else:
                d.take(
                    sum(m.sent_bytes for m in ms if m.backward),
                    "round-order",
                    "gradient gathered across permuted rounds",
                )

    def input_resharding(self, d: _Delta) -> None:
        if not d.op:
            return
        ms = self.elems[(d.op, d.kind)]
        ints = [m for m in ms if _dims(m.shape)[0][:1] in ("s", "u")]
        d.take(
            sum(m.sent_bytes for m in ints), "input-resharding", "integer index buffers exchanged"
        )
        if d.done():
            return
        op = self.graph.op(d.op)
        placed = self.plan.input_layouts()
        from shardplan.sharding import operand_layout

        for i, t in enumerate(op.inputs):
            tensor = self.graph.tensors[t]
            if tensor.role not in (Role.INPUT, Role.CONSTANT) or t not in placed:
                continue
            if placed[t] == operand_layout(op, self.plan.strategies[op.name], i):
                continue
            same = [
                m
                for m in ms
                if len(_dims(m.shape)[1]) == len(tensor.shape)
                and all(
                    a and b % a == 0 for a, b in zip(_dims(m.shape)[1], tensor.shape, strict=True)
                )
            ]
            d.take(
                sum(m.sent_bytes for m in same),
                "input-resharding",
                f"input {t!r} placed as {placed[t]} is read in another layout",
            )

    def _a2a_tensors(self, op_name: str) -> list[tuple[int, ...]]:
        """Shapes of tensors an all-to-all edge at `op_name` or at a reader of its outputs moves."""
        op = self.graph.op(op_name)
        names = [op_name] + [
            self.graph.ops[i].name for t in op.outputs for i, _ in self.graph.consumers.get(t, ())
        ]
        return [
            self.graph.tensors[e.tensor].shape
            for n in names
            for e in self.pred[n].edges
            if e.terms.all_to_all_bytes > 0
        ]

    def a2a_as_gather(self, d: _Delta) -> None:
        if not d.op:
            return
        shapes = self._a2a_tensors(d.op)
        if not shapes:
            return

        def piece(m: MeasuredCollective) -> bool:
            dims = _dims(m.shape)[1]
            return any(
                len(dims) == len(s) and all(a and b % a == 0 for a, b in zip(dims, s, strict=True))
                for s in shapes
            )

        if d.kind == Kind.ALL_GATHER and d.sign > 0:
            d.take(
                sum(m.sent_bytes for m in self.elems[(d.op, d.kind)] if piece(m)),
                "all-gather-for-all-to-all",
            )
        if d.kind == Kind.ALL_TO_ALL and d.sign < 0:
            if any(piece(m) for m in self.elems[(d.op, Kind.ALL_GATHER)]):
                d.take(d.remaining, "all-gather-for-all-to-all")

    def gather_shortfall(self, d: _Delta) -> None:
        if d.kind != Kind.ALL_GATHER or not d.op:
            return
        budget = sum(m.sent_bytes for m in self.elems[(d.op, d.kind)] if m.backward)
        op = self.graph.op(d.op)
        candidates = [(d.op, e) for e in self.pred[d.op].edges]
        # a gradient is gathered at its producer's constraint or where readers add it up
        for t in (*op.outputs, *op.inputs):
            for index, _ in self.graph.consumers.get(t, ()):
                consumer = self.graph.ops[index].name
                candidates += [(consumer, e) for e in self.pred[consumer].edges if e.tensor == t]
        for name, e in dict.fromkeys(candidates):
            key = (name, e.tensor, e.position)
            left = min(e.gather_shortfall - self.used_shortfall[key], budget)
            if left > 0:
                budget -= left
                got = d.take(
                    left, "gradient-gather-volume", f"gradient of {e.tensor!r} gathered whole"
                )
                self.used_shortfall[key] += got
            if d.done():
                return

    def contract_split_input(self, d: _Delta) -> None:
        if d.kind != Kind.ALL_REDUCE or not d.op:
            return
        op = self.graph.op(d.op)
        split_reduced = False
        for e in self.pred[d.op].edges:
            dims = op.signature.inputs[e.position]
            for s_, t_ in zip(e.src, e.dst, strict=True):
                if (
                    0 <= s_ < len(dims)
                    and t_ != s_
                    and dims[s_]
                    and op.signature.loop_dim(dims[s_][0]).kind.name == "REDUCE"
                ):
                    split_reduced = True
        if split_reduced:
            fwd = sum(m.sent_bytes for m in self.elems[(d.op, d.kind)] if not m.backward)
            d.take(fwd, "contract-split-input", "partial products all-reduced")

    # -- deficit rules --------------------------------------------------------------------------
    def split_normalised_axis(self, d: _Delta) -> None:
        """The input arrives split on the FROZEN (normalised) axis: XLA normalises it in that
        layout (statistics all-reduced) and reshards the result, not the input."""
        if not d.op:
            return
        op = self.graph.op(d.op)
        traits = traits_of(op.kind)
        if Trait.NORMALISES not in traits or Trait.STATISTICS_OVER_PARALLEL in traits:
            return
        amount = 0.0
        for e in self.pred[d.op].edges:
            dims = op.signature.inputs[e.position]
            for s in e.src:
                if (
                    0 <= s < len(dims)
                    and dims[s]
                    and op.signature.loop_dim(dims[s][0]).kind.name == "FROZEN"
                ):
                    amount += kind_bytes(e.terms, d.kind) if d.sign < 0 else float("inf")
                    break
        if d.sign > 0 and d.kind in (Kind.ALL_GATHER, Kind.ALL_TO_ALL, Kind.COLLECTIVE_PERMUTE):
            amount = min(amount, sum(m.sent_bytes for m in self.elems[(d.op, d.kind)]))
        elif d.sign > 0:
            return
        d.take(amount, "split-normalised-axis", "normalised in the arriving split layout")

    def merged_partial_sums(self, d: _Delta) -> None:
        if not d.op:
            return
        if d.kind == Kind.ALL_REDUCE and self.merged.get(d.op):
            d.take(
                d.remaining,
                "merged-partial-sums",
                "reduced together with another operator's partial sums",
            )
        if d.kind != Kind.ALL_GATHER or not self.plan.options.train:
            return
        from shardplan.cost.terms import reduces

        for e in self.pred[d.op].edges:  # a split gradient added into another's partial sum
            if not any(s < 0 <= t for s, t in zip(e.src, e.dst, strict=True)):
                continue
            if self._gathered_whole(e.tensor):
                continue
            for index, pos in self.graph.consumers.get(e.tensor, ()):
                other = self.graph.ops[index]
                strat = self.plan.strategies[other.name]
                if other.name != d.op and any(
                    reduces(other, c, other.signature.inputs[pos], False, True, True) for c in strat
                ):
                    d.take(
                        e.terms.all_gather_bytes,
                        "merged-partial-sums",
                        f"gradient of {e.tensor!r} folded into {other.name!r}'s reduction",
                    )
                    break

    def _gathered_whole(self, tensor: str) -> bool:
        """Is a backward all-gather of `tensor`'s full shape measured at its producer/readers?"""
        shape = self.graph.tensors[tensor].shape
        ops = [self.graph.ops[i].name for i, _ in self.graph.consumers.get(tensor, ())]
        if tensor in self.graph.producer:
            ops.append(self.graph.ops[self.graph.producer[tensor]].name)
        return any(
            m.backward and _dims(m.shape)[1] == tuple(shape)
            for o in ops
            for m in self.elems[(o, Kind.ALL_GATHER)]
        )

    def partial_gradient_slice(self, d: _Delta) -> None:
        if d.kind != Kind.ALL_REDUCE or not d.op:
            return
        from shardplan.sharding import local_shape

        rounds = self.plan.mesh.rounds
        sizes = set()
        for e in self.pred[d.op].edges:
            sliced = [
                r for r, (s, t) in enumerate(zip(e.src, e.dst, strict=True)) if s >= 0 and t < 0
            ]
            if sliced:
                full = _numel(local_shape(self.graph.tensors[e.tensor].shape, e.dst, rounds))
                sizes.add(full // _numel(rounds[r].q for r in sliced))
        ms = [
            m
            for m in self.elems[(d.op, d.kind)]
            if m.backward and _numel(_dims(m.shape)[1]) in sizes
        ]
        if ms:
            d.take(
                d.remaining,
                "partial-gradient-slice",
                "only the producer's slice of the gradient is all-reduced",
            )

    # -- deficit rules ----

    def replicated_compute(self, d: _Delta) -> None:
        """A deficit at an operator XLA computed whole (its per-device result is global), or the
        all-gather of its input that computing it whole takes (a top-k XLA does not split)."""
        if not d.op or (d.sign > 0 and d.kind != Kind.ALL_GATHER):
            return
        from shardplan.sharding import local_shape, operand_layout

        op = self.graph.op(d.op)
        out = self.graph.tensors[op.outputs[0]]
        layout = operand_layout(op, self.plan.strategies[d.op], 0, True)
        planned = _numel(local_shape(out.shape, layout, self.plan.mesh.rounds))
        if planned < out.numel and self.sizes.get(d.op, 0) >= out.numel:
            d.take(
                d.remaining,
                "xla-replicated-compute",
                f"computed on the whole {out.shape} instead of a {planned}-element part",
            )

    # -- the whole pass -------------------------------------------------------------------------
    def run(
        self,
        keys: Sequence[tuple[str, str]],
        predicted: Mapping[tuple[str, str], float],
        measured: Mapping[tuple[str, str], float],
    ) -> list[_Delta]:
        deltas = []
        for key in keys:
            p, m = predicted.get(key, 0.0), measured.get(key, 0.0)
            if _significant(p, m):
                deltas.append(_Delta(key[0], key[1], p, m, abs(m - p)))
        for d in deltas:
            if not d.op:
                d.take(d.remaining, "outside-graph")
                continue
            rules = (
                (
                    self.statistics,
                    self.shared_gradient,
                    self.gradient_steps,
                    self.weight_regather,
                    self.round_order,
                    self.input_resharding,
                    self.gather_shortfall,
                    self.contract_split_input,
                    self.split_normalised_axis,
                    self.replicated_compute,
                )
                if d.sign > 0
                else (
                    self.split_normalised_axis,
                    self.merged_partial_sums,
                    self.partial_gradient_slice,
                    self.replicated_compute,
                )
            )
            for rule in rules:
                if d.done():
                    break
                rule(d)
        by_op: dict[str, list[_Delta]] = defaultdict(list)
        for d in deltas:
            by_op[d.op].append(d)
        self._sharded_parameters(by_op)
        self._neighbour_moves(deltas)
        for d in deltas:  # rules that are weaker evidence than a neighbour's prediction
            if not d.done():
                self.a2a_as_gather(d)
            if d.sign > 0 and not d.done():
                self.gradient_steps_gather(d)
            if d.sign > 0 and not d.done():
                self.round_order(d, late=True)
        self._partitioning(by_op)
        return deltas

    def _sharded_parameters(self, by_op: Mapping[str, list[_Delta]]) -> None:
        from shardplan.sharding import operand_layout

        for op_name, ds in by_op.items():
            if not op_name or not any(
                d.kind == Kind.ALL_GATHER and d.sign < 0 and not d.done() for d in ds
            ):
                continue
            op = self.graph.op(op_name)
            stored = [
                t
                for i, t in enumerate(op.inputs)
                if t in self.plan.param_layouts
                and tuple(self.plan.param_layouts[t])
                != operand_layout(op, self.plan.strategies[op_name], i)
            ]
            if stored:
                gap = sum(d.remaining for d in ds if d.kind == Kind.ALL_GATHER and d.sign < 0)
                reuse = self._gathered_elsewhere(op_name, stored[0], gap)
                cause, detail = (
                    ("shared-parameter-gather", f"{stored[0]!r} gathered at {reuse!r}, reused")
                    if reuse
                    else ("sharded-parameter-compute", f"{stored[0]!r} stays split")
                )
                for d in ds:
                    if not d.done():
                        d.take(d.remaining, cause, detail)

    def _gathered_elsewhere(self, op_name: str, param: str, gap: float) -> str:
        """Another reader of `param` in the same layout where XLA all-gathered at least `gap`
        bytes (the missing gather), or ""."""
        from shardplan.sharding import operand_layout

        op = self.graph.op(op_name)
        want = operand_layout(op, self.plan.strategies[op_name], op.inputs.index(param))
        for other in self.graph.ops:
            sent = sum(m.sent_bytes for m in self.elems.get((other.name, Kind.ALL_GATHER), ()))
            if other.name == op_name or sent < gap:
                continue
            strategy = self.plan.strategies[other.name]
            for i, t in enumerate(other.inputs):
                if t == param and operand_layout(other, strategy, i) == want:
                    return other.name
        return ""

    def _neighbour_moves(self, deltas: Sequence[_Delta]) -> None:
        """Pair an excess with a deficit of the same kind at a neighbour (nearest first)."""
        open_ = {(d.op, d.kind): d for d in deltas if d.op}
        for hops in (1, 2):
            for d in deltas:
                if d.sign < 0 or d.done() or not d.op:
                    continue
                near = self.neighbours(d.op, hops)
                if hops > 1:
                    near = [n for n in near if n not in set(self.neighbours(d.op, hops - 1))]
                for other in near:
                    o = open_.get((other, d.kind))
                    if o is None or o.sign > 0 or o.done():
                        continue
                    amount = min(d.remaining, o.remaining)
                    d.take(amount, "moved-to-neighbour", f"predicted at {other!r}")
                    o.take(amount, "moved-to-neighbour", f"measured at {d.op!r}")
                    if d.done():
                        break

    def _partitioning(self, by_op: Mapping[str, list[_Delta]]) -> None:
        for op_name, ds in by_op.items():
            if not op_name:
                continue
            open_ = [d for d in ds if not d.done()]
            if not open_:
                continue
            strategy = self.plan.strategies[op_name]
            multi = len({c for c in strategy if c is not None}) >= 2
            mixed = any(d.sign > 0 for d in ds) and any(d.sign < 0 for d in ds)
            forward = any(
                not m.backward for d in open_ if d.sign > 0 for m in self.elems[(op_name, d.kind)]
            )
            replicated = all(c is None for c in strategy) and forward
            if multi or mixed or replicated:
                why = (
                    f"cut {tuple(strategy)} along several loop dims"
                    if multi
                    else "other collective kinds than predicted at this operator"
                    if mixed
                    else "XLA partitioned an operator the plan replicates"
                )
                for d in open_:
                    d.take(d.remaining, "xla-partitioning", why)
