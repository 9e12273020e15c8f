"""The backward pass of one op priced by its own work, not as a multiple of its forward.

An op's backward runs one kernel per gradient it produces (PyTorch's
tools/autograd/derivatives.yaml gives one formula per differentiable input; a norm's native
backward computes the weight and bias gradients together): one for each non-parameter input that
needs a gradient, and one for all its parameters. Each kernel reads the result's gradient; the
backward as a whole reads what autograd kept for it once (`ir.traits.SAVED_FOR_BACKWARD`: the
inputs, the results, or a one-byte mask per result element; a parameter only when an input
gradient is computed, as dX = dY W reads W while an embedding's table gradient does not read the
table) and writes each gradient once:

  bytes = kernels x |grad of results| + |saved| + |gradients written|

A kind with `Trait.PASSES_GRADIENT` (add, bias_add, views) hands the result's gradient to each
input of the result's size unchanged: no kernel, nothing written; a smaller (broadcast) input
that needs a gradient gets a reduction kernel. An op no input of which needs a gradient has no
backward (0 bytes). Its FLOPs are the preset's (training_flops_factor - 1) x the forward's (a
matmul's two GEMMs, dX = dY W and dW = X^T dY, each as many as the forward), so a GEMM's backward
is compute-bound at twice its forward while an element-wise op's is priced by the bytes it moves
(`cost.terms.compute_cost` takes the maximum). O(operands).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from shardplan.ir.traits import Saved, Trait, has_trait, saved_for_backward


@dataclass(frozen=True, slots=True)
class Piece:
    """One operand of an op as its device holds it: local bytes, global element count (to tell a
    broadcast operand from one of the result's size), element width, and what autograd needs."""

    nbytes: float
    numel: float
    width: float
    parameter: bool = False
    grad: bool = False


def backward_bytes(kind: str, inputs: Sequence[Piece], outputs: Sequence[Piece]) -> float:
    """Bytes one device's backward of an op of `kind` reads and writes (module docstring)."""
    if not any(p.grad for p in inputs):
        return 0.0
    passes = has_trait(kind, Trait.PASSES_GRADIENT)
    size = max((p.numel for p in outputs), default=0.0)
    grads = [p for p in inputs if p.grad and not p.parameter and not (passes and p.numel >= size)]
    params = [p for p in inputs if p.grad and p.parameter]
    kernels = len(grads) + (1 if params else 0)
    if kernels == 0:
        return 0.0
    rule = saved_for_backward(kind)
    if rule is Saved.INPUTS:  # parameters are read by the input gradients' formulas (dY W)
        saved = sum(p.nbytes for p in inputs if grads or not p.parameter)
    elif rule is Saved.OUTPUTS:
        saved = sum(p.nbytes for p in outputs)
    elif rule is Saved.MASK:
        saved = sum(p.nbytes / p.width for p in outputs)
    else:
        saved = 0.0
    written = sum(p.nbytes for p in (*grads, *params))
    return kernels * sum(p.nbytes for p in outputs) + saved + written


__all__ = ["Piece", "backward_bytes"]
