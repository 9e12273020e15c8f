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

Numerics: a tensor passes when max|sharded - unsharded| <= rtol * max|unsharded| + atol
(defaults rtol 1e-4, atol 1e-6 for float32); `max_error` is the largest
max|sharded - unsharded| / max(max|unsharded|, atol / rtol) over the checked tensors.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardplan.backends.verify_causes import (
    CAUSES,
    MIN_BYTES,
    NORM_KINDS,
    TOLERANCE,
    UNEXPLAINED,
    Difference,
)
from shardplan.backends.verify_explain import _Explainer
from shardplan.backends.verify_hlo import (
    KINDS,
    MeasuredCollective,
    computed_sizes,
    measure,
    sent_bytes,
)
from shardplan.backends.verify_predict import (
    PREDICTED_FIELD,
    EdgePrediction,
    OpPrediction,
    byte_options,
    gradient_gather_shortfall,
    kind_bytes,
    predict_by_op,
)
from shardplan.errors import BackendError
from shardplan.plan import Plan

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-6

# Names moved to verify_causes / verify_hlo / verify_predict stay importable from here.
_REEXPORTED = (NORM_KINDS, PREDICTED_FIELD, EdgePrediction, gradient_gather_shortfall)


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


def compare(plan: Plan, hlo_text: str, train: bool) -> Comparison:
    """Compare the collectives of compiled HLO with `plan`'s predicted bytes (see module doc)."""
    measured = measure(hlo_text, plan.graph)
    pred = predict_by_op(plan, byte_options(plan, train))
    p_bytes: dict[tuple[str, str], float] = defaultdict(float)
    m_bytes: dict[tuple[str, str], float] = defaultdict(float)
    for name, op_pred in pred.items():
        total = op_pred.total
        for kind in KINDS:
            b = kind_bytes(total, kind)
            if b:
                p_bytes[(name, kind)] += b
    for m in measured:
        m_bytes[(m.op, m.kind)] += m.sent_bytes
    order = {name: i for i, name in enumerate(plan.graph.op_index)}
    keys = sorted(
        set(p_bytes) | set(m_bytes), key=lambda k: (order.get(k[0], len(order)), KINDS.index(k[1]))
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
    for kind in KINDS:
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


# -- running -------------------------------------------------------------------------------------


def plan_layouts(plan: Plan) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(parameter homes, input/constant layouts, activation layouts) of `plan`."""
    layouts = plan.tensor_layouts()
    params = {t.name for t in plan.graph.parameters}
    return (
        {k: v for k, v in layouts.items() if k in params},
        plan.input_layouts(),
        {k: v for k, v in layouts.items() if k not in params},
    )


def compile_sharded(
    plan: Plan,
    train: bool,
    params: Mapping[str, Any] | None = None,
    inputs: Mapping[str, Any] | None = None,
) -> tuple[Any, Any, Any, str]:
    """(compiled executable, params, inputs, HLO text) of the plan's sharded program: parameters
    and inputs placed by the plan's layouts, every operator output constrained (training: every
    parameter gradient too). Without params/inputs it compiles from shapes alone."""
    from shardplan.backends import jax as jb

    p_lay, i_lay, a_lay = plan_layouts(plan)
    fn, p, x = jb._jitted(plan.graph, plan.mesh, p_lay, i_lay, a_lay, params, inputs, train)
    try:
        compiled = fn.lower(p, x).compile()
    except (ValueError, TypeError, RuntimeError) as e:
        raise BackendError(
            f"JAX failed to compile the {plan.method} plan of "
            f"{plan.graph.name!r} on mesh {plan.mesh.text()}: {e}"
        ) from e
    return compiled, p, x, str(compiled.as_text())


# -- numerics ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class TensorError:
    """Largest deviation of one checked tensor (output, loss or gradient)."""

    name: str
    max_abs_error: float
    max_abs_reference: float
    relative_error: float
    ok: bool


def tensor_error(name: str, got: Any, want: Any, rtol: float, atol: float) -> TensorError:
    """max|got - want| against rtol * max|want| + atol (see the module docstring)."""
    g = np.asarray(got, np.float64)
    w = np.asarray(want, np.float64)
    if g.shape != w.shape:
        return TensorError(
            name, float("inf"), float(np.abs(w).max(initial=0.0)), float("inf"), False
        )
    err = float(np.abs(g - w).max(initial=0.0)) if g.size else 0.0
    scale = float(np.abs(w).max(initial=0.0)) if w.size else 0.0
    finite = bool(np.all(np.isfinite(g))) and bool(np.all(np.isfinite(w)))
    rel = err / max(scale, atol / rtol if rtol > 0 else atol, 1e-30)
    return TensorError(name, err, scale, rel, finite and err <= rtol * scale + atol)


def _reference(plan: Plan, train: bool, params: Any, inputs: Any) -> Any:
    jax = _jax()
    from shardplan.backends import jax as jb

    graph = plan.graph
    forward = jb.forward_fn(graph)
    if not train:
        return jax.jit(forward)(params, inputs)

    def step(p: Any, x: Any) -> Any:
        def objective(q: Any) -> Any:
            outs = forward(q, x)
            return jb.loss_from_outputs(graph, outs), outs

        (loss, outs), grads = jax.value_and_grad(objective, has_aux=True)(p)
        return outs, loss, grads

    return jax.jit(step)(params, inputs)


def _jax() -> Any:
    from shardplan.backends import jax as jb

    return jb._require_jax()


def _flatten_results(result: Any, train: bool) -> dict[str, Any]:
    if not train:
        return {f"output {k}": v for k, v in result.items()}
    outs, loss, grads = result
    flat = {f"output {k}": v for k, v in outs.items()}
    flat["loss"] = loss
    flat.update({f"grad {k}": v for k, v in grads.items()})
    return flat


KINK_KINDS = ("relu",)
"""Operators whose derivative jumps at 0: a float32-noise sign flip of one input element
changes the gradient by a finite amount."""


def relu_sign_flips(plan: Plan, params: Mapping[str, Any], inputs: Mapping[str, Any]) -> int:
    """Elements feeding a ReLU whose sign differs between the sharded and the unsharded forward
    pass while they lie within float32 noise of zero (|x| <= 1e-4 max|x| of that tensor).

    One such flip changes the ReLU's derivative from 0 to 1 for that element; after a batch norm
    over few elements this moves the gradients of the layers below by O(1/elements per channel),
    far beyond any floating-point tolerance although both programs are correct.
    """
    jax = _jax()
    from shardplan.backends import jax as jb

    graph = plan.graph
    probes = sorted({op.inputs[0] for op in graph.ops if op.kind in KINK_KINDS})
    if not probes:
        return 0
    table = jb.kernels()
    p_lay, i_lay, a_lay = plan_layouts(plan)
    shardings = jb.shardings_for(graph, plan.mesh, a_lay)

    def values(constrain: bool) -> Any:
        def run(p: Any, x: Any) -> Any:
            env = {**x, **p}
            for op in graph.ops:
                result = table[op.kind](op, *[env[t] for t in op.inputs])
                results = result if isinstance(result, tuple) else (result,)
                for name, value in zip(op.outputs, results, strict=True):
                    if constrain and name in shardings:
                        value = jax.lax.with_sharding_constraint(value, shardings[name])
                    env[name] = value
            return {t: env[t] for t in probes}

        return run

    mesh = plan.mesh
    jmesh = jb.jax_mesh(mesh)
    from jax.sharding import NamedSharding, PartitionSpec

    def sharding(name: str, layout: Any) -> Any:
        if layout is None:
            return NamedSharding(jmesh, PartitionSpec())
        return NamedSharding(jmesh, jb.partition_spec(layout, len(graph.tensors[name].shape), mesh))

    p_sh = {n: sharding(n, p_lay.get(n)) for n in params}
    x_sh = {n: sharding(n, i_lay.get(n)) for n in inputs}
    want = jax.jit(values(False))(params, inputs)
    got = jax.jit(values(True), in_shardings=(p_sh, x_sh))(params, inputs)
    flips = 0
    for name in probes:
        a, b = np.asarray(want[name], np.float64), np.asarray(got[name], np.float64)
        near = np.abs(a) <= 1e-4 * max(float(np.abs(a).max(initial=0.0)), 1e-30)
        flips += int(np.sum(near & ((a > 0) != (b > 0))))
    return flips


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
    relu_sign_flips: int | None = None
    """When gradients fail but outputs and loss pass: ReLU inputs within float32 noise of 0 whose
    sign differs between the two programs (see `relu_sign_flips`); None when not examined."""

    @property
    def ok(self) -> bool:
        return self.numerics_ok

    @property
    def numerics_note(self) -> str:
        """Why numerics failed, when a known cause was found ("" otherwise)."""
        if self.numerics_ok or not self.relu_sign_flips:
            return ""
        return (
            f"{self.relu_sign_flips} ReLU input(s) within float32 noise of 0 flip sign between "
            "the sharded and the unsharded forward pass (outputs and loss agree): the gradients "
            "below them differ by a finite amount although both programs are correct"
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
            "per tensor (float32)"
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
    rtol: float = DEFAULT_RTOL,
    atol: float = DEFAULT_ATOL,
    check_numerics: bool = True,
) -> VerifyReport:
    """Run `plan` sharded on JAX and unsharded on the same values; compare numerics and bytes.

    Args:
        plan: any Plan (D-Rec, an expert plan, one loaded with Plan.from_json).
        train: verify a training step (loss and every gradient) rather than the forward pass.
        seed: seed of `init_params` / `make_inputs`.
        rtol, atol: tolerance per tensor: max|sharded - unsharded| <= rtol*max|unsharded| + atol.
        check_numerics: False only compiles and compares communication (no execution).

    Raises:
        MissingDependencyError: jax is not installed.
        BackendError: the mesh needs more devices than JAX has, or JAX failed.
        UnsupportedOpError: an operator kind has no JAX kernel.
    """
    import time

    from shardplan.backends import jax as jb

    jb.jax_mesh(plan.mesh)  # BackendError early when there are too few devices
    graph = plan.graph
    params = jb.init_params(graph, seed) if check_numerics else None
    inputs = jb.make_inputs(graph, seed) if check_numerics else None
    start = time.perf_counter()
    compiled, p, x, hlo = compile_sharded(plan, train, params, inputs)
    compile_seconds = time.perf_counter() - start
    errors: list[TensorError] = []
    if check_numerics:
        try:
            got = _flatten_results(compiled(p, x), train)
            want = _flatten_results(_reference(plan, train, params, inputs), train)
        except (ValueError, TypeError, RuntimeError) as e:
            raise BackendError(
                f"JAX failed to run the {plan.method} plan of {graph.name!r} on "
                f"mesh {plan.mesh.text()}: {e}"
            ) from e
        errors = [
            tensor_error(name, got.get(name), value, rtol, atol) for name, value in want.items()
        ]
    worst = max(errors, key=lambda t: t.relative_error, default=None)
    flips = None
    forward_ok = all(t.ok for t in errors if not t.name.startswith("grad "))
    if check_numerics and train and forward_ok and not all(t.ok for t in errors):
        flips = relu_sign_flips(plan, params, inputs)
    cmp = compare(plan, hlo, train)
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
    )


__all__ = [
    "CAUSES",
    "DEFAULT_ATOL",
    "DEFAULT_RTOL",
    "KINDS",
    "Comparison",
    "Difference",
    "KindComparison",
    "MeasuredCollective",
    "OpPrediction",
    "TensorError",
    "VerifyReport",
    "compare",
    "measure",
    "predict_by_op",
    "sent_bytes",
    "verify_plan",
]
