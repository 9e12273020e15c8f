"""`parallelize` set-up on a fake 4-rank process group (one process, no messages): parameter names,
placements, the mesh choice (user axes or rounds) and the errors. Values are not checked here
(a fake group does not communicate); `test_parallelize.py` checks them on 4 gloo processes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from shardplan import Plan, from_torch  # noqa: E402
from shardplan import plan as make_plan  # noqa: E402
from shardplan.errors import PlanError  # noqa: E402
from shardplan.torch import parallelize  # noqa: E402


@pytest.fixture
def fake_world():
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    yield
    dist.destroy_process_group()


def mlp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    return model, (torch.randn(8, 16),)


def test_names_and_placements_follow_the_plan(fake_world):
    from torch.distributed.tensor import DTensor

    model, args = mlp()
    keys = list(model.state_dict())
    p = make_plan(from_torch(model, args), "2x2", "megatron")
    out = parallelize(model, args, plan=p)
    assert out is model and list(model.state_dict()) == keys
    info = model.shardplan
    assert not info.per_round and info.device_mesh.mesh_dim_names == ("node", "gpu")
    weight = model[0].weight
    assert isinstance(weight, DTensor) and isinstance(weight, torch.nn.Parameter)
    assert tuple(str(x) for x in weight.placements) != ("R", "R")
    assert model(*args).shape == (8, 8)


def test_a_plan_not_expressible_on_the_axes_gets_a_round_mesh(fake_world):
    model, args = mlp()
    graph = from_torch(model, args)
    dp = make_plan(graph, "4", "data-parallel").strategies
    tp = make_plan(graph, "4", "megatron").strategies
    mixed = Plan(graph, make_plan(graph, "4", "megatron").mesh,
                 {n: (dp[n][0], tp[n][1]) for n in dp}, "mixed")  # fmt: skip
    parallelize(model, args, plan=mixed)
    info = model.shardplan
    assert info.per_round and info.device_mesh.mesh_dim_names == ("r0", "r1")


def test_plan_of_another_graph_and_wrong_world_are_plan_errors(fake_world):
    model, args = mlp()
    other = make_plan(from_torch(model, (torch.randn(4, 16),)), "2x2")
    with pytest.raises(PlanError, match="another graph"):
        parallelize(model, args, plan=other)
    with pytest.raises(PlanError, match="2 devices but the process group has 4"):
        parallelize(model, args, mesh="2")
    with pytest.raises(PlanError, match="plan options"):
        parallelize(model, args, plan=other, method="drec")


def test_other_input_shapes_are_a_plan_error(fake_world):
    model, args = mlp()
    parallelize(model, args, mesh="2x2")
    with pytest.raises(PlanError, match="parallelize again"):
        model(torch.randn(4, 16))


def test_a_plan_that_splits_nothing_warns(fake_world):
    from shardplan.errors import NothingSplitWarning

    model, args = mlp()
    graph = from_torch(model, args)
    p = make_plan(graph, "2x2", "drec")  # a tiny model: D-Rec keeps every op whole
    with pytest.warns(NothingSplitWarning, match=r"parallelize: .*(nothing|no parameter)"):
        parallelize(model, args, plan=p)
