"""Plan files are parsed against a schema, never trusted: `checked_plan_data(text)` -> a dict.

Used by `plan_json.from_json` before anything is built from the data.

Schema "shardplan.plan/1" (written by `Plan.to_json`): every field has a declared type; numbers
are finite, sizes whole numbers in [1, 2**48], FLOPs and seconds >= 0, bandwidths and FLOP rates
> 0; a parameter layout entry is a tensor dim (>= 0) or -1 (replicated); loop-dim names are
strings. The text is at most MAX_BYTES long and nested at most MAX_DEPTH deep, so a hostile file
cannot exhaust the stack or the memory. Anything else raises PlanError naming the field (the
path inside the file) and saying what to do. The check is one pass over the parsed data.
"""

from __future__ import annotations

import json
import math
from typing import Any

from shardplan.checks import MAX_SIZE
from shardplan.errors import PlanError

MAX_BYTES = 1 << 30
MAX_DEPTH = 32
_FIX = "regenerate it with `shardplan plan --json FILE`"


def _fail(path: str, want: str, got: Any) -> PlanError:
    shown = repr(got)
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    return PlanError(f"plan file field {path}: expected {want}, got {shown}; {_FIX}")


def _dict(x: Any, path: str) -> dict[str, Any]:
    if not isinstance(x, dict):
        raise _fail(path, "an object", x)
    return x


def _list(x: Any, path: str, length: int | None = None) -> list[Any]:
    if not isinstance(x, list) or (length is not None and len(x) != length):
        raise _fail(path, "a list" if length is None else f"a list of {length}", x)
    return x


def _str(x: Any, path: str) -> str:
    if not isinstance(x, str):
        raise _fail(path, "a string", x)
    return x


def _int(x: Any, path: str, low: int, high: int = MAX_SIZE) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or not low <= x <= high:
        raise _fail(path, f"a whole number in [{low}, {high}]", x)
    return x


def _num(x: Any, path: str, positive: bool = False) -> float:
    ok = not isinstance(x, bool) and isinstance(x, (int, float)) and math.isfinite(x)
    if not ok or x < 0 or (positive and x == 0):
        raise _fail(path, "a finite number " + ("> 0" if positive else ">= 0"), x)
    return float(x)


def _depth_ok(data: Any) -> None:
    stack = [(data, 1)]
    while stack:
        x, d = stack.pop()
        if d > MAX_DEPTH:
            raise PlanError(f"plan file is nested deeper than {MAX_DEPTH} levels; {_FIX}")
        if isinstance(x, dict):
            stack.extend((v, d + 1) for v in x.values())
        elif isinstance(x, list):
            stack.extend((v, d + 1) for v in x)


def _graph(g: Any) -> None:
    g = _dict(g, "graph")
    _str(g.get("name"), "graph.name")
    for i, t in enumerate(_list(g.get("tensors"), "graph.tensors")):
        p = f"graph.tensors[{i}]"
        name, shape, dtype, role = _list(t, p, 4)
        _str(name, f"{p}.name")
        for j, s in enumerate(_list(shape, f"{p}.shape")):
            _int(s, f"{p}.shape[{j}]", 1)
        _int(dtype, f"{p}.dtype_bytes", 1, 64)
        _str(role, f"{p}.role")
    for i, o in enumerate(_list(g.get("ops"), "graph.ops")):
        p = f"graph.ops[{i}]"
        o = _dict(o, p)
        for key in ("name", "kind", "layer"):
            _str(o.get(key, ""), f"{p}.{key}")
        _num(o.get("flops"), f"{p}.flops")
        for key in ("inputs", "outputs"):
            for j, t in enumerate(_list(o.get(key), f"{p}.{key}")):
                _str(t, f"{p}.{key}[{j}]")
        for j, d in enumerate(_list(o.get("loop_dims"), f"{p}.loop_dims")):
            q = f"{p}.loop_dims[{j}]"
            d = _list(d, q)
            if len(d) not in (5, 6):
                raise _fail(q, "[name, extent, kind, reducer, halo(, span)]", d)
            _str(d[0], f"{q}.name")
            _int(d[1], f"{q}.extent", 1)
            _str(d[2], f"{q}.kind")
            if d[3] is not None:
                _str(d[3], f"{q}.reducer")
            _int(d[4], f"{q}.halo", 0)
            if len(d) == 6:
                _int(d[5], f"{q}.span", 0)
        for key in ("input_dims", "output_dims"):
            for j, dims in enumerate(_list(o.get(key), f"{p}.{key}")):
                for k, group in enumerate(_list(dims, f"{p}.{key}[{j}]")):
                    for m, n in enumerate(_list(group, f"{p}.{key}[{j}][{k}]")):
                        _str(n, f"{p}.{key}[{j}][{k}][{m}]")
        for j, a in enumerate(_list(o.get("attrs", []), f"{p}.attrs")):
            _str(_list(a, f"{p}.attrs[{j}]", 2)[0], f"{p}.attrs[{j}].key")


def _mesh(m: Any) -> None:
    m = _dict(m, "mesh")
    shape = _list(m.get("shape"), "mesh.shape")
    for j, s in enumerate(shape):
        _int(s, f"mesh.shape[{j}]", 1, 1 << 20)
    for j, n in enumerate(_list(m.get("names"), "mesh.names", len(shape))):
        _str(n, f"mesh.names[{j}]")
    bws = _list(m.get("bandwidth_bytes_per_s"), "mesh.bandwidth_bytes_per_s", len(shape))
    for j, b in enumerate(bws):
        _num(b, f"mesh.bandwidth_bytes_per_s[{j}]", positive=True)
    if m.get("memory_bytes") is not None:
        _num(m["memory_bytes"], "mesh.memory_bytes", positive=True)
    _num(m.get("flops_per_s"), "mesh.flops_per_s", positive=True)
    _str(m.get("machine", "a100"), "mesh.machine")


PLAN_SCHEMAS = ("shardplan.plan/1", "shardplan.plan/2")
"""The plan schemas this reader takes: /2 adds `problem`."""


def _problem(p: Any) -> None:
    """The plan's Problem fields (schema /2): budget bytes, ZeRO stage, batch, each or null."""
    if p is None:
        return
    p = _dict(p, "problem")
    unknown = sorted(set(p) - {"budget", "zero", "batch"})
    if unknown:
        raise _fail("problem", "budget, zero and batch only", unknown)
    if p.get("budget") is not None:
        _num(p["budget"], "problem.budget (bytes per device)", positive=True)
    if p.get("zero") is not None:
        _int(p["zero"], "problem.zero (the ZeRO stage)", 0, 3)
    if p.get("batch") is not None:
        _int(p["batch"], "problem.batch", 1)


def checked_plan_data(text: str | bytes | dict[str, Any]) -> dict[str, Any]:
    """The plan file's data after the schema check (see the module doc); PlanError otherwise."""
    if isinstance(text, (str, bytes)):
        if len(text) > MAX_BYTES:
            raise PlanError(f"plan file is larger than {MAX_BYTES:,} bytes; {_FIX}")
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise PlanError(f"plan JSON does not parse: {e}") from e
        except RecursionError as e:
            raise PlanError(f"plan file is nested too deeply; {_FIX}") from e
    else:
        data = text
    if not isinstance(data, dict) or data.get("schema") not in PLAN_SCHEMAS:
        raise PlanError(
            f"not a shardplan plan (schema must be one of {list(PLAN_SCHEMAS)}); "
            "write plans with `shardplan plan --json FILE`"
        )
    _depth_ok(data)
    _graph(data.get("graph"))
    _mesh(data.get("mesh"))
    o = _dict(data.get("options"), "options")
    _str(o.get("preset"), "options.preset")
    if not isinstance(o.get("train"), bool):
        raise _fail("options.train", "true or false", o.get("train"))
    _str(o.get("optimizer"), "options.optimizer")
    if "zero" in o:
        _int(o["zero"], "options.zero (the ZeRO stage)", 0, 3)
    _problem(data.get("problem"))
    _str(data.get("method"), "method")
    _num(data.get("search_seconds"), "search_seconds")
    _str(data.get("status", "ok"), "status")
    for j, n in enumerate(_list(data.get("notes", []), "notes")):
        _str(n, f"notes[{j}]")
    for i, row in enumerate(_list(data.get("ops"), "ops")):
        row = _dict(row, f"ops[{i}]")
        _str(row.get("name"), f"ops[{i}].name")
        for r, cut in enumerate(_list(row.get("strategy"), f"ops[{i}].strategy")):
            if cut is not None:
                _str(cut, f"ops[{i}].strategy[{r}] (a loop-dim name or null)")
    layouts = _dict(data.get("param_layouts", {}), "param_layouts")
    for name, layout in layouts.items():
        for r, s in enumerate(_list(layout, f"param_layouts[{name!r}]")):
            _int(s, f"param_layouts[{name!r}][{r}] (a tensor dim or -1)", -1, 64)
    return data
