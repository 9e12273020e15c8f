"""Verify a plan on JAX/XLA: same numerics as the unsharded program, and the collectives XLA
actually inserts compared with the ones the cost model predicts.

`verify_plan(plan)` runs the graph twice on the same deterministic parameters and inputs:
unsharded (jit on one device) and sharded (jit on `jax_mesh(plan.mesh)`, parameters and inputs
placed by the plan's layouts through `in_shardings`, every operator output constrained to the
layout its producer leaves it in, and in training every parameter gradient constrained to its
parameter's layout). It compares the outputs (training: also the loss and every gradient), then
parses the collectives of the compiled sharded program and converts each to the cost model's
convention, "bytes one device sends with ring algorithms":

    all-reduce          2 (g-1)/g * B      B = the reduced buffer
    all-gather            (g-1)/g * B      B = the gathered result
    reduce-scatter        (g-1)   * B      B = the scattered result (one device's piece)
    all-to-all            (g-1)/g * B      B = one device's buffer
    collective-permute             B       B = the buffer a sending device sends

where g is the replica-group size. Measured bytes are compared with the prediction per
collective kind (`CostBreakdown.comm`) and per operator (a collective belongs to the shardplan
operator named in its HLO `op_name` metadata: every operator runs in `jax.named_scope(op.name)`).
Every per-operator difference above 10% gets a cause from `CAUSES` (the model limitations
documented in docs/verification.md), found by rules that read the HLO and the plan; a difference
no rule explains is reported with cause "unexplained".

Numerics are checked in float64 by default (`dtype="float32"` on request; see
`shardplan.fidelity.run`). The cost model prices the plan's own dtype (the zoo's float32:
4 bytes an element), and XLA does not partition every float64 program like its float32 twin
(a max-pool's gradient is gathered whole in float64, computed in place in float32), so the
collectives are always measured on the program compiled in the plan's dtype (`comm_dtype`:
float32 unless the plan prices floats at 8 bytes), with float buffers counted at the plan's
width (`plan_element_bytes`). A float64 numerics check therefore compiles the sharded program
twice: once in float64 to run it, once in float32 to read its collectives.

Numerics: a tensor passes when max|sharded - unsharded| <= rtol * max|unsharded| + atol
(defaults `TOLERANCES[dtype]`: float64 rtol 1e-9, atol 1e-12; float32 rtol 1e-4, atol 1e-6);
`max_error` is the largest max|sharded - unsharded| / max(max|unsharded|, atol / rtol) over the
checked tensors.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from shardplan.cost.collectives import CollectiveKind as Kind
from shardplan.errors import BackendError
from shardplan.fidelity.causes import (
    CAUSES,
    MIN_BYTES,
    TOLERANCE,
    UNEXPLAINED,
    Difference,
)
from shardplan.fidelity.explain import _Explainer
from shardplan.fidelity.measure import (
    MeasuredCollective,
    comm_dtype,
    computed_sizes,
    measure,
    plan_element_bytes,
    sent_bytes,
)
from shardplan.fidelity.predict import (
    OpPrediction,
    byte_options,
    kind_bytes,
    predict_by_op,
)
from shardplan.fidelity.run import (
    DTYPES,
    TOLERANCES,
    TensorError,
    cast_floats,
    check_dtype,
    compile_sharded,
    flatten_results,
    reference,
    relu_sign_flips,
    tensor_error,
    x64,
)
from shardplan.plans import Plan, spmd_plan

DEFAULT_DTYPE = DTYPES[0]
DEFAULT_RTOL, DEFAULT_ATOL = TOLERANCES[DEFAULT_DTYPE]


# -- comparison ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class KindComparison:
    """Predicted vs measured bytes per device of one collective kind.

    `causes` lists the causes of the per-operator differences of this kind; `unexplained_bytes`
    sums what no rule accounted for.
    """

    kind: str
    predicted: float
    measured: float
    count: int
    causes: tuple[str, ...] = ()
    unexplained_bytes: float = 0.0

    @property
    def ratio(self) -> float:
        """measured / predicted (1.0 when both are 0, inf when only measured is)."""
        if self.predicted == 0:
            return 1.0 if self.measured == 0 else float("inf")
        return self.measured / self.predicted

    @property
    def within(self) -> bool:
        """Within +-10% (or both below MIN_BYTES)."""
        return abs(self.measured - self.predicted) <= max(
            TOLERANCE * max(self.predicted, self.measured), MIN_BYTES
        )

    @property
    def explained(self) -> bool:
        """Within tolerance, or every significant part of the difference has a known cause."""
        if self.within:
            return True
        return bool(self.causes) and self.unexplained_bytes <= max(
            TOLERANCE * max(self.predicted, self.measured), MIN_BYTES
        )


@dataclass(frozen=True, slots=True)
class Comparison:
    """Measured collectives of a compiled plan compared with the prediction."""

    kinds: tuple[KindComparison, ...]
    differences: tuple[Difference, ...]
    collectives: tuple[MeasuredCollective, ...]
    predicted_total: float
    measured_total: float

    def kind(self, kind: str) -> KindComparison:
        for k in self.kinds:
            if k.kind == kind:
                return k
        raise KeyError(kind)


def compare(plan: Plan, hlo_text: str, train: bool, dtype: str = "float32") -> Comparison:
    """Compare the collectives of compiled HLO with `plan`'s predicted bytes (see module doc).

    `dtype` is the dtype the HLO computes in; its float buffers are counted at the plan's width.
    """
    measured = measure(hlo_text, plan.graph, plan_element_bytes(plan.graph, check_dtype(dtype)))
    pred = predict_by_op(plan, byte_options(plan, train))
    p_bytes: dict[tuple[str, str], float] = defaultdict(float)
    m_bytes: dict[tuple[str, str], float] = defaultdict(float)
    for name, op_pred in pred.items():
        total = op_pred.total
        for kind in Kind:
            b = kind_bytes(total, kind)
            if b:
                p_bytes[(name, kind)] += b
    for m in measured:
        m_bytes[(m.op, m.kind)] += m.sent_bytes
    order = {name: i for i, name in enumerate(plan.graph.op_index)}
    rank = {kind: i for i, kind in enumerate(Kind)}
    keys = sorted(
        set(p_bytes) | set(m_bytes), key=lambda k: (order.get(k[0], len(order)), rank[k[1]])
    )
    deltas = _Explainer(plan, pred, measured, computed_sizes(hlo_text, plan.graph)).run(
        keys, p_bytes, m_bytes
    )
    differences = tuple(
        Difference(
            d.op,
            d.kind,
            d.predicted,
            d.measured,
            tuple(d.causes) + ((UNEXPLAINED,) if not d.done() else ()),
            "; ".join(d.details),
            d.remaining if not d.done() else 0.0,
        )
        for d in deltas
    )
    kinds = []
    for kind in Kind:
        p = sum(v for (_, k), v in p_bytes.items() if k == kind)
        m = sum(v for (_, k), v in m_bytes.items() if k == kind)
        count = sum(1 for c in measured if c.kind == kind)
        mine = [d for d in differences if d.kind == kind]
        causes = tuple(dict.fromkeys(c for d in mine for c in d.causes if c != UNEXPLAINED))
        unexplained = sum(d.unexplained_bytes for d in mine)
        covered = sum(d.measured - d.predicted for d in mine)
        residual = abs((m - p) - covered)  # differences too small to list, added up
        if residual > max(TOLERANCE * max(p, m), MIN_BYTES):
            unexplained += residual
        kinds.append(KindComparison(kind, p, m, count, causes, unexplained))
    return Comparison(
        tuple(kinds),
        differences,
        tuple(measured),
        sum(k.predicted for k in kinds),
        sum(k.measured for k in kinds),
    )


# -- the report ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What `verify_plan` found. `ok` is the numerics verdict; `explained` says whether every
    communication difference beyond +-10% has a documented cause."""

    model: str
    mesh: str
    method: str
    train: bool
    numerics_ok: bool
    max_error: float
    worst_tensor: str
    rtol: float
    atol: float
    tensors: tuple[TensorError, ...]
    kinds: tuple[KindComparison, ...]
    differences: tuple[Difference, ...]
    collectives: tuple[MeasuredCollective, ...]
    predicted_total: float
    measured_total: float
    compile_seconds: float = 0.0
    """Seconds to compile the program whose collectives were measured (the plan's dtype)."""
    relu_sign_flips: int | None = None
    """When gradients fail but outputs and loss pass: ReLU inputs within rounding noise of 0 whose
    sign differs between the two programs (see `relu_sign_flips`); None when not examined."""
    dtype: str = DEFAULT_DTYPE
    """The dtype both programs computed in (collective bytes are at the plan's own width)."""

    @property
    def ok(self) -> bool:
        return self.numerics_ok

    @property
    def numerics_note(self) -> str:
        """Why numerics failed, when a known cause was found ("" otherwise)."""
        if self.numerics_ok or not self.relu_sign_flips:
            return ""
        return (
            f"{self.relu_sign_flips} ReLU input(s) within {self.dtype} noise of 0 flip sign "
            "between the sharded and the unsharded forward pass (outputs and loss agree): the "
            "gradients below them differ by a finite amount although both programs are correct"
        )

    @property
    def forward_ok(self) -> bool:
        """Outputs and loss within tolerance (gradients may still differ)."""
        return all(t.ok for t in self.tensors if not t.name.startswith("grad "))

    @property
    def explained(self) -> bool:
        return all(k.explained for k in self.kinds)

    @property
    def tolerance(self) -> str:
        return (
            f"max|sharded - unsharded| <= {self.rtol:g} * max|unsharded| + {self.atol:g} "
            f"per tensor ({self.dtype})"
        )

    def kind(self, kind: str) -> KindComparison:
        for k in self.kinds:
            if k.kind == kind:
                return k
        raise KeyError(kind)

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "mesh": self.mesh,
            "method": self.method,
            "train": self.train,
            "numerics": {
                "ok": self.numerics_ok,
                "dtype": self.dtype,
                "max_error": self.max_error,
                "worst_tensor": self.worst_tensor,
                "tolerance": self.tolerance,
                "tensors_checked": len(self.tensors),
                "failures": [t.name for t in self.tensors if not t.ok],
                "relu_sign_flips": self.relu_sign_flips,
                "note": self.numerics_note,
            },
            "communication": {
                "convention": "bytes one device sends (ring algorithms)",
                "predicted_total": self.predicted_total,
                "measured_total": self.measured_total,
                "explained": self.explained,
                "kinds": [
                    {
                        "kind": k.kind,
                        "predicted": k.predicted,
                        "measured": k.measured,
                        "ratio": _json_ratio(k.ratio),
                        "count": k.count,
                        "within_10pct": k.within,
                        "causes": list(k.causes),
                        "unexplained_bytes": k.unexplained_bytes,
                    }
                    for k in self.kinds
                ],
                "differences": [
                    {
                        "op": d.op,
                        "kind": d.kind,
                        "predicted": d.predicted,
                        "measured": d.measured,
                        "causes": list(d.causes),
                        "detail": d.detail,
                        "unexplained_bytes": d.unexplained_bytes,
                    }
                    for d in self.differences
                ],
            },
            "causes": {c: CAUSES[c] for c in self.causes_seen()},
            "compile_seconds": self.compile_seconds,
        }

    def causes_seen(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c for d in self.differences for c in d.causes if c in CAUSES))

    def text(self) -> str:
        """A plain-text summary (the CLI prints a rich table instead)."""
        mode = "training step" if self.train else "forward"
        lines = [
            f"{self.model} on mesh {self.mesh}, {self.method} plan, {mode}",
            f"numerics: {'OK' if self.numerics_ok else 'FAIL'} - max error {self.max_error:.3g} "
            f"({self.worst_tensor}); {len(self.tensors)} tensors, {self.tolerance}"
            + (f"; {self.numerics_note}" if self.numerics_note else ""),
            "communication (bytes sent per device): kind, predicted, measured, ratio",
        ]
        for k in self.kinds:
            if k.predicted or k.measured:
                flag = "" if k.within else "  <- " + (", ".join(k.causes) or "unexplained")
                lines.append(
                    f"  {k.kind:18s} {k.predicted:12.0f} {k.measured:12.0f} "
                    f"{_ratio_text(k.ratio):>7s}{flag}"
                )
        return "\n".join(lines)


def _json_ratio(r: float) -> float | None:
    return None if r == float("inf") else r


def _ratio_text(r: float) -> str:
    return "inf" if r == float("inf") else f"{r:.3f}"


def verify_plan(
    plan: Plan,
    train: bool = True,
    seed: int = 0,
    rtol: float | None = None,
    atol: float | None = None,
    check_numerics: bool = True,
    dtype: str = DEFAULT_DTYPE,
) -> VerifyReport:
    """Run `plan` sharded on JAX and unsharded on the same values; compare numerics and bytes.

    Args:
        plan: any Plan (D-Rec, an expert plan, one loaded with Plan.from_json).
        train: verify a training step (loss and every gradient) rather than the forward pass.
        seed: seed of `init_params` / `make_inputs`.
        rtol, atol: tolerance per tensor: max|sharded - unsharded| <= rtol*max|unsharded| + atol;
            None: `TOLERANCES[dtype]`.
        check_numerics: False only compiles and compares communication (no execution).
        dtype: "float64" (default) or "float32": what both programs compute in for the numerics
            check. Collectives are read from the program compiled in the plan's own dtype
            either way (see the module docstring).

    Raises:
        MissingDependencyError: jax is not installed.
        BackendError: the mesh needs more devices than JAX has, an unknown dtype, or JAX failed.
        UnsupportedOpError: an operator kind has no JAX kernel.
    """
    import time

    from shardplan.engines import jax as jb

    plan = spmd_plan(plan)  # a ZeRO stage is checked as the SPMD program the engine runs
    jb.jax_mesh(plan.mesh)  # BackendError early when there are too few devices
    default_rtol, default_atol = TOLERANCES[check_dtype(dtype)]
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    graph = plan.graph
    measured_dtype = comm_dtype(graph)
    hlo, compile_seconds = "", 0.0
    errors: list[TensorError] = []
    flips = None
    if check_numerics:
        params = cast_floats(jb.init_params(graph, seed), dtype)
        inputs = cast_floats(jb.make_inputs(graph, seed), dtype)
        with x64(dtype):
            start = time.perf_counter()
            compiled, p, x, text = compile_sharded(plan, train, params, inputs, dtype)
            if dtype == measured_dtype:
                hlo, compile_seconds = text, time.perf_counter() - start
            try:
                got = flatten_results(compiled(p, x), train)
                want = flatten_results(reference(plan, train, params, inputs), train)
            except (ValueError, TypeError, RuntimeError) as e:
                raise BackendError(
                    f"JAX failed to run the {plan.method} plan of {graph.name!r} on "
                    f"mesh {plan.mesh.text()}: {e}"
                ) from e
            errors = [
                tensor_error(name, got.get(name), value, rtol, atol) for name, value in want.items()
            ]
            forward_ok = all(t.ok for t in errors if not t.name.startswith("grad "))
            if train and forward_ok and not all(t.ok for t in errors):
                flips = relu_sign_flips(plan, params, inputs)
    if not hlo:  # the program the prediction is compared with, compiled from shapes alone
        with x64(measured_dtype):
            start = time.perf_counter()
            hlo = compile_sharded(plan, train, dtype=measured_dtype)[3]
            compile_seconds = time.perf_counter() - start
    worst = max(errors, key=lambda t: t.relative_error, default=None)
    cmp = compare(plan, hlo, train, measured_dtype)
    return VerifyReport(
        model=graph.name,
        mesh=plan.mesh.text(),
        method=plan.method,
        train=train,
        numerics_ok=all(t.ok for t in errors),
        max_error=worst.relative_error if worst else 0.0,
        worst_tensor=worst.name if worst else "",
        rtol=rtol,
        atol=atol,
        tensors=tuple(errors),
        kinds=cmp.kinds,
        differences=cmp.differences,
        collectives=cmp.collectives,
        predicted_total=cmp.predicted_total,
        measured_total=cmp.measured_total,
        compile_seconds=compile_seconds,
        relu_sign_flips=flips,
        dtype=dtype,
    )


__all__ = [
    "CAUSES",
    "DEFAULT_ATOL",
    "DEFAULT_DTYPE",
    "DEFAULT_RTOL",
    "DTYPES",
    "TOLERANCES",
    "Comparison",
    "Difference",
    "KindComparison",
    "MeasuredCollective",
    "OpPrediction",
    "TensorError",
    "VerifyReport",
    "compare",
    "comm_dtype",
    "measure",
    "plan_element_bytes",
    "predict_by_op",
    "sent_bytes",
    "tensor_error",
    "verify_plan",
]
