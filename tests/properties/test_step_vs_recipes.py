"""Issue 24 item 3: the training-step search is never slower than any Megatron recipe that fits.

For random small models, meshes (1-D, 2-D, factors 3), batches and budgets, every Megatron
recipe — tensor degree t a product of the stage mesh's innermost rounds (any divisor of the
innermost axis the expert accepts), pipeline degree p dividing the outer axis, every per-rank
micro-batch size, recomputation none/selective/full, with and without sequence parallelism and
the distributed optimizer — is scored by the same step model; the search's plan must be at
least as fast as each one that fits the same budget, and must exist when one does.
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
    ]
)
MESHES = st.sampled_from(["4", "8", "2x2", "2x4", "4x2", "1x4", "3x2", "2x3", "2x2x2"])
BATCHES = st.sampled_from([4, 6, 8, 12, 16])
BUDGETS = st.one_of(st.none(), st.sampled_from([2e6, 5e6, 2e7, 1e8]))
REL = 1e-9


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _recipes(build, mesh_text: str, batch: int, budget):
    """Every recipe's step that fits `budget` (PlanErrors: knobs the mesh or model refuse)."""
    mesh = parse_mesh(mesh_text)
    inner, outer = mesh.shape[-1], mesh.shape[0]
    for t in _divisors(inner):
        for p in _divisors(outer):
            if mesh.size % (t * p):
                continue
            data = mesh.size // (t * p)
            for mbs in _divisors(batch):
                if batch % (data * mbs):
                    continue
                for rec in ("none", "selective", "full"):
                    for seq in (False, True) if t > 1 else (False,):
                        for dist in (False, True):
                            knobs = dict(tensor=t, pipeline=p, micro_batch_size=mbs,
                                         recompute=rec, sequence_parallel=seq,
                                         distributed_optimizer=dist)  # fmt: skip
                            try:
                                tp = sp.plan(build, mesh_text, "megatron-recipe", batch=batch,
                                             dtype="bf16", **knobs)  # fmt: skip
                            except PlanError:
                                continue
                            if budget is None or tp.step.memory_per_device <= budget:
                                yield knobs, tp.step.step_s


@given(MODELS, MESHES, BATCHES, BUDGETS)
def test_the_search_is_never_slower_than_a_recipe_that_fits(model, mesh, batch, budget):
    name, sizes = model

    def build(b):
        return zoo.build(name, small=True, batch=b, **sizes)

    recipes = list(_recipes(build, mesh, batch, budget))
    try:
        tp = sp.plan(build, mesh, "step", batch=batch, dtype="bf16", memory=budget)
    except ShardplanError as err:
        assert not recipes, f"the search found nothing ({err}) but recipe {recipes[0][0]} fits"
        return
    for knobs, step in recipes:
        assert tp.step.step_s <= step * (1 + REL), (knobs, step, tp.step.step_s, tp.notes)
