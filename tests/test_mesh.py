"""The device mesh: parsing, prime rounds, bandwidths, memory sizes (shardplan.mesh)."""

from __future__ import annotations

import math

import pytest

from shardplan.errors import MeshError
from shardplan.hardware import MACHINES
from shardplan.mesh import Mesh, parse_bytes, parse_mesh

A100 = MACHINES["a100"]
INTER, INTRA = A100.inter_node_bytes_per_s, A100.intra_node_bytes_per_s


@pytest.mark.parametrize(
    ("text", "shape", "qs", "axes"),
    [
        ("8", (8,), (2, 2, 2), (0, 0, 0)),
        ("2x8", (2, 8), (2, 2, 2, 2), (0, 1, 1, 1)),
        ("4x8", (4, 8), (2, 2, 2, 2, 2), (0, 0, 1, 1, 1)),
        ("6", (6,), (2, 3), (0, 0)),
        ("3x4", (3, 4), (3, 2, 2), (0, 1, 1)),
        ("12", (12,), (2, 2, 3), (0, 0, 0)),
        ("1", (1,), (), ()),
        ("1x8", (1, 8), (2, 2, 2), (1, 1, 1)),
        ("4X8", (4, 8), (2, 2, 2, 2, 2), (0, 0, 1, 1, 1)),
        ("4×8", (4, 8), (2, 2, 2, 2, 2), (0, 0, 1, 1, 1)),
        (" 2 x 4 ", (2, 4), (2, 2, 2), (0, 1, 1)),
        (8, (8,), (2, 2, 2), (0, 0, 0)),
    ],
)
def test_parse_mesh_rounds(text, shape, qs, axes):
    mesh = parse_mesh(text)
    assert mesh.shape == shape
    assert tuple(r.q for r in mesh.rounds) == qs
    assert tuple(r.mesh_axis for r in mesh.rounds) == axes
    assert tuple(r.index for r in mesh.rounds) == tuple(range(len(qs)))
    assert mesh.size == math.prod(shape) == math.prod(qs)


def test_mesh_size_and_text():
    mesh = parse_mesh("4x8")
    assert mesh.size == 32
    assert mesh.text() == "4x8"
    assert mesh.names == ("node", "gpu")
    assert parse_mesh("8").names == ("dev",)
    assert parse_mesh("2x2x2").names == ("axis0", "axis1", "axis2")


@pytest.mark.parametrize(
    ("text", "bandwidths"),
    [
        ("8", (INTRA,)),
        ("16", (INTER,)),
        ("2x8", (INTER, INTRA)),
        ("4x8", (INTER, INTRA)),
        ("3x4", (INTER, INTRA)),
        ("2x16", (INTER, INTER)),
        # row-major layout (issue 27): inner axes stay in a node while their product divides it
        ("2x4", (INTRA, INTRA)),
        ("2x4x1", (INTRA, INTRA, INTRA)),
        ("1x8", (INTRA, INTRA)),
        ("4x16", (INTER, INTER)),
        ("4x2x4", (INTER, INTRA, INTRA)),
        ("6", (INTRA,)),  # a mesh that fits in one node is intra-node on every axis
        ("2x3", (INTRA, INTRA)),
        ("2x3x2", (INTER, INTER, INTRA)),  # 3 x 2 = 6 does not tile an 8-GPU node
    ],
)
def test_round_bandwidth_comes_from_its_axis(text, bandwidths):
    mesh = parse_mesh(text)
    assert mesh.bandwidth_bytes_per_s == bandwidths
    for r in mesh.rounds:
        assert r.bandwidth_bytes_per_s == bandwidths[r.mesh_axis]
        assert r.axis_name == mesh.names[r.mesh_axis]


def test_machine_presets_set_links_and_flops():
    mesh = parse_mesh("2x8", machine="h100", memory_bytes=80e9)
    h100 = MACHINES["h100"]
    assert mesh.bandwidth_bytes_per_s == (h100.inter_node_bytes_per_s,
                                          h100.intra_node_bytes_per_s)
    assert mesh.flops_per_s == h100.flops_per_s
    assert mesh.memory_bytes == 80e9
    assert mesh.with_memory(None).memory_bytes is None


def test_parse_mesh_passes_a_mesh_through():
    mesh = Mesh((2, 4), ("a", "b"), (1e9, 2e9))
    assert parse_mesh(mesh) is mesh


def test_explicit_mesh_round_bandwidths():
    mesh = Mesh((2, 4), ("a", "b"), (1e9, 2e9))
    assert [(r.q, r.axis_name, r.bandwidth_bytes_per_s) for r in mesh.rounds] == [
        (2, "a", 1e9), (2, "b", 2e9), (2, "b", 2e9)]


def test_dict_round_trip():
    mesh = parse_mesh("3x4", machine="ascend910", memory_bytes=32e9)
    assert Mesh.from_dict(mesh.to_dict()) == mesh


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "cannot parse mesh ''"),
        ("abc", "cannot parse mesh 'abc'"),
        ("8x", "cannot parse mesh '8x'"),
        ("-2", "cannot parse mesh '-2'"),
        ("2.5", "cannot parse mesh '2.5'"),
        ("x8", "cannot parse mesh 'x8'"),
        ("2*4", "cannot parse mesh '2\\*4'; write axis sizes joined by 'x'"),
        ("2,4", "cannot parse mesh '2,4'; write axis sizes joined by 'x'"),
        ("0", "mesh '0': every axis size must be >= 1"),
        ("2x0", "mesh '2x0': every axis size must be >= 1"),
    ],
)
def test_bad_mesh_text(text, match):
    with pytest.raises(MeshError, match=match):
        parse_mesh(text)


def test_bad_mesh_parameters():
    with pytest.raises(MeshError, match="unknown machine 'tpu'"):
        parse_mesh("8", machine="tpu")
    with pytest.raises(MeshError, match="at least one axis"):
        Mesh(())
    with pytest.raises(MeshError, match="must be unique"):
        Mesh((2, 2), ("a", "a"))
    with pytest.raises(MeshError, match="one positive bandwidth per mesh axis"):
        Mesh((2, 8), bandwidth_bytes_per_s=(1e9,))
    with pytest.raises(MeshError, match="per-device memory must be positive"):
        parse_mesh("8", memory_bytes=0)
    with pytest.raises(MeshError, match="FLOP rate must be positive"):
        Mesh((8,), flops_per_s=0)
    with pytest.raises(MeshError, match="is malformed"):
        Mesh.from_dict({"shape": [8]})


def test_mesh_with_unknown_machine_is_a_mesh_error():
    with pytest.raises(MeshError, match="nope"):
        Mesh((8,), machine="nope")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("80GB", 80e9),
        ("16GiB", 16 * 2**30),
        ("512MB", 512e6),
        ("1.5TB", 1.5e12),
        ("64 KiB", 64 * 2**10),
        ("80gb", 80e9),
        ("4G", 4e9),
        ("100B", 100.0),
        (2e9, 2e9),
        (123, 123.0),
    ],
)
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "GB", "-1GB", "80XB", "eighty", "nanGB"])
def test_bad_byte_sizes(text):
    with pytest.raises(MeshError, match=f"cannot parse memory size '{text}'"):
        parse_bytes(text)


def test_size_one_axes_cost_nothing_and_meshes_in_one_node_plan_alike():
    """Issue 27: `2x4x1` plans and costs as `2x4`, `1x8` as `8` (a size-1 axis has no rounds and
    does not move the other axes off the node's links)."""
    import shardplan
    from shardplan import zoo

    g = zoo.build("gpt2-small", small=True, batch=64, seq=64, hidden=256)  # large enough to split
    for a, b in (("2x4x1", "2x4"), ("1x8", "8")):
        pa, pb = shardplan.plan(g, a), shardplan.plan(g, b)
        assert [r.bandwidth_bytes_per_s for r in parse_mesh(a).rounds] == [
            r.bandwidth_bytes_per_s for r in parse_mesh(b).rounds
        ]
        assert dict(pa.strategies) == dict(pb.strategies)
        assert pa.cost.total == pb.cost.total
        assert any(c is not None for s in pa.strategies.values() for c in s)
