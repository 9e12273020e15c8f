"""Package-level rules: framework-free core, downward-only imports, small files, public API."""

import ast
import subprocess
import sys
from pathlib import Path

import shardplan

ROOT = Path(shardplan.__file__).resolve().parent
LAYERS = {
    "errors": 0, "ir": 1, "mesh": 2, "sharding": 3, "cost": 4, "plan": 5, "search": 6,
    "importers": 7, "exporters": 7, "backends": 7, "torch": 8, "jax": 8, "zoo": 2, "cli": 9,
    "__init__": 10,
    "__main__": 10,
}


def _layer(module: str) -> int:
    return LAYERS[module.split(".")[0]]


def test_core_import_is_framework_free():
    code = ("import sys, shardplan, shardplan.search, shardplan.cli.main; "
            "print([m for m in ('torch', 'jax', 'onnx', 'matplotlib') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_module_level_imports_only_go_down():
    problems = []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        own = ".".join(rel.parts)
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level only: lazy imports inside functions are allowed
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                    "shardplan."):
                target = node.module.removeprefix("shardplan.")
                if _layer(target) > _layer(own) and own.split(".")[0] != target.split(".")[0]:
                    problems.append(f"{own} imports {node.module}")
    assert problems == []


def test_files_stay_small():
    big = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > 700}
    assert big == {}


def test_public_api():
    for name in shardplan.__all__:
        assert hasattr(shardplan, name), name


def test_importers_and_engines_load_on_first_use():
    code = ("import sys, shardplan; shardplan.from_torch, shardplan.from_jaxpr, shardplan.from_onnx;"
            " shardplan.torch.parallelize, shardplan.jax.shard; "
            "print([m for m in ('torch', 'jax', 'onnx') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"  # the names resolve without importing a framework
    from shardplan.importers.torch import from_torch

    assert shardplan.from_torch is from_torch


def test_top_level_plan_is_the_function():
    import shardplan.cli.main  # noqa: F401
    import shardplan.plan  # noqa: F401

    p = shardplan.plan(shardplan.zoo.build("mlp"), "8")
    assert shardplan.evaluate(p).total == p.cost.total
