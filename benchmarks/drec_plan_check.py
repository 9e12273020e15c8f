"""D-Rec plan-equality check: the plans of every zoo model (small sizes) on meshes 8, 2x8, 4x8,
6 and 12, plus a few deep models (where repeated layers are folded), recorded as a digest of the
strategies and the evaluator's cost, and compared against a baseline recorded the same way.

Run: python benchmarks/drec_plan_check.py --write base.json       (record)
     python benchmarks/drec_plan_check.py --against base.json     (compare; exit 1 if worse)
     add --quality for the cases of benchmarks/quality.py instead (every zoo model, transformers
     with one layer, x the same meshes): identical plans there leave quality.py's D-Rec / ILP
     ratios unchanged.
A case passes when its strategies are identical, or when the evaluator scores the new plan lower.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import shardplan as sp
from shardplan.cost import CostOptions, evaluate_strategies
from shardplan.search.drec.search import drec

MESHES = ("8", "2x8", "4x8", "6", "12")
DEEP = (
    ("gpt3", {"layers": 12, "hidden": 256, "heads": 4, "seq": 256, "batch": 8}, ("8", "2x8")),
    ("gpt3", {"layers": 24, "hidden": 1024, "heads": 16, "seq": 512, "batch": 8}, ("8", "2x4")),
    ("gpt2-small", {}, ("8", "2x8")),
    ("bert-base", {}, ("8",)),
    ("resnet50", {}, ("8",)),
    ("gpt3-175b", {"batch": 1536}, ("1024",)),
)


LAYERED = {"bert-base", "bert-large", "gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"}
LAYERED |= {"gpt3-175b", "gpt3", "vit-b16"}


def quality_cases():
    """The cases of benchmarks/quality.py (transformers with one layer, the rest at default)."""
    for name in sp.zoo.MODELS:
        kw = {"layers": 1} if name in LAYERED else {}
        for mesh in MESHES:
            yield f"quality:{name}/{mesh}", (lambda n=name, k=kw: sp.zoo.build(n, **k)), mesh


def cases(deep: bool):
    for name in sp.zoo.MODELS:
        for mesh in MESHES:
            yield f"{name}/small/{mesh}", (lambda n=name: sp.zoo.build(n, small=True)), mesh
    if deep:
        for name, kw, meshes in DEEP:
            for mesh in meshes:
                label = ",".join(f"{k}={v}" for k, v in kw.items()) or "default"
                yield f"{name}/{label}/{mesh}", (lambda n=name, k=kw: sp.zoo.build(n, **k)), mesh


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--write", type=Path, help="record the plans to this JSON file")
    parser.add_argument("--against", type=Path, help="compare with plans recorded by --write")
    parser.add_argument("--no-deep", action="store_true", help="only the small zoo models")
    parser.add_argument("--quality", action="store_true", help="the cases of quality.py instead")
    args = parser.parse_args()
    opts = CostOptions.make()
    base = json.loads(args.against.read_text()) if args.against else {}
    out: dict[str, dict[str, object]] = {}
    worse = 0
    for key, build, mesh_text in quality_cases() if args.quality else cases(not args.no_deep):
        graph, mesh = build(), sp.parse_mesh(mesh_text)
        start = time.perf_counter()
        plan = drec(graph, mesh, opts)
        seconds = time.perf_counter() - start
        cost = evaluate_strategies(graph, mesh, plan, opts).total
        digest = hashlib.sha256(json.dumps(sorted(plan.items())).encode()).hexdigest()[:16]
        out[key] = {"digest": digest, "cost": cost, "seconds": seconds}
        old = base.get(key)
        if old is None:
            verdict = "new"
        elif old["digest"] == digest:
            verdict = "same"
        elif cost < old["cost"] * (1 - 1e-12):
            verdict = f"changed, lower cost ({cost / old['cost']:.6f}x)"
        else:
            verdict = f"CHANGED, cost {cost / old['cost']:.6f}x"
            worse += 1
        print(f"{key:60s} {seconds:7.3f}s  {verdict}", flush=True)
    if args.write:
        args.write.write_text(json.dumps(out, indent=1, sort_keys=True))
    if args.against:
        print(f"{worse} case(s) changed without a lower cost")
        sys.exit(1 if worse else 0)


if __name__ == "__main__":
    main()
