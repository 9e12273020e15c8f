"""Problem: the one canonicalisation gate (mesh text + machine, budget, cost options)."""

import pytest

from shardplan import zoo
from shardplan.errors import ArgumentError, MeshError
from shardplan.hardware import DEFAULT_MACHINE, MACHINES
from shardplan.mesh import parse_mesh
from shardplan.problem import Problem

G = zoo.build("mlp", small=True)


def test_mesh_text_gets_the_named_or_the_default_machine():
    assert Problem.make(G, "2x8").mesh.machine == DEFAULT_MACHINE == "a100"
    h100 = Problem.make(G, "2x8", machine="h100")
    assert h100.mesh.machine == "h100" and h100.hardware is MACHINES["h100"]
    assert h100.mesh.flops_per_s == 989e12  # the h100 preset's bf16 rate, not the a100's


def test_a_mesh_keeps_its_machine_and_a_conflicting_one_is_an_error():
    mesh = parse_mesh("8", "ascend910")
    assert Problem.make(G, mesh).mesh is mesh
    assert Problem.make(G, mesh, machine="ascend910").mesh is mesh
    with pytest.raises(MeshError, match="'h100' given for a Mesh built for 'ascend910'"):
        Problem.make(G, mesh, machine="h100")


def test_budget_has_one_home():
    assert Problem.make(G, "8").budget is None
    assert Problem.make(G, "8", memory="16GB").budget == 16e9
    assert Problem.make(G, parse_mesh("8", memory_bytes=5e9)).budget == 5e9
    with pytest.raises(MeshError, match="cannot parse memory"):
        Problem.make(G, "8", memory="lots")


def test_bad_graph_and_unknown_machine_are_typed_errors():
    with pytest.raises(ArgumentError, match="graph must be a shardplan Graph"):
        Problem.make("mlp", "8")
    with pytest.raises(MeshError, match="unknown machine 'tpu'"):
        Problem.make(G, "8", machine="tpu")


def test_a_builder_needs_a_batch_and_is_built_once_at_it():
    calls = []

    def build(b):
        calls.append(b)
        return zoo.build("mlp", small=True, batch=b)

    p = Problem.make(build, "2x2", batch=8, dtype="bf16")
    assert calls == [8] and p.global_batch == 8 and p.builder() is build
    assert p.options.precision.name == "bf16"
    with pytest.raises(ArgumentError, match="needs the global batch"):
        Problem.make(build, "2x2")
    with pytest.raises(ArgumentError, match="not a shardplan Graph"):
        Problem.make(lambda b: None, "2x2", batch=8)
    with pytest.raises(ArgumentError, match="dtype"):
        Problem.make(G, "2x2", dtype="int3")


def test_a_graph_problem_builds_only_its_own_batch():
    p = Problem.make(G, "2x2")
    build = p.builder()
    assert build(p.global_batch) is G and build(p.global_batch + 1) is None
