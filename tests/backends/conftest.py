"""Backend tests run JAX on 8 fake CPU devices.

XLA reads XLA_FLAGS when its CPU backend is first initialised (the first `jax.devices()` call),
so the flag is set here, at conftest import time, before any test of this directory touches jax.
If another test module initialised jax earlier in the same session with fewer devices, the tests
that need 8 devices skip (fixture `devices8`) instead of failing.
"""

from __future__ import annotations

import os

import pytest

DEVICES = 8
_FLAG = f"--xla_force_host_platform_device_count={DEVICES}"

_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = f"{_flags} {_FLAG}".strip()


@pytest.fixture(scope="session")
def devices8() -> int:
    jax = pytest.importorskip("jax")
    count = jax.device_count()
    if count < DEVICES:
        pytest.skip(
            f"JAX sees {count} device(s), need {DEVICES}: either jax's CPU backend was "
            f"initialised (by an earlier test module) before tests/backends/conftest.py set "
            f"XLA_FLAGS={_FLAG}, or XLA_FLAGS already asks for fewer devices; run tests/backends "
            f"alone or export XLA_FLAGS={_FLAG} before pytest")
    return count
