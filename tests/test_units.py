"""The one number formatter (shardplan.units): three significant digits, SI prefixes, no raw
floats; the forms issue 27 found printed raw, each in its formatted form."""

from __future__ import annotations

import pytest

from shardplan import units


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (0.00149299, "1.49 ms"),
        (0.002105, "2.1 ms"),
        (13.8e-6, "13.8 µs"),
        (1.5e-7, "0.15 µs"),
        (2e-11, "<0.01 µs"),
        (0.9996, "1 s"),  # rounds into the next unit, not "1e+03 ms"
        (999.6e-6, "1 ms"),
        (0.0, "0"),
    ],
)
def test_seconds(value, text):
    assert units.seconds(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [(1e6, "1 MB"), (1.87e6, "1.87 MB"), (4, "4 B"), (999.7, "1 KB"), (1.44e12, "1.44 TB")],
)
def test_bytes(value, text):
    assert units.nbytes(value) == text


def test_rates_flops_counts_and_plain_numbers():
    assert units.rate(60800, "tokens") == "60.8 K tokens/s"  # not 6.08e+04 tokens/s
    assert units.flop_rate(1.037e10) == "10.4 GFLOP/s"  # not 0.01037 TFLOP/s
    assert units.flops(2.7e7) == "27 MFLOPs"  # as `show` prints them, not 2.7e+07 FLOPs
    assert units.flops(500) == "500 FLOPs"
    assert units.bandwidth(25e9) == "25 GB/s"
    assert units.params(124e6) == "124 M"
    assert units.number(0.0233) == "0.0233"
    assert units.number(2.5e-16) == "2.5e-16"  # an error that small keeps its exponent
    assert units.cost(0.00149299, "s") == "1.49 ms"
    assert units.cost(1234.0, "elements") == "1.23 K el"


def test_noise_against_a_scale_prints_zero():
    assert units.seconds(1e-16, scale=1.0) == "0"
    assert units.seconds(1e-9, scale=1.0) == "<0.01 µs"
