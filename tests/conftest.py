"""Shared test setup: JAX runs on 8 fake CPU devices.

XLA reads XLA_FLAGS when its CPU backend is first initialised (the first `jax.devices()` call),
so the flag is set here, at conftest import time, before any test touches jax. If jax was
initialised with fewer devices anyway, the tests that need 8 skip (fixture `devices8`) instead of
failing.
"""

from __future__ import annotations

import os

import pytest

DEVICES = 8
_FLAG = f"--xla_force_host_platform_device_count={DEVICES}"

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} {_FLAG}".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

try:  # hypothesis profiles (registered here, before the plugin reads --hypothesis-profile)
    from hypothesis import HealthCheck, settings

    _slow = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    # CI: fixed examples (derandomize), few enough that tests/properties stays within ~60 s
    settings.register_profile(
        "ci", derandomize=True, deadline=None, max_examples=25, suppress_health_check=_slow
    )
    # local: `pytest tests/properties --hypothesis-profile=long` (>= 20,000 examples in all)
    settings.register_profile(
        "long", derandomize=False, deadline=None, max_examples=2500, suppress_health_check=_slow
    )
    # soak: the training-planner suites' long run in chunks (issue 28: >= 20,000 examples over
    # test_training.py and test_step_vs_recipes.py; tests/properties/soak.py drives it with a
    # fresh --hypothesis-seed per chunk); not for test_parallelize
    _chunk = int(os.environ.get("SHARDPLAN_SOAK_EXAMPLES", "10000"))
    settings.register_profile("soak", settings.get_profile("long"), max_examples=_chunk)
    settings.load_profile("ci")
except ImportError:  # pragma: no cover - hypothesis is a test extra
    pass


@pytest.fixture(scope="session")
def devices8() -> int:
    jax = pytest.importorskip("jax")
    count = jax.device_count()
    if count < DEVICES:
        pytest.skip(
            f"JAX sees {count} device(s), need {DEVICES}: either jax's CPU backend was "
            f"initialised before tests/conftest.py set XLA_FLAGS={_FLAG}, or XLA_FLAGS already "
            f"asks for fewer devices; export XLA_FLAGS={_FLAG} before pytest"
        )
    return count


@pytest.fixture(autouse=True)
def _torch_default_dtype_unchanged():
    """A test (or the engine it calls in-process) must not leave torch's default dtype changed:
    a leaked float64 doubles every byte count the torch importer reads in later tests."""
    import sys

    torch = sys.modules.get("torch")
    before = torch.get_default_dtype() if torch is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is not None and before is not None and torch.get_default_dtype() != before:
        leaked = torch.get_default_dtype()
        torch.set_default_dtype(before)
        pytest.fail(f"the test left torch's default dtype at {leaked} (was {before})")
