"""The zoo's LLMs through every planning command (small sizes): plan, compare, explain."""

import json

import pytest

from shardplan.cli.main import main

SMALL = ["--small", "--batch", "8"]


@pytest.mark.parametrize(("model", "op"), [("llama3-8b", "layers.0.attn.q.linear"),
                                           ("deepseek-v3", "layers.1.experts.expert_up")])
def test_plan_compare_explain(model, op, tmp_path, capsys):
    assert main(["plan", model, *SMALL, "--mesh", "2x4", "-q", "--json",
                 str(tmp_path / "p.json")]) == 0
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["cost"]["total"] > 0
    assert main(["compare", model, *SMALL, "--mesh", "2x4", "-q", "--json",
                 str(tmp_path / "c.json")]) == 0
    rows = json.loads((tmp_path / "c.json").read_text())["rows"]
    assert rows[0]["method"] == "drec" and rows[0]["ok"]
    assert main(["explain", model, *SMALL, "--mesh", "2x4", "--op", op, "-q", "--json",
                 str(tmp_path / "e.json")]) == 0
    assert any(c.get("chosen") for c in json.loads((tmp_path / "e.json").read_text())["candidates"])
    capsys.readouterr()


def test_moe_llm_experts_are_split_over_the_expert_dim():
    import shardplan as sp
    from shardplan.exporters.plan_json import to_dict

    sizes = {"batch": 64, "seq": 256, "hidden": 512, "ffn": 1024, "expert_ffn": 1024}
    graph = sp.zoo.build("mixtral-8x7b", small=True, experts=8, **sizes)
    rows = {r["name"]: r["strategy"] for r in to_dict(sp.plan(graph, "2x4"))["ops"]}
    assert "e" in rows["layers.0.experts.expert_up"]  # expert parallelism
