"""The CLI on 30+ bad inputs: each fails with one line on stderr, its documented exit code, and no
traceback (issue 16; the codes are the ones docs/errors.md lists)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shardplan.cli.main import main

DEEP = "[" * 5000 + "]" * 5000


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    (d / "corrupt.onnx").write_bytes(b"\x00garbage\xff")
    (d / "corrupt.json").write_text('{"schema": "shardplan.plan/1", "graph": []}')
    (d / "deep.json").write_text('{"schema": "shardplan.plan/1", "x": ' + DEEP + "}")
    (d / "notjson.json").write_text("{nope")
    return d


# (argv with {d} for the temp folder, exit code)
CASES = [
    ("plan mlp --mesh 8 --memory 40", 4),
    ("plan mlp --mesh 8 --memory 0GB", 4),
    ("plan mlp --mesh 8 --memory nanGB", 4),
    ("plan mlp --mesh 8 --memory lots", 4),
    ("plan mlp --mesh 8 --memory 1B", 6),
    ("plan mlp --mesh 2.5", 4),
    ("plan mlp --mesh 16x", 4),
    ("plan mlp --mesh 0", 4),
    ("plan mlp --mesh 2305843009213693951", 4),
    ("plan mlp --mesh 8 --machine tpu", 2),
    ("plan mlp --mesh 8 --preset bogus", 2),
    ("plan mlp --mesh 8 --json {d}", 2),
    ("plan mlp --mesh 8 --json {d}/missing/plan.json", 2),
    ("plan --onnx {d}/missing.onnx --mesh 8", 2),
    ("plan --onnx {d}/corrupt.onnx --mesh 8", 3),
    ("plan --torch json:dumps --mesh 8", 3),
    ("plan --torch no_such_module_xyz:build --mesh 8", 3),
    ("plan --torch json --mesh 8", 3),
    ("plan mlp --onnx {d}/corrupt.onnx --mesh 8", 2),
    ("plan mlp --mesh 8 --ops bogus", 2),
    ("plan mlp --mesh 8 --method magic", 2),
    ("plan mlp --mesh 8 --time-limit abc", 2),
    ("plan mlp", 2),
    ("bogus", 2),
    ("plan nope --mesh 8", 2),
    ("show nope", 2),
    ("plan mlp --batch 0 --mesh 8", 2),
    ("plan gpt2-small --small --heads 0 --mesh 8", 2),
    ("plan mlp --image 32 --mesh 8", 2),
    ("compare mlp --mesh 8 --methods drec,bogus", 2),
    ("compare mlp --mesh 8 --json {d}", 2),
    ("verify gpt2-small --mesh 8", 2),
    ("verify mlp --small --mesh 8 --memory 40", 4),
    ("verify {d}/missing.json", 5),
    ("verify {d}/corrupt.json", 5),
    ("verify {d}/deep.json", 5),
    ("verify {d}/notjson.json", 5),
]


@pytest.mark.parametrize(("argv", "code"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_with_its_exit_code(files, capsys, argv, code):
    args = argv.format(d=files).split()
    try:
        got = main(args)
    except SystemExit as e:  # argparse's usage errors
        got = e.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert got == code, err
    assert len(lines) == 1, err
    assert lines[0].startswith("error: ")
    assert "Traceback" not in err


@pytest.mark.parametrize(
    "argv",
    [
        "plan mlp --mesh 8 --json {d}",
        "plan --onnx {d}/corrupt.onnx --mesh 8",
        "verify {d}/deep.json",
    ],
)
def test_a_real_process_prints_no_traceback(files, argv):
    out = subprocess.run(
        [sys.executable, "-m", "shardplan.cli", *argv.format(d=files).split()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
