"""The model at each micro-batch size the step search asks for: built once, or derived.

The probe (the model at the global batch) and the first other size are built by the user's
builder; `ir.rebatch.batch_scaling` reads from the two which numbers grow with the batch. The
next size is built too and compared with the derived graph; when they are equal, every later
size is derived (`BatchScaling.at`: no catalogue calls, sort or verification; the segments are
the probe's, which depend on the op order and the tensors' roles only), else every later size is
built. A size the derivation refuses (a dim that would become 1 or not whole) is built. So a
search reaching k sizes runs the builder min(k, 3) times when the model scales with the batch,
k times otherwise; the graphs it gets are the builder's (checked once) in both cases. A derived
graph's segment prints are fingerprinted once per class of segments equal at the probe's and
the learned size (`_derived_prints`), not segment by segment.
"""

from __future__ import annotations

from collections.abc import Callable

from shardplan.ir.graph import Graph
from shardplan.ir.rebatch import BatchScaling, batch_scaling
from shardplan.ir.segments import Segment, segments
from shardplan.search.step.structure import (
    LayerSplit,
    layer_split,
    range_fingerprint,
    segment_prints,
)

Built = tuple[Graph, tuple[Segment, ...], list[int], LayerSplit]


class ModelSizes:
    """The model, its segments, segment prints and layer split per micro-batch size (cached);
    `ids` numbers segment structures across sizes."""

    def __init__(self, build: Callable[[int], Graph | None], probe: Graph, batch: int) -> None:
        self.build, self.batch = build, batch
        self.ids: dict[tuple[object, ...], int] = {}
        segs = segments(probe)
        prints = segment_prints(probe, segs, self.ids)
        self.probe: Built = (probe, segs, prints, layer_split(prints))
        self.built: dict[int, Built | None] = {batch: self.probe}
        self.scaling: BatchScaling | None = None
        self.state = "learn"  # learn -> check -> derive, or off
        self.derived = 0  # sizes derived rather than built
        self.learned: list[int] | None = None  # the prints of the size the scaling was learned at

    def __call__(self, b: int) -> Built | None:
        """The model at micro-batch size `b` with its segments; None when the builder gives none."""
        if b not in self.built:
            g = self._derived(b)
            derived = g is not None
            if derived:
                self.derived += 1
                segs = self.probe[1]  # the same ops, order and roles as the probe
            elif (g := self._built(b)) is not None:
                segs = segments(g)
            if g is None:
                self.built[b] = None
            else:
                prints = self._derived_prints(g) if derived else None
                if prints is None:
                    prints = segment_prints(g, segs, self.ids)
                if self.learned is None and self.scaling is not None:
                    self.learned = prints  # the size just learned from (built)
                self.built[b] = (g, segs, prints, layer_split(prints))
        return self.built[b]

    def _derived_prints(self, g: Graph) -> list[int] | None:
        """A derived graph's segment prints, one fingerprint per class of segments equal at the
        probe's size and at the size learned from: a number of a derived graph is a function of
        its two values there (scaled when proportional, else kept), so such segments derive
        alike, and the ids come out as `segment_prints` numbers them (first appearance)."""
        probe, learned = self.probe[2], self.learned
        if learned is None or len(learned) != len(probe):
            return None
        segs = self.probe[1]
        per_class: dict[tuple[int, int], int] = {}
        out = []
        for seg, key in zip(segs, zip(probe, learned, strict=True), strict=True):
            found = per_class.get(key)
            if found is None:
                fp = range_fingerprint(g, seg.start, seg.stop)
                found = per_class[key] = self.ids.setdefault(fp, len(self.ids))
            out.append(found)
        return out

    def _derived(self, b: int) -> Graph | None:
        if self.state != "derive" or self.scaling is None:
            return None
        return self.scaling.at(b)

    def _built(self, b: int) -> Graph | None:
        g = self.build(b)
        if g is None or self.state in ("derive", "off"):
            return g
        if self.state == "learn":
            self.scaling = batch_scaling(self.probe[0], self.batch, g, b)
            self.state = "check" if self.scaling is not None else "off"
        else:  # one derived graph checked against the builder before any is trusted
            assert self.scaling is not None
            derived = self.scaling.at(b)
            if derived is not None:  # else refused here: check on the next size
                self.state = "derive" if derived == g else "off"
        return g


__all__ = ["Built", "ModelSizes"]
