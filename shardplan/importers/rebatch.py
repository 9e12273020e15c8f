"""An imported graph at another batch size from two traces, without tracing again.

The training-step planner asks for the model at each micro-batch size it tries, and one
torch.export + translation of a full-size config costs seconds per size. Two imports of the same
module at batches b1 and b2 that agree in everything but their numbers determine the others
(`ir.rebatch.batch_scaling`): each number (tensor dims, integer attributes such as a reshape's
target shape, FLOPs) must be the same at both or proportional to the batch (x1 * b2 == x2 * b1,
and x1 * b / b1 a whole number), and so must the whole numbers in the import's notes ("4 group(s)
of 8 tokens"); anything else — another structure, a string that moved, an opaque operator, an
offset like b + 1 or a count like ceil(b / 3) that is not proportional — refuses (None) and the
caller traces. The graph at b is then derived again through the catalogue
(`BatchScaling.through_catalogue`): every op's signature, output shapes and FLOPs from the
scaled input shapes and attributes, each output shape equal to the scaled one, so a wrong guess
fails here instead of reaching the planner. O(ops + tensors).
"""

from __future__ import annotations

import re
from dataclasses import replace

from shardplan.importers._build import ImportResult
from shardplan.ir.rebatch import batch_scaling, scaled_number


class _Refused(Exception):
    """The two imports do not determine the note at the new batch."""


def rebatch(
    first: tuple[int, ImportResult], second: tuple[int, ImportResult], batch: int
) -> ImportResult | None:
    """`first` = (b1, its import), `second` = (b2, ...), b1 != b2: the import at `batch`, or None
    when the two do not determine it (module docstring)."""
    (b1, one), (b2, two) = first, second
    if b1 == b2 or one.replicated or two.replicated:
        return None
    if dict(one.approximated) != dict(two.approximated) or len(one.notes) != len(two.notes):
        return None
    scaling = batch_scaling(one.graph, b1, two.graph, b2)
    graph = None if scaling is None else scaling.through_catalogue(batch)
    if graph is None:
        return None
    try:
        notes = tuple(_note(a, b, b1, b2, batch) for a, b in zip(one.notes, two.notes, strict=True))
    except _Refused:
        return None
    return replace(one, graph=graph, notes=notes)


def _note(s1: str, s2: str, b1: int, b2: int, batch: int) -> str:
    """A note with its whole numbers scaled like values ("4 group(s) of 8 tokens")."""
    parts1, parts2 = re.split(r"(\d+)", s1), re.split(r"(\d+)", s2)
    if len(parts1) != len(parts2):
        raise _Refused
    out = []
    for i, (a, b) in enumerate(zip(parts1, parts2, strict=True)):
        if i % 2 == 0:  # the text between numbers must not move
            if a != b:
                raise _Refused
            out.append(a)
            continue
        value = scaled_number(int(a), b1, int(b), b2, batch)
        if value is None:
            raise _Refused
        out.append(str(value))
    return "".join(out)
