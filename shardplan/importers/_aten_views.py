"""The ATen translation rules for views and copies (reshape, permute, expand, copies, dropout),
with the argument helpers every ATen rule shares; `_aten.aten_table()` puts them in the table.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from shardplan.errors import UnsupportedOpError
from shardplan.importers._build import Lazy

if TYPE_CHECKING:
    from torch.fx import Node

    from shardplan.importers.torch import _Context

Rule = Callable[["_Context", "Node"], Any]


def _is_node(arg: Any) -> bool:
    from torch.fx import Node

    return isinstance(arg, Node)


def _arg(node: Node, index: int, default: Any = None) -> Any:
    """Positional or keyword argument `index` of an ATen call, by its schema name."""
    if len(node.args) > index:
        return node.args[index]
    schema = getattr(node.target, "_schema", None)
    if schema is not None and index < len(schema.arguments):
        return node.kwargs.get(schema.arguments[index].name, default)
    return default


def _axis(axis: int, rank: int) -> int:
    return axis % rank if rank else 0


def _axes(dims: Any, rank: int) -> tuple[int, ...] | None:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return None
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted(_axis(d, rank) for d in dims))


def _pair(value: Any, default: tuple[int, int] | None = None) -> tuple[int, int]:
    if value is None or (isinstance(value, (list, tuple)) and len(value) == 0):
        if default is None:
            raise UnsupportedOpError("a window parameter is missing")
        return default
    if isinstance(value, int):
        return value, value
    if len(value) == 1:
        return int(value[0]), int(value[0])
    return int(value[0]), int(value[1])


def _simple(value: Any) -> bool:
    return isinstance(value, (bool, int, float, str)) or value is None


def _extra(node: Node, skip: int = 1) -> dict[str, Any]:
    """Non-tensor arguments after the first `skip`, kept as attributes for executors."""
    args = tuple(a for a in node.args[skip:] if _simple(a))
    attrs: dict[str, Any] = {k: v for k, v in node.kwargs.items() if _simple(v) and k != "out"}
    if args:
        attrs["args"] = args
    return attrs


# -- rules: views and copies ----------------------------------------------------------------------
def _alias(ctx: _Context, node: Node) -> Any:
    """clone/alias/detach/contiguous: the result is the input's value."""
    return ctx.value(node.args[0])


def _reshape(ctx: _Context, node: Node) -> Any:
    x, out = node.args[0], ctx.shape(node)
    if ctx.shape(x) == out:
        return ctx.value(x)
    return ctx.emit("reshape", [x], node, shape=out)


def _transpose_to(ctx: _Context, node: Node, x: Node, perm: tuple[int, ...]) -> Any:
    if perm == tuple(range(len(perm))):
        return ctx.value(x)
    if perm == (1, 0):  # pending: mm/addmm read it as a linear weight, others materialize it
        return Lazy(lambda: ctx.emit("transpose", [x], node, perm=perm), ctx.tensor(x))
    return ctx.emit("transpose", [x], node, perm=perm)


def _permute(ctx: _Context, node: Node) -> Any:
    rank = len(ctx.shape(node.args[0]))
    return _transpose_to(ctx, node, node.args[0], tuple(_axis(p, rank) for p in node.args[1]))


def _transpose(ctx: _Context, node: Node) -> Any:
    x, d0, d1 = node.args[:3]
    rank = len(ctx.shape(x))
    perm = list(range(rank))
    perm[_axis(d0, rank)], perm[_axis(d1, rank)] = perm[_axis(d1, rank)], perm[_axis(d0, rank)]
    return _transpose_to(ctx, node, x, tuple(perm))


def _t(ctx: _Context, node: Node) -> Any:
    x = node.args[0]
    return _transpose_to(ctx, node, x, (1, 0)) if len(ctx.shape(x)) == 2 else ctx.value(x)


def _broadcast_to(ctx: _Context, node: Node, x: Node) -> Any:
    """Exact: `x` broadcast to `node`'s shape is an einsum with a CONSTANT ones tensor (see
    `_build`); the value of `x` itself when the shapes already agree."""
    out = ctx.shape(node)
    if ctx.shape(x) == out:
        return ctx.value(x)
    return ctx.emitter.broadcast(
        ctx.tensor(x), out, **ctx.target(node, "", None), source=str(node.target)
    )


def _expand(ctx: _Context, node: Node) -> Any:
    return _broadcast_to(ctx, node, node.args[0])


def _copy(ctx: _Context, node: Node) -> Any:
    """copy(dst, src): the value of src, broadcast to dst's shape."""
    return _broadcast_to(ctx, node, node.args[1])


def _to_copy(ctx: _Context, node: Node) -> Any:
    x = node.args[0]
    if x.meta["val"].dtype == node.meta["val"].dtype:
        return ctx.value(x)
    return ctx.emit("cast", [x], node)


def _dropout(ctx: _Context, node: Node) -> Any:
    x, p, train = node.args[0], _arg(node, 1, 0.5), _arg(node, 2, True)
    multi = isinstance(node.meta.get("val"), (tuple, list))
    if not train or p == 0:
        out = ctx.value(x)
    else:
        out = ctx.emit("dropout", [x], node, index=0 if multi else None, p=p)
    return [out, None] if multi else out
