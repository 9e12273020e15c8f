"""Issue 24 item 3: the training-step search is never slower than any Megatron recipe that fits.

For random small models (dense, and MoE with and without shared experts), meshes (1-D, 2-D,
3-D, factors 3, 5 and 7), batches and budgets, every Megatron
recipe — tensor degree t a product of the stage mesh's innermost rounds (any divisor of the
innermost axis the expert accepts), pipeline degree p dividing the outer axis, context or expert
parallelism over a divisor of the data-parallel ways (context parallelism at one sample per
rank, the scope the search covers: docs/scale.md), every per-rank micro-batch size,
recomputation none/selective/full, with and without sequence parallelism and the distributed
optimizer (one drawn per example) — is scored by the same step model; the
search's plan must be at least as fast as each one that fits the same budget, and must exist
when one does.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import shardplan as sp
from shardplan import zoo
from shardplan.errors import PlanError, ShardplanError
from shardplan.mesh import parse_mesh

MODELS = st.sampled_from(
    [
        ("gpt2-small", {"layers": 2}),
        ("gpt2-small", {"layers": 3, "hidden": 32}),
        ("gpt2-small", {"layers": 4, "hidden": 48}),
        ("bert-base", {"layers": 2}),
        ("mlp", {}),
        ("mixtral-8x7b", {"layers": 2}),
        ("llama", {"layers": 2}),
        ("deepseek-moe", {"layers": 2}),
        ("qwen3-235b-a22b", {"layers": 2}),
    ]
)
MESHES = st.sampled_from(
    ["4", "8", "2x2", "2x4", "4x2", "1x4", "3x2", "2x3", "2x2x2", "6", "5x2", "3x5", "2x2x3", "7"]
)
BATCHES = st.sampled_from([4, 6, 8, 10, 12, 15, 16, 24])
BUDGETS = st.one_of(st.none(), st.sampled_from([2e6, 5e6, 2e7, 1e8]))
REL = 1e-9


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def recipes(draw, mesh_text: str, batch: int):
    """One Megatron recipe's knobs on `mesh_text` (PlanErrors: knobs the model refuses)."""
    mesh = parse_mesh(mesh_text)
    t = draw(st.sampled_from(_divisors(mesh.shape[-1])))
    p = draw(st.sampled_from([p for p in _divisors(mesh.shape[0]) if mesh.size % (t * p) == 0]))
    data = mesh.size // (t * p)
    extra = draw(st.sampled_from(["none", "context", "expert"]))
    ways = draw(st.sampled_from(_divisors(data))) if extra != "none" else 1
    context = ways if extra == "context" else 1
    data //= context  # context parallelism takes its ways from the data-parallel group
    sizes = [mbs for mbs in _divisors(batch) if batch % (data * mbs) == 0]
    if context > 1:  # the search's scope (docs/scale.md): the ways one sample per rank leaves
        sizes = [1] if 1 in sizes else []
    return dict(
        tensor=t,
        pipeline=p,
        context=context,
        expert=ways if extra == "expert" else 1,
        micro_batch_size=draw(st.sampled_from(sizes or [1])),
        recompute=draw(st.sampled_from(["none", "selective", "full"])),
        sequence_parallel=t > 1 and draw(st.booleans()),
        distributed_optimizer=draw(st.booleans()),
    )


@given(MODELS, MESHES, BATCHES, BUDGETS, st.data())
def test_the_search_is_never_slower_than_a_recipe_that_fits(model, mesh, batch, budget, data):
    name, sizes = model

    def build(b):
        return zoo.build(name, small=True, batch=b, **sizes)

    knobs = data.draw(recipes(mesh, batch))
    try:
        recipe = sp.plan(build, mesh, "megatron-recipe", batch=batch, dtype="bf16", **knobs)
    except PlanError:
        return  # knobs this model or batch does not allow
    fits = budget is None or recipe.step.memory_per_device <= budget
    try:
        tp = sp.plan(build, mesh, "step", batch=batch, dtype="bf16", memory=budget)
    except ShardplanError as err:
        assert not fits, f"the search found nothing ({err}) but recipe {knobs} fits"
        return
    if fits:
        assert tp.step.step_s <= recipe.step.step_s * (1 + REL), (knobs, tp.notes)
