"""The JAX exporter: layouts become PartitionSpecs over one mesh axis per round, checked."""

from __future__ import annotations

import pytest

jax = pytest.importorskip("jax")

from shardplan import zoo  # noqa: E402
from shardplan.errors import BackendError  # noqa: E402
from shardplan.exporters import jax as xj  # noqa: E402
from shardplan.sharding import PARTIAL, REPLICATED  # noqa: E402

R, P = REPLICATED, PARTIAL


def test_partition_spec_groups_rounds_per_tensor_dim():
    from jax.sharding import PartitionSpec

    assert xj.axis_names("2x4") == ("r0", "r1", "r2")
    assert xj.partition_spec((0, 0, 0), 2) == PartitionSpec(("r0", "r1", "r2"), None)
    assert xj.partition_spec((1, R, 0), 2) == PartitionSpec(("r2",), ("r0",))
    assert xj.partition_spec((P, R), 1) == PartitionSpec(None)
    assert xj.partition_spec((0, 1), 3, "6") == PartitionSpec(("r0",), ("r1",), None)
    with pytest.raises(BackendError, match="rank"):
        xj.partition_spec((2,), 2)


def test_shardings_for_checks_layouts(devices8):
    g = zoo.build("mlp", small=True)
    mesh = xj.jax_mesh("2x4")
    assert mesh.axis_names == ("r0", "r1", "r2") and mesh.devices.shape == (2, 2, 2)
    assert [d.id for d in mesh.devices.flat] == list(range(8))
    sh = xj.shardings_for(g, "2x4", {"fc0.weight": (R, 0, 1)})
    assert sh["fc0.weight"].spec == xj.partition_spec((R, 0, 1), 2)
    with pytest.raises(BackendError, match="fc0.weight.*3 rounds"):
        xj.shardings_for(g, "2x4", {"fc0.weight": (0, 0)})
    with pytest.raises(BackendError, match="labels.*not divisible"):
        xj.shardings_for(zoo.build("mlp", small=True, batch=4), "8", {"labels": (0, 0, 0)})
    with pytest.raises(BackendError, match="nope"):
        xj.shardings_for(g, "8", {"nope": (0, 0, 0)})


def test_too_few_devices_is_a_clear_error():
    with pytest.raises(BackendError, match="XLA_FLAGS"):
        xj.jax_mesh("64")
