"""benchmarks/hf_full_size.py: the child-process measurement, the report reading and the quick
versions of the issue's commands."""

import importlib.util
import resource
import sys
from pathlib import Path

import pytest

from shardplan.hardware import peak_flops

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "hf_full_size.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("hf_full_size_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_child_is_measured_alone(bench):
    # the child touches 600 MB more than the parent (pytest) holds: its own peak is read, which
    # Linux floors at the parent's RSS at the fork (ru_maxrss carries it across exec)
    parent = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    grow = "x = bytearray({} * 2**20); x[::4096] = b'1' * len(x[::4096]); print('ok')"
    run = bench.measure([sys.executable, "-c", grow.format(round(parent) + 600)], timeout=60)
    assert run["returncode"] == 0 and run["stdout"].strip() == "ok"
    assert parent + 600 <= run["peak_rss_mb"] < parent + 800
    assert run["cpu_s"] > 0 and run["wall_s"] >= run["cpu_s"] * 0.5


def test_a_child_over_the_timeout_is_killed_and_reported(bench):
    run = bench.measure([sys.executable, "-c", "import time; time.sleep(30)"], timeout=1)
    assert run["timed_out"] and run["returncode"] != 0
    assert bench._process(run)["error"] == "timed out"


def test_tflops_are_read_from_the_training_report(bench):
    report = "│ model FLOP/s per device         │ 149 TFLOP/s (47.9% of peak)  │\n"
    assert bench.tflops_per_device(report) == 149.0
    assert bench.tflops_per_device("│ model FLOP/s per device │ 1.2 PFLOP/s │") == 1200.0
    assert bench.tflops_per_device("no report") is None


def test_quick_keeps_the_command_and_cuts_the_sizes(bench):
    args = bench.quick(bench.PLANS["llama3-405b"])
    assert args[:2] == ["plan", "llama3-405b"] and "--machine" in args and "h100" in args
    assert args.count("--mesh") == 1 and args[args.index("--mesh") + 1] == "2x8"
    assert args[args.index("--layers") + 1] == "2"


def test_the_405b_command_at_two_layers_returns_a_plan_with_tflops(bench):
    row = bench.plan_row("llama3-405b", bench.quick(bench.PLANS["llama3-405b"]), timeout=300)
    assert row["exit_code"] == 0 and "error" not in row
    assert row["plan_title"].startswith("llama3-405b on mesh 2x8")
    assert 0 < row["tflops_per_gpu"] * 1e12 < peak_flops("h100", "bf16")
    assert row["imports"] == [] and row["peak_rss_mb"] > 0
