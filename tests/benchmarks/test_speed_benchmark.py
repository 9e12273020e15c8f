"""benchmarks/speed.py: its reading of the exact methods' outcomes and the GPT-2 xl section."""

import importlib.util
from pathlib import Path

import pytest

from shardplan import zoo
from shardplan.errors import SolverError
from shardplan.mesh import parse_mesh
from shardplan.search import plan

SPEED = Path(__file__).resolve().parents[2] / "benchmarks" / "speed.py"


@pytest.fixture(scope="module")
def speed():
    spec = importlib.util.spec_from_file_location("speed_benchmark", SPEED)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("method", ["ilp", "dp"])
def test_a_run_cut_by_the_limit_is_a_lower_bound_with_its_phase(speed, method):
    r = speed.run(zoo.build("mlp"), parse_mesh("2x8"), method, 1e-9)
    assert speed.outcome(r) == "timeout"
    assert speed.stop_phase(r["status"]) == "enumerating strategies"
    assert speed.versus_drec(r, 1e-10, 1e-9).startswith(">= ")
    assert "cost tables alone" in speed.xl_verdict(method, r, 1e-10, 1e-9)


def test_a_refused_run_gets_no_time_ratio(speed):
    with pytest.raises(SolverError) as e:
        plan(zoo.build("mlp"), "2x8", "ilp", time_limit=10, max_strategies=1)
    r = {"ok": False, "seconds": 0.1, "status": str(e.value)}
    assert speed.outcome(r) == "refused"
    assert speed.stop_phase(r["status"]).startswith("the strategy space of 'mlp'")
    assert speed.versus_drec(r, 0.01, 10) == "-"
    assert "no time ratio" in speed.xl_verdict("ilp", r, 0.01, 10)


def test_an_ilp_stopped_at_the_limit_reports_its_incumbent(speed):
    r = {"ok": True, "seconds": 601.0, "status": "time-limit (gap 5.00%)", "cost_over_drec": 1.2}
    assert speed.outcome(r) == "time-limit"
    assert speed.versus_drec(r, 3.0, 600.0) == ">= 200x"
    verdict = speed.xl_verdict("ilp", r, 3.0, 600.0)
    assert "(lower bound)" in verdict and "1.2x D-Rec's" in verdict


def test_xl_section_runs_every_method_and_the_layer_ladder(speed):
    xl = speed.xl_section(30.0, (1,), mesh_text="2", small=True)
    assert xl["layers"] == 2 and xl["ladder"][0]["layers"] == 1
    assert all(xl["row"][m]["ok"] for m in speed.METHODS)
    assert xl["vs_drec"]["ilp"].endswith("x") and not xl["vs_drec"]["ilp"].startswith(">=")
    md = speed.xl_markdown(xl)
    assert "| ilp |" in md and "**ILP:" in md and "| 1 |" in md
