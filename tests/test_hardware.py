"""Machines: the presets and a user's own machine (values, JSON, planning, printing)."""

import json

import pytest

import shardplan as sp
from shardplan.cli.main import main
from shardplan.errors import MeshError
from shardplan.exporters.plan_json import from_json, to_json
from shardplan.hardware import MACHINES, Machine

MINE = Machine.make(
    "gh200-4",
    intra_node="900GB/s",
    inter_node="50 GB/s",
    memory="141GB",
    flops={"bf16": "989T"},
    devices_per_node=4,
)


def test_make_reads_human_figures():
    assert MINE.intra_node_bytes_per_s == 900e9 and MINE.inter_node_bytes_per_s == 50e9
    assert MINE.memory_bytes == 141e9 and MINE.flops_per_s == 989e12
    assert MINE.devices_per_node == 4 and Machine.from_dict(MINE.to_dict()) == MINE
    for name, preset in MACHINES.items():
        assert Machine.from_dict(preset.to_dict()) == preset, name


@pytest.mark.parametrize(
    "bad, said",
    [
        ({"intra_node": "fast"}, "is not a rate"),
        ({"memory": -1}, "memory"),
        ({"devices_per_node": 0}, "devices_per_node must be >= 1"),
        ({"flops": {"bf16": 0}}, "positive"),
    ],
)
def test_bad_machines_are_mesh_errors(bad, said):
    kw = dict(intra_node=1e9, inter_node=1e9, memory="1GB", flops=1e12) | bad
    with pytest.raises(MeshError, match=said):
        Machine.make("x", **kw)


def test_a_user_machine_prices_plans_with_its_links_and_travels_in_the_plan_json():
    g = sp.zoo.build("gpt2-small", small=True, batch=16)
    p = sp.plan(g, "2x4", machine=MINE)
    assert p.mesh.hardware is MINE and p.mesh.bandwidth_bytes_per_s == (50e9, 900e9)
    assert p.mesh.flops_per_s == 989e12
    back = from_json(to_json(p))
    assert back.mesh.hardware == MINE and back.cost == p.cost
    a100 = sp.plan(g, "2x4")
    assert a100.cost.total != p.cost.total  # other links, other FLOP rate


def test_the_cli_takes_a_machine_file_and_prints_its_name_and_links(tmp_path, capsys):
    f = tmp_path / "mine.json"
    f.write_text(json.dumps(MINE.to_dict()))
    assert main(["plan", "gpt2-small", "--small", "--mesh", "2x4", "--machine", str(f)]) == 0
    out = capsys.readouterr().out
    assert "gh200-4 (4 per node, 141 GB): node 50 GB/s, gpu 900 GB/s" in out
    f.write_text('{"name": "x"}')
    with pytest.raises(SystemExit):  # argparse: not a machine
        main(["plan", "gpt2-small", "--small", "--mesh", "2x4", "--machine", str(f)])
    assert "missing field 'intra_node_bytes_per_s'" in capsys.readouterr().err
