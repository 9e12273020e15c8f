"""Every line the CLI printed into docs/cli.md's generated examples (docs/make_cli_md.py: stdout
and `warning:` lines of stderr) reads its numbers through `shardplan.units`: no raw floats such as
`0.00149299`, `0.002105 s` or `6.08e+04` (issue 27). An exponent is allowed only on a unitless
number under 1e-3 (a numerical error like 3.3e-16, which `units.number` prints so)."""

from __future__ import annotations

import re
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
BLOCK = re.compile(r"^<!-- \$ shardplan .*? -->\n```text\n(.*?)^```", re.S | re.M)
RAW = (
    re.compile(r"(?<![\w.])\d+\.\d{4,}(?![\w.])"),  # more than 3 decimals: 0.00149299, 2.10524
    re.compile(r"\d[eE]\+\d"),  # a positive exponent: 6.08e+04, 1.44e+03 GB
    re.compile(r"\d[eE]-\d+\s*(s|ms|µs|ns|B|KB|MB|GB|TB|FLOPs?|[KMGT]?FLOP/s|tokens)\b"),
    re.compile(r"\d\s*ns\b"),  # times are s, ms or µs
)


def _lines() -> list[str]:
    return [line for block in BLOCK.findall(PAGE.read_text()) for line in block.splitlines()]


def test_the_page_has_generated_examples():
    assert len(BLOCK.findall(PAGE.read_text())) >= 15


def test_no_raw_floats_in_the_generated_examples():
    bad = [line for line in _lines() if any(p.search(line) for p in RAW)]
    assert not bad, "\n".join(bad)


def test_the_scan_catches_the_raw_forms_of_issue_27():
    for text in (
        "data-parallel plan (cost 0.00149299) is returned",
        "step time 0.002105 s",
        "6.08e+04 tokens/s",
        "needs 3.23e-05 GB",
        "intra-op fwd 0.0233 ns",
    ):
        assert any(p.search(text) for p in RAW), text
    for text in ("max error 3.3e-16 (grad w)", "1.000", "12.3 ms", "60.8 K tokens/s"):
        assert not any(p.search(text) for p in RAW), text
