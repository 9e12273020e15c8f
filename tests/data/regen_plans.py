"""Regenerate the golden plans in tests/data/golden_plans.json (the ONLY way to change them).

Usage, from the repository root:

    PYTHONPATH=$PWD python tests/data/regen_plans.py            # rewrite the golden file
    PYTHONPATH=$PWD python tests/data/regen_plans.py --check    # compare only; exit 1 on a diff

For every zoo model (its `small=True` sizes, so the suite stays fast) on meshes "8" and "2x8"
(the default machine), D-Rec with default options, it stores the parts of the plan JSON that the
planner decides: method, status, notes, options, mesh, cost breakdown, every op's strategy and the
parameter layouts. Left out: `search_seconds` (wall time) and the graph and per-op display rows
(pure functions of the model and of the strategies, whose text format may change without the plan
changing). Floats are stored by JSON's exact repr, so equality is bit-identical.
tests/test_golden_plans.py compares the current code against this file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden_plans.json"
MESHES = ("8", "2x8")


def plan_record(model: str, mesh: str) -> dict[str, Any]:
    """The decided parts of the default D-Rec plan of small `model` on `mesh`."""
    import shardplan as sp

    p = sp.plan(sp.zoo.build(model, small=True), mesh)
    try:  # after the issue-17 moves the JSON lives in the exporters
        from shardplan.exporters.plan_json import to_dict
    except ImportError:  # the pre-move commit the golden file was generated from
        data = p.to_dict()
    else:
        data = to_dict(p)
    return {
        "method": data["method"],
        "status": data["status"],
        "notes": data["notes"],
        "options": data["options"],
        "mesh": data["mesh"],
        "cost": data["cost"],
        "strategies": {row["name"]: row["strategy"] for row in data["ops"]},
        "param_layouts": data["param_layouts"],
    }


def all_records() -> dict[str, dict[str, Any]]:
    import shardplan as sp

    return {f"{m}@{mesh}": plan_record(m, mesh) for m in sp.zoo.MODELS for mesh in MESHES}


def main(argv: list[str]) -> int:
    records = all_records()
    if "--check" in argv:
        stored = json.loads(GOLDEN.read_text())
        diff = sorted(k for k in stored.keys() | records.keys() if stored.get(k) != records.get(k))
        print("identical" if not diff else f"differ: {diff}")
        return 1 if diff else 0
    GOLDEN.write_text(json.dumps(records, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(records)} plans to {GOLDEN}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
