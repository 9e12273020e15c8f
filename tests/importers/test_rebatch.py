"""An imported graph at another batch size derived from two traces (importers/rebatch.py):
equal to a direct trace for every published config, refused when the two do not determine it."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardplan.importers._build import ImportResult
from shardplan.importers.rebatch import rebatch
from shardplan.ir.graph import GraphBuilder
from shardplan.zoo import build

HF = Path(__file__).resolve().parents[1] / "data" / "hf"


def _same(a, b):
    assert list(a.tensors.items()) == list(b.tensors.items())
    assert a.ops == b.ops  # names, kinds, signatures, operands, FLOPs, attributes, layers
    assert a.flops == b.flops and a.num_params == b.num_params


@pytest.mark.parametrize(
    "name", ["llama", "moe-llm", "mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3"]
)
def test_zoo_graphs_at_two_batches_give_the_third(name):
    two, four = (ImportResult(build(name, small=True, batch=b)) for b in (2, 4))
    for batch in (1, 3, 6, 16):
        derived = rebatch((4, four), (2, two), batch)
        assert derived is not None, batch
        _same(derived.graph, build(name, small=True, batch=batch))


def _offset_graph(batch: int):
    b = GraphBuilder("offset")
    x = b.input("x", (batch + 1, 4))  # a dim that is not proportional to the batch
    b.apply("relu", x, name="r")
    return ImportResult(b.build())


def _named_graph(batch: int):
    b = GraphBuilder("named")
    x = b.input(f"x_{batch}", (batch, 4))  # a tensor name that holds the batch
    b.apply("relu", x, name="r")
    return ImportResult(b.build())


def test_what_two_imports_do_not_determine_is_refused():
    assert rebatch((3, _offset_graph(3)), (5, _offset_graph(5)), 7) is None
    small, other = (ImportResult(build("llama", small=True, batch=2, layers=n)) for n in (1, 2))
    assert rebatch((2, small), (4, other), 8) is None  # another structure
    two, four = (ImportResult(build("llama", small=True, batch=b)) for b in (2, 4))
    assert rebatch((2, two), (4, four), 3) is not None
    assert rebatch((2, two), (2, two), 3) is None  # one batch determines nothing
    assert rebatch((2, _named_graph(2)), (4, _named_graph(4)), 8) is None  # names differ
    # proportional sizes that are not whole at the new batch: seq 16 at batch 2, 32 at batch 4
    long = ImportResult(build("llama", small=True, batch=4, seq=32))
    assert rebatch((2, two), (4, long), 3) is None


@pytest.mark.parametrize(("name", "layers"), [("llama3-8b", 1), ("mixtral-8x7b", 1),
                                               ("deepseek-v3", 4), ("qwen3-235b-a22b", 1)])
def test_published_configs_derive_what_a_trace_gives(name, layers, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import shardplan.importers.torch as torch_importer
    from shardplan.importers.hf_config import hf_importer

    direct = hf_importer(HF / name, seq=8, layers=layers, retrace=True)
    expected = {b: direct(b).graph for b in (3, 8)}
    traces = []
    real = torch_importer.import_torch

    def counted(*args, **kwargs):
        traces.append(args[1][0].shape[0] if args[1] else kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(torch_importer, "import_torch", counted)
    importer = hf_importer(HF / name, seq=8, layers=layers)
    importer(4), importer(2)
    for batch, graph in expected.items():
        _same(importer(batch).graph, graph)
    assert len(traces) == 2  # batches 3 and 8 were derived, not traced
    importer(1)
    assert len(traces) == 3  # batch 1 is always traced (torch.export specialises size 1)
