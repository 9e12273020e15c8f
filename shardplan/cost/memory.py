"""Memory per device of a plan: parameter state (ZeRO-divided) plus activations.

Training: each parameter's weight, gradient, master copy and optimizer state over the cuts of its
home layout (and its ZeRO group, `cost.zero`), plus every op result and the local graph inputs
kept for the backward; inference: weights plus the largest working set of one op. O(operands).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from shardplan.cost.presets import CostOptions
from shardplan.cost.terms import local_bytes, param_bytes, round_numels
from shardplan.cost.zero import ZeroParam, zero_bytes
from shardplan.ir.graph import Graph
from shardplan.ir.op import Op, Role
from shardplan.mesh import Round
from shardplan.sharding import Layout, Strategy, operand_layout


def memory_per_device(
    graph: Graph,
    rounds: Sequence[Round],
    homes: Mapping[str, Layout],
    out_layout: Mapping[str, Layout],
    strategies: Mapping[str, Strategy],
    opts: CostOptions,
    size: Callable[[str, Layout], float] | None = None,
    zero: Mapping[str, ZeroParam] | None = None,
    layouts: Sequence[Sequence[Layout]] | None = None,
) -> tuple[float, float]:
    """(parameter state bytes, activation bytes) per device (`size(tensor, layout)`: its local
    bytes, `local_bytes` unless a `ScoreCache` memoises them; `layouts`: per op, its inputs'
    layouts when known).

    Training: weights + gradients (dtype each) + optimizer state (fp32) per parameter element held
    by the device, plus every activation kept for the backward pass and the local inputs.
    Inference: weights, plus the largest working set of one op (its inputs and outputs).
    """
    param_mem = 0.0
    state: dict[tuple[object, ...], float] = {}  # repeated layers: one price per shape
    for name, layout in homes.items():
        t = graph.tensors[name]
        width = opts.element_bytes(t)
        key = (t.numel, width, layout, zero[name].ways if zero else None)
        held = state.get(key)
        if held is None:
            elems = round_numels(t.numel, layout, rounds)[-1]
            held = param_bytes(elems, width, opts)
            if zero:  # `zero` holds every read parameter: ZeRO divides its state (cost/zero.py)
                w = elems * width
                grad = w if opts.train else 0.0
                held = zero_bytes(w, grad, held - w - grad, zero[name].ways, opts.zero)
            state[key] = held
        param_mem += held
    if size is None:

        def size(name: str, layout: Layout) -> float:
            return local_bytes(graph, name, layout, rounds, opts)

    def read(index: int, op: Op, i: int) -> Layout:
        if layouts is not None:
            return layouts[index][i]
        return operand_layout(op, strategies[op.name], i)

    if opts.train:
        act = sum(size(n, lay) for n, lay in out_layout.items())
        for index, op in enumerate(graph.ops):
            for i, name in enumerate(op.inputs):
                t = graph.tensors[name]
                if t.role is Role.INPUT and graph.consumers[name][0][0] == index:
                    act += size(name, read(index, op, i))
        return param_mem, act
    peak = 0.0
    for index, op in enumerate(graph.ops):
        work = sum(size(n, out_layout[n]) for n in op.outputs)
        for i, name in enumerate(op.inputs):
            if graph.tensors[name].role is not Role.PARAMETER:
                work += size(name, read(index, op, i))
        peak = max(peak, work)
    return param_mem, peak
