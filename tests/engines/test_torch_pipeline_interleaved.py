"""The interleaved schedule and sequence parallelism on torch.distributed.pipelining: Megatron's
recipe for small GPT-2 on 2x2 (pipeline 2 with 2 model chunks per device, tensor 2 with sequence
parallelism, 4 micro-batches) on 4 gloo processes (ScheduleInterleaved1F1B), loss and every
gradient equal to the single-process run in float64. One run (process start-up dominates)."""

import pytest

pytest.importorskip("torch")

from shardplan import zoo  # noqa: E402
from shardplan.cost import CostOptions  # noqa: E402
from shardplan.cost.sequence import sequence_parallel_strategies  # noqa: E402
from shardplan.engines.torch_pipeline import run_pipeline  # noqa: E402
from shardplan.mesh import parse_mesh  # noqa: E402
from shardplan.search.step.recipes import megatron_recipe  # noqa: E402


def test_interleaved_sequence_parallel_plan_matches_one_process():
    tp = megatron_recipe(
        lambda b: zoo.build("gpt2-small", small=True, batch=b),
        4,
        parse_mesh("2x2"),
        CostOptions.make(dtype="bf16"),
        tensor=2,
        pipeline=2,
        recompute="selective",
        sequence_parallel=True,
        virtual_stages=2,
    )
    assert tp.virtual_stages == 2 and len(tp.stages) == 4 and tp.sequence_parallel
    # the run executes the sequence-parallel layout: norms and residual adds split in the
    # tensor-parallel round where the stored Megatron plan leaves them whole
    split = [
        name
        for s in tp.stages
        for name, cut in sequence_parallel_strategies(
            s.plan.graph, s.plan.mesh, s.plan.strategies
        ).items()
        if cut != s.plan.strategies[name]
    ]
    assert any("ln" in n for n in split) and any("residual" in n for n in split)
    report = run_pipeline(tp)
    assert report.world_size == 4 and report.micro_batches == 4 and report.stages == 2
    assert report.failed == ()
    assert report.loss == pytest.approx(report.reference_loss, rel=1e-9)
    assert report.grads_checked == len(zoo.build("gpt2-small", small=True).parameters)
    assert report.worst_grad_ratio <= 1.0
