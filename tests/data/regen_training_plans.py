"""Regenerate the golden training plans in tests/data/golden_training_plans.json (the ONLY way
to change them).

Usage, from the repository root:

    PYTHONPATH=$PWD python tests/data/regen_training_plans.py            # rewrite the file
    PYTHONPATH=$PWD python tests/data/regen_training_plans.py --check    # compare; exit 1 on a diff

GPT-3-shaped decoders (the `gpt3` zoo family at GPT-3 paper widths, few layers so the suite stays
fast) on four meshes with memory budgets, planned by the training-step search, and two Megatron
recipes. Stored: what the planner decides (stages, micro-batches, levers, every stage op's
strategy and parameter layout, the axis summary and notes) and the step cost's floats by JSON's
exact repr, so equality is bit-identical. Left out: search wall time and display rows.
Generated first from main 86a2cb8, before the issue-22 moves.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden_training_plans.json"

# (key, zoo overrides, mesh, global batch, budget); GPT-3 widths (Brown et al. 2020, Table 2.1)
SEARCHES = (
    ("1.3b@2x8", {"layers": 24, "hidden": 2048, "heads": 16}, "2x8", 64, "40GB"),
    ("6.7b@4x8", {"layers": 32, "hidden": 4096, "heads": 32}, "4x8", 128, "12GB"),
    ("175b-8l@8x8", {"layers": 8, "hidden": 12288, "heads": 96}, "8x8", 64, "24GB"),
    ("2.7b-4l@3x4", {"layers": 4, "hidden": 2560, "heads": 32, "seq": 512}, "3x4", 48, "8GB"),
)
# (key, zoo overrides, mesh, global batch, tensor, pipeline, micro-batch size)
RECIPES = (
    ("recipe-6.7b@4x8", {"layers": 32, "hidden": 4096, "heads": 32}, "4x8", 128, 8, 2, 2),
    ("recipe-1.3b@2x8", {"layers": 24, "hidden": 2048, "heads": 16}, "2x8", 64, 4, 2, 1),
)


def _builder(overrides: dict[str, Any]):
    import shardplan as sp

    return lambda b: sp.zoo.build("gpt3", batch=b, **overrides)


def search_plan(overrides: dict[str, Any], mesh: str, batch: int, memory: str):
    import shardplan as sp

    try:
        return sp.plan(
            _builder(overrides), mesh, method="step", batch=batch, dtype="bf16", memory=memory
        )
    except (TypeError, sp.errors.ShardplanError):  # before issue 22: the direct entry point
        from shardplan.cost import CostOptions
        from shardplan.mesh import parse_bytes, parse_mesh
        from shardplan.search.step.search import plan_training

        opts = CostOptions.make("shardplan", True, "adam", "bf16")
        return plan_training(
            _builder(overrides), batch, parse_mesh(mesh), opts, parse_bytes(memory)
        )


def recipe_plan(overrides, mesh, batch, tensor, pipeline, micro_batch_size):
    import shardplan as sp

    try:
        return sp.plan(
            _builder(overrides),
            mesh,
            method="megatron-recipe",
            batch=batch,
            dtype="bf16",
            tensor=tensor,
            pipeline=pipeline,
            micro_batch_size=micro_batch_size,
        )
    except (TypeError, sp.errors.ShardplanError):
        from shardplan.cost import CostOptions
        from shardplan.mesh import parse_mesh
        from shardplan.search.step.recipes import megatron_recipe

        opts = CostOptions.make("shardplan", True, "adam", "bf16")
        return megatron_recipe(
            _builder(overrides), batch, parse_mesh(mesh), opts, tensor, pipeline, micro_batch_size
        )


def record(tp) -> dict[str, Any]:
    """The decided parts of a training plan (module docstring)."""
    from shardplan.exporters.plan_json import to_dict

    stages = []
    for s in tp.stages:
        data = to_dict(s.plan)
        stages.append(
            {
                "recompute": s.levers.recompute.value,
                "zero": s.levers.zero,
                "method": data["method"],
                "mesh": data["mesh"]["shape"],
                "cost": data["cost"],
                "strategies": {row["name"]: row["strategy"] for row in data["ops"]},
                "param_layouts": data["param_layouts"],
            }
        )
    step = tp.step.to_dict()
    return {
        "micro_batches": tp.micro_batches,
        "pipeline_stages": tp.pipeline_stages,
        "method": tp.method,
        "tokens_per_sample": tp.tokens_per_sample,
        "axes": list(tp.axes),
        "notes": list(tp.notes),
        "step": step,
        "stages": stages,
    }


def cases() -> list[str]:
    return [c[0] for c in SEARCHES + RECIPES]


def plan_of(key: str):
    for k, ov, mesh, batch, memory in SEARCHES:
        if k == key:
            return search_plan(ov, mesh, batch, memory)
    for k, ov, mesh, batch, t, p, b in RECIPES:
        if k == key:
            return recipe_plan(ov, mesh, batch, t, p, b)
    raise KeyError(key)


def main(argv: list[str]) -> int:
    records = {k: record(plan_of(k)) for k in cases()}
    if "--check" in argv:
        stored = json.loads(GOLDEN.read_text())
        diff = sorted(k for k in stored.keys() | records.keys() if stored.get(k) != records.get(k))
        print("identical" if not diff else f"differ: {diff}")
        return 1 if diff else 0
    GOLDEN.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(records)} training plans to {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
