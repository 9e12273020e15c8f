"""The Python examples of docs/exports.md run as written (each ```python block, in order)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "exports.md"
BLOCKS = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_page_has_examples():
    assert len(BLOCKS) >= 4


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_exports_example_runs(index, devices8, capsys):
    if "torch" in BLOCKS[index] or "placements" in BLOCKS[index]:
        pytest.importorskip("torch")
    exec(compile(BLOCKS[index], f"{DOC.name}[{index}]", "exec"), {"__name__": "__docs__"})
    assert capsys.readouterr().out  # every example prints what it shows


def test_models_page_is_generated_from_the_zoo():
    import importlib.util

    path = DOC.parent / "make_models_md.py"
    spec = importlib.util.spec_from_file_location("make_models_md", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (DOC.parent / "models.md").read_text() == module.render(), (
        "docs/models.md is stale: run `PYTHONPATH=$PWD python docs/make_models_md.py`")
