"""The one helper that imports optional frameworks, and the rule that nobody else does."""

import ast
import sys

import pytest

from shardplan.errors import MissingDependencyError
from shardplan.lazy import require
from tests.test_package import ROOT


def test_require_returns_the_module_and_loads_the_submodules():
    assert require("json", "json.decoder", extra="x", user="u") is sys.modules["json"]
    assert "json.decoder" in sys.modules


def test_missing_module_names_the_user_the_extra_and_the_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)  # as if onnx were not installed
    with pytest.raises(MissingDependencyError) as e:
        require("onnx", extra="onnx", user="importing ONNX models", hint="or export to jaxpr")
    text = str(e.value)
    assert text.startswith("importing ONNX models needs the `onnx` extra")
    assert "pip install 'shardplan[onnx]'; or export to jaxpr" in text
    assert e.value.exit_code == 8


def test_a_missing_submodule_is_missing_too(monkeypatch):
    monkeypatch.setitem(sys.modules, "json.tool", None)
    with pytest.raises(MissingDependencyError, match=r"shardplan\[x\]"):
        require("json", "json.tool", extra="x", user="u")


IMPORT_ERRORS_ALLOWED = {
    "lazy.py",
    "cli/models.py",  # `--torch MODULE:FUNCTION` imports the user's own module, not a framework
}


def _catches_import_error(source: str) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ExceptHandler) and node.type is not None:
            names = [n.id for n in ast.walk(node.type) if isinstance(n, ast.Name)]
            if {"ImportError", "ModuleNotFoundError"} & set(names):
                lines.append(node.lineno)
    return lines


def test_optional_frameworks_are_imported_through_require_only():
    found = {
        str(rel): lines
        for path in sorted(ROOT.rglob("*.py"))
        if str(rel := path.relative_to(ROOT)) not in IMPORT_ERRORS_ALLOWED
        and (lines := _catches_import_error(path.read_text()))
    }
    assert found == {}, "use shardplan.lazy.require instead of catching ImportError"


def test_the_check_catches_a_hand_written_guard():
    planted = "try:\n    import torch\nexcept (ImportError, OSError):\n    torch = None\n"
    assert _catches_import_error(planted) == [3]
    assert _catches_import_error("try:\n    pass\nexcept KeyError:\n    pass\n") == []
