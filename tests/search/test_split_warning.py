"""Loud when nothing is split (issue 27): `split_warning` names unused axes (no op, or only ops
carrying under 1% of the FLOPs, split across them) and plans that shard no parameter, says why
and how to get a split; `warn_if_nothing_split` raises it as a NothingSplitWarning."""

from __future__ import annotations

import pytest

import shardplan
from shardplan import zoo
from shardplan.errors import NothingSplitWarning
from shardplan.search.api import ADVICE, split_warning, warn_if_nothing_split


def test_a_replicated_plan_says_nothing_was_split_why_and_how():
    p = shardplan.plan(zoo.build("gpt2-small", small=True), "2x4")
    message = split_warning(p)
    assert message is not None and message.startswith("nothing was split")
    assert "all 8 devices of mesh 2x4" in message and "costs more time than it saves" in message
    assert ADVICE in message and "--memory" in message and "--method" in message


def test_an_unused_axis_is_named_and_a_size_one_axis_is_not():
    g = zoo.build("mlp", small=True, batch=2)  # the batch fills the 2-way axis only
    p = shardplan.plan(g, "2x4x1", method="data-parallel")
    message = split_warning(p)
    assert message is not None and message.startswith("mesh axis 'axis1' (4-way) unused")
    assert "'axis2'" not in message and "recipe names" in message


def test_a_plan_that_splits_real_work_and_shards_parameters_is_quiet():
    p = shardplan.plan(zoo.build("gpt2-small", small=True), "4", method="megatron")
    assert split_warning(p) is None


def test_no_sharded_parameter_is_said_unless_data_parallel_was_asked():
    g = zoo.build("gpt2-small", small=True, batch=64, seq=64, hidden=256)
    p = shardplan.plan(g, "8")  # D-Rec splits the batch here and keeps the weights whole
    if all(all(c is None or c == s[0] for c in s) for s in p.strategies.values()):
        message = split_warning(p)
        assert message is None or "no parameter is sharded" in message
    assert split_warning(shardplan.plan(g, "8", method="data-parallel")) is None


def test_the_warning_is_a_user_warning_subclass():
    p = shardplan.plan(zoo.build("gpt2-small", small=True), "8")
    with pytest.warns(NothingSplitWarning, match="parallelize: nothing was split"):
        warn_if_nothing_split(p, "parallelize")
    assert issubclass(NothingSplitWarning, UserWarning)


def test_repr_is_one_short_line_and_summary_reads_the_axes():
    p = shardplan.plan(zoo.build("gpt2-small", small=True), "2x4x1", method="megatron")
    assert len(repr(p)) < 200 and "\n" not in repr(p)
    assert repr(p).startswith("Plan('gpt2-small' on mesh 2x4x1, method 'megatron'")
    text = p.summary()
    assert "axis2 axis (1, 300 GB/s): unused (size 1)" in text
    assert "axis1 axis (4, 300 GB/s):" in text and "per step" in text


def test_a_training_stage_whose_zero_splits_the_state_is_not_told_to_shard_its_parameters():
    from shardplan.cost import CostOptions
    from shardplan.mesh import parse_mesh
    from shardplan.plans import Plan
    from shardplan.search.experts import data_parallel

    g = zoo.build("gpt2-small", small=True, batch=64, seq=64, hidden=256)
    mesh = parse_mesh("8")
    whole = Plan(g, mesh, data_parallel(g, mesh), "drec", CostOptions())  # weights kept whole
    message = split_warning(whole)
    assert message is not None and message.startswith("no parameter is sharded")
    assert split_warning(whole, state_sharded=True) is None  # ZeRO already splits the state
