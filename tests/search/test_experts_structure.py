"""The megatron expert recognises norms, attention and MLP blocks from structure, never names
(issue 27): a hand-written RMSNorm (pow, mean, rsqrt, mul) stays replicated, the SwiGLU MLP is
column (gate, up) then row (down), and PyTorch's TP styles accept the plan. Op names here are
deliberately meaningless."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import shardplan
from shardplan.exporters.torch_tp import torch_tp_styles
from shardplan.ir.graph import GraphBuilder
from shardplan.search.experts import megatron, paired_columns

B, S, W, H = 4, 8, 16, 64


def _block() -> shardplan.Graph:
    """x -> rmsnorm -> (gate, up) -> silu * up -> down -> + x, all from elementary ops."""
    b = GraphBuilder("hand")
    x = b.input("x", (B, S, W))
    sq = b.apply("mul", x, x, name="o1")
    mean = b.apply("reduce_mean", sq, axes=(2,), keepdims=True, name="o2")
    inv = b.apply("rsqrt", mean, name="o3")
    normed = b.apply("mul", x, inv, name="o4")
    scaled = b.apply("mul", normed, b.param("p1", (W,)), name="o5")
    gate = b.apply("linear", scaled, b.param("p2", (H, W)), name="o6")
    up = b.apply("linear", scaled, b.param("p3", (H, W)), name="o7")
    act = b.apply("mul", b.apply("silu", gate, name="o8"), up, name="o9")
    down = b.apply("linear", act, b.param("p4", (W, H)), name="o10")
    out = b.apply("add", down, x, name="o11")
    b.apply("reduce_mean", out, axes=(0, 1, 2), name="o12")
    return b.build()


def test_the_hand_written_block_is_megatrons_pattern():
    g = _block()
    assert paired_columns(g) == {"o6", "o7"}  # gate and up pair with down; nothing else
    s = megatron(g, shardplan.parse_mesh("4"))
    assert s["o6"] == ("n", "n") and s["o7"] == ("n", "n")  # column-parallel
    assert s["o10"] == ("k", "k")  # row-parallel
    for norm_op in ("o1", "o2", "o3", "o4", "o5"):
        assert s[norm_op] == (None, None), norm_op  # the norm is not split through


def test_a_residual_partner_or_statistics_stop_the_column_split():
    b = GraphBuilder("stem")
    x = b.input("x", (B, S, W))
    h = b.apply("linear", x, b.param("p1", (W, W)), name="o1")  # feeds a norm, not a row op
    sq = b.apply("mul", h, h, name="o2")
    b.apply("reduce_mean", b.apply("reduce_mean", sq, axes=(2,), name="o3"), axes=(0, 1), name="o4")
    assert paired_columns(b.build()) == frozenset()


def test_the_user_model_megatron_plan_is_accepted_by_torch_tp():
    pytest.importorskip("torch")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torch"))
    from user_model import build

    module, args = build()
    p = shardplan.plan(shardplan.from_torch(module, args), "2x2", "megatron")
    styles = torch_tp_styles(p)
    assert styles == {
        f"blocks.{i}.mlp.{m}": style
        for i in range(2)
        for m, style in (("gate", "colwise"), ("up", "colwise"), ("down", "rowwise"))
    }
    norms = [t for t in p.graph.parameters if t.name.endswith(("n1.weight", "n2.weight"))]
    layouts = p.tensor_layouts()
    assert norms and all(layouts[t.name][-1] < 0 for t in norms)  # RMSNorm weights whole


@pytest.mark.parametrize(
    ("model", "mesh_text"), [("gpt3", "4x8"), ("llama3-8b", "2x2x4"), ("resnet50", "3x4")]
)
def test_plans_sharing_one_data_parallel_walk_equal_plans_walking_their_own(model, mesh_text):
    from shardplan import zoo
    from shardplan.mesh import parse_mesh
    from shardplan.search.experts import context_parallel, data_parallel, op_classes
    from shardplan.search.step.profiles import stage_tensor_degrees

    sizes = dict(zoo.MODELS[model].small) if zoo.MODELS[model].small else {}
    graph = zoo.build(model, **sizes)
    mesh = parse_mesh(mesh_text)
    classes = op_classes(graph)
    data = data_parallel(graph, mesh, classes)
    assert data == data_parallel(graph, mesh)
    degrees = stage_tensor_degrees(mesh)
    assert degrees
    for t in degrees:
        shared = megatron(graph, mesh, t, classes, data)
        assert shared == megatron(graph, mesh, t)
        rounds = [0]
        assert context_parallel(graph, mesh, shared, rounds, classes) == context_parallel(
            graph, mesh, shared, rounds
        )
