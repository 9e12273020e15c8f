"""The one formatter for every number a user reads: times, bytes, rates, FLOPs, counts, costs.

Three significant digits and an SI prefix, never an exponent or a long decimal: 0.00149299 s
reads "1.49 ms", 60800 tokens/s "60.8 K tokens/s", 2.7e7 FLOPs "27 MFLOPs", 1e6 bytes "1 MB"
(decimal units, like the --memory flag). Notes, errors, tables, summaries and the training
report all print through these functions, so one number reads the same everywhere (a test scans
the generated CLI docs for raw floats). Each call is O(1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

NOISE = 1e-12
"""A time at most NOISE x the scale it is read against (the plan's total) prints as 0: float
rounding of sums of the same terms in another order, not a cost."""

_SI = ("", "K", "M", "G", "T", "P", "E")


def _sig3(x: float) -> str:
    """x (0 <= |x| < 1000) with three significant digits and no exponent: 1.49, 60.8, 312."""
    if x == 0:
        return "0"
    digits = max(0, 2 - math.floor(math.log10(abs(x))))
    text = f"{x:.{digits}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text  # 999.6 gives "1000"


def count(n: float, suffixes: Sequence[str] = _SI[:6]) -> str:
    """1234 -> '1.23 K', 2.7e7 -> '27 M', 0.5 -> '0.5': three significant digits, SI prefixes."""
    if not math.isfinite(n):
        return str(n)
    if n != 0 and abs(n) < 1e-3:
        return number(n)
    for unit in suffixes[:-1]:
        text = _sig3(n)
        if abs(n) < 1000 and text.lstrip("-") != "1000":
            return f"{text}{' ' + unit if unit else ''}"
        n /= 1000
    return f"{_sig3(n) if abs(n) < 1000 else f'{n:,.0f}'} {suffixes[-1]}"


def number(x: float) -> str:
    """A plain quantity (an error, a ratio): 0.0233 -> '0.0233', 1234.5 -> '1.23 K'; below 1e-3
    the exponent is the honest way to print it (2.5e-16), so it keeps one."""
    if not math.isfinite(x) or x == 0:
        return "0" if x == 0 else str(x)
    if abs(x) < 1e-3:
        return f"{x:.2g}"
    return count(x)


def seconds(s: float, scale: float = 0.0) -> str:
    """0.0123 -> '12.3 ms', 1.38e-05 -> '13.8 µs', 1.5e-07 -> '0.15 µs', 2e-11 -> '<0.01 µs'.

    Units are s, ms and µs; under a microsecond two decimals of µs, under 10 ns (a few bytes
    over a fast link) '<0.01 µs', so columns stay narrow. `scale` (e.g. the plan's total):
    |s| <= NOISE * scale, or under a femtosecond, is float noise and prints as '0'.
    """
    a = abs(s)
    if a <= max(1e-15, NOISE * abs(scale)):
        return "0"
    if a < 1e-8:
        return f"{'-' if s < 0 else ''}<0.01 µs"
    if a < 1e-6:
        return f"{s * 1e6:.2f} µs"
    if a < 1e-3 and _sig3(s * 1e6).lstrip("-") != "1000":
        return f"{_sig3(s * 1e6)} µs"
    if a < 1 and _sig3(s * 1e3).lstrip("-") != "1000":
        return f"{_sig3(s * 1e3)} ms"
    if a < 1000:
        return f"{_sig3(s)} s"
    return f"{s:,.0f} s"


def nbytes(n: float) -> str:
    """1.44e12 -> '1.44 TB', 187e4 -> '1.87 MB', 4 -> '4 B' (decimal units, like --memory)."""
    return count(n, ("B", "KB", "MB", "GB", "TB", "PB"))


def bandwidth(bytes_per_s: float) -> str:
    """300e9 -> '300 GB/s'."""
    return nbytes(bytes_per_s) + "/s"


def flops(n: float) -> str:
    """2.7e7 -> '27 MFLOPs' (the count of floating-point operations)."""
    text = count(n)
    return text + ("FLOPs" if text[-1].isalpha() else " FLOPs")


def flop_rate(n: float) -> str:
    """1.037e10 -> '10.4 GFLOP/s'."""
    text = count(n)
    return text + ("FLOP/s" if text[-1].isalpha() else " FLOP/s")


def rate(n: float, what: str) -> str:
    """60800, 'tokens' -> '60.8 K tokens/s'."""
    return f"{count(n)} {what}/s"


def params(n: float) -> str:
    """Parameter counts: 124e6 -> '124 M', 175e9 -> '175 B'."""
    return count(n, ("", "K", "M", "B", "T"))


def cost(value: float, units: str, scale: float = 0.0) -> str:
    """A cost in a plan's units: seconds as s/ms/µs (`seconds`; `scale`: the total it is read
    against, for the float-noise cut), the mindspore preset's elements as counts."""
    return seconds(value, scale) if units == "s" else count(value) + " el"


__all__ = [
    "NOISE",
    "bandwidth",
    "cost",
    "count",
    "flop_rate",
    "flops",
    "nbytes",
    "number",
    "params",
    "rate",
    "seconds",
]
