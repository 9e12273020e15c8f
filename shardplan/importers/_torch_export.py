"""The torch.export side of the torch importer: exporting a module, and deciding whether its
exported program can be translated as it is or needs the core-ATen decomposition first.

- `_export`: `torch.export.export` with the example inputs; what it cannot trace (data-dependent
  shapes, control flow on values) becomes an UnsupportedOpError naming the fix.
- `_needs_decomposition`: whether some op without a table row survives constant folding (one
  pass over the nodes, O(nodes)); `_live`: the nodes the outputs depend on (O(nodes));
  `_decompositions`: core ATen, keeping `aten.linear` and (when every call is one the table
  translates) `aten.matmul` whole.
- `_CREATION` / `_SKIP`: ops folded as constants / ops without a tensor result (checks).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

from shardplan.errors import IRError, ShardplanError, UnsupportedOpError

# Ops whose result depends only on shapes or constants, never on the values of their inputs.
_CREATION = frozenset(
    {
        "aten.full_like.default",
        "aten.zeros_like.default",
        "aten.ones_like.default",
        "aten.empty_like.default",
        "aten.rand_like.default",
        "aten.randn_like.default",
        "aten.new_zeros.default",
        "aten.new_ones.default",
        "aten.new_full.default",
        "aten.new_empty.default",
        "aten.new_empty_strided.default",
    }
)
# Ops with no tensor result: checks and annotations.
_SKIP = frozenset(
    {
        "aten._assert_tensor_metadata.default",
        "aten._assert_scalar.default",
        "aten._assert_async.default",
        "aten._assert_async.msg",
        "aten.sym_constrain_range.default",
        "aten.sym_constrain_range_for_size.default",
        "aten._functional_assert_async.msg",
        "aten._linalg_check_errors.default",
    }
)


def _export(
    torch: Any, module: Any, example_args: Sequence[Any], example_kwargs: dict[str, Any] | None
) -> tuple[Any, str]:
    """(the ExportedProgram of `module`, the graph's default name); a program passes through."""
    if isinstance(module, torch.export.ExportedProgram):
        return module, "exported_program"
    try:
        program = torch.export.export(module, tuple(example_args), example_kwargs or {})
    except ShardplanError:
        raise
    except Exception as e:  # torch raises many types here (UserError, DynamicOutputShape...)
        lines = str(e).strip().splitlines()
        _fails_eagerly(torch, module, example_args, example_kwargs)
        raise UnsupportedOpError(
            f"torch.export could not trace {type(module).__name__}: {type(e).__name__}: "
            f"{lines[0] if lines else ''}. The torch importer reads what torch.export traces "
            "with the example inputs' static shapes: an op whose result shape depends on "
            "values (nonzero, unique, linalg.lstsq, masked_select) or Python control flow on "
            "tensor values cannot be traced, e.g. the per-expert loop of MoE experts in "
            'transformers (experts_implementation="eager"; build the model with "grouped_mm", '
            'the default, or "batched_mm"); rewrite that part of forward, or export the '
            "module yourself and pass the ExportedProgram"
        ) from e
    return program, type(module).__name__


def _fails_eagerly(
    torch: Any, module: Any, example_args: Sequence[Any], example_kwargs: dict[str, Any] | None
) -> None:
    """IRError when the module's own forward fails on the example inputs (e.g. a config whose
    BatchNorm size disagrees with its conv): no tracing is to blame. Buffers (running
    statistics) are restored afterwards; runs only once export has failed."""
    saved = [(b, b.detach().clone()) for b in module.buffers()]
    try:
        with torch.no_grad():
            module(*example_args, **(example_kwargs or {}))
    except Exception as e:
        first = (str(e).strip().splitlines() or [""])[0]
        raise IRError(
            f"{type(module).__name__} fails on its example inputs without shardplan (its own "
            f"forward raised {type(e).__name__}: {first}); fix the model, its config or the "
            "inputs first"
        ) from e
    finally:
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)


def _live(program: Any) -> set[Any]:
    """The nodes the program's outputs depend on. O(nodes)."""
    outputs = [n for n in program.graph.nodes if n.op == "output"]
    live: set[Any] = set()
    stack = list(outputs)
    while stack:
        node = stack.pop()
        if node not in live:
            live.add(node)
            stack.extend(node.all_input_nodes)
    return live


def _needs_decomposition(program: Any, table: Any) -> bool:
    """Whether an op of `program` has no rule and is not folded as a constant (conservatively:
    placeholders count as non-constant). O(nodes)."""
    static: set[Any] = set()
    for node in program.graph.nodes:
        if node.op != "call_function":
            continue
        key = str(node.target)
        parents = node.all_input_nodes
        if node.target is operator.getitem:
            if parents and parents[0] in static:
                static.add(node)
            continue
        if key in _CREATION or all(p in static for p in parents):
            static.add(node)
        elif key not in table and key not in _SKIP:
            return True
    return False


def _decompositions(torch: Any, program: Any) -> Any:
    """Core ATen, but keep `aten.matmul` whole when every call of it is one the table translates
    exactly (its decomposition merges heads into the batch, hiding head parallelism)."""
    from shardplan.importers._aten import simple_matmul

    table = torch.export.default_decompositions()
    table.pop(torch.ops.aten.linear.default, None)
    matmul = torch.ops.aten.matmul.default
    for node in program.graph.nodes:
        if node.op == "call_function" and node.target == matmul:
            shapes = [getattr(arg, "meta", {}).get("val") for arg in node.args[:2]]
            if any(s is None for s in shapes) or not simple_matmul(
                shapes[0].shape, shapes[1].shape
            ):
                return table
    table.pop(matmul, None)
    return table
