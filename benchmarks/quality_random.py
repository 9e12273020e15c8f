"""D-Rec against the ILP optimum on randomly drawn cases: inputs nobody chose (issue 24, item 5).

`quality.py` and `quality_sweep.py` run fixed lists; a planner tuned, even unknowingly, to them
can still lose elsewhere. Here a seeded generator draws each case: a zoo model (`MODELS`), a mesh
of 2-30 devices (1-D, or 2-D with its factors in either order; factors 2, 3, 5 and 7), one to
three layers where the model has them, and a batch and sequence length drawn as multiples of the
mesh's factors or not. Each case is run by `quality.run_case` (D-Rec, the expert plans and the ILP
with a time limit, one cost model) and reported as `quality_sweep.py` reports its list.

Run: python benchmarks/quality_random.py [--seed 1] [--cases 30] [--time-limit 30]
     [--ilp-cache DIR] [--name STEM] [--axes 2|3]
`--axes 3` also draws 3-D meshes (three factors, either order; seeds keep their cases only at
the default 2).
Writes benchmarks/results/{STEM}.{json,md} (default quality_random). Deterministic per seed.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from _report import run_info, write  # noqa: E402
from quality_sweep import builder_takes, markdown, run_cases, summarize  # noqa: E402

MODELS = (  # the zoo's classic families, small enough for the ILP at one to three layers
    "gpt2-small",
    "gpt2-medium",
    "bert-base",
    "gpt3",
    "vit-b16",
    "llama",
    "alexnet",
    "mlp",
    "moe",
    "wide-deep",
    "sapp-mlp",
    "deepseek-moe",
)
MESHES = (2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 15, 16, 18, 20, 21, 24, 25, 27, 28, 30)
SEQS = (64, 96, 128, 160, 192, 256, 384, 512)


def draw_mesh(rng: random.Random, axes: int = 2) -> str:
    """A 1-D mesh, or (half the time, when it has two factors) a 2-D one of its factors; with
    `axes` 3, a 3-D one of three factors half the time it has them (`--axes 3`)."""
    n = rng.choice(MESHES)
    if axes >= 3:
        triples = [(a, b, n // (a * b)) for a in range(2, n) for b in range(2, n)]
        triples = [t for t in triples if t[2] >= 2 and t[0] * t[1] * t[2] == n]
        if triples and rng.random() < 0.5:
            return "x".join(map(str, rng.choice(triples)))
    pairs = [(a, n // a) for a in range(2, n) if n % a == 0]
    if pairs and rng.random() < 0.5:
        a, b = rng.choice(pairs)
        return f"{a}x{b}"
    return str(n)


def draw_sizes(rng: random.Random, model: str, devices: int) -> dict[str, int]:
    """Layers, batch and sequence for the builder (only the sizes it takes)."""
    takes = builder_takes(model)
    per = rng.choice([1, 1, 2, 3]) if rng.random() < 0.7 else 0  # 0: a batch the mesh splits badly
    batch = devices * per if per else rng.randint(1, 2 * devices)
    if model == "wide-deep":
        batch *= 64  # its tables want large batches
    sizes = {"layers": rng.randint(1, 3), "batch": batch, "seq": rng.choice(SEQS)}
    if model == "llama":
        sizes.update(hidden=1024, heads=16, kv_heads=4, ffn=2816, vocab=32000)
    return {k: v for k, v in sizes.items() if k in takes}


def cases(seed: int, count: int, axes: int = 2) -> list[tuple[str, str, dict[str, int]]]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        model = rng.choice(MODELS)
        mesh = draw_mesh(rng, axes)
        devices = 1
        for part in mesh.split("x"):
            devices *= int(part)
        out.append((model, mesh, draw_sizes(rng, model, devices)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cases", type=int, default=30)
    parser.add_argument("--time-limit", type=float, default=30.0)
    parser.add_argument("--ilp-cache", type=Path, default=None, help="reuse/store ILP results")
    parser.add_argument("--name", default="quality_random", help="results file stem")
    parser.add_argument("--axes", type=int, default=2, choices=(2, 3), help="most mesh axes")
    args = parser.parse_args()
    info = run_info(__file__, time_limit=args.time_limit, seed=args.seed, axes=args.axes)
    rows = run_cases(cases(args.seed, args.cases, args.axes), args.time_limit, args.ilp_cache)
    summary = {"seed": args.seed, **summarize(rows)}
    md = markdown(rows, info).replace(
        "# D-Rec quality on meshes with factors 3 and 5, several layers, other sizes",
        f"# D-Rec quality on {len(rows)} random cases (seed {args.seed})",
    )
    md += f"\nD-Rec worse than the best expert plan in {summary['worse_than_expert']} cases.\n"
    write(args.name, {**info, "summary": summary, "cases": rows}, md)


if __name__ == "__main__":
    main()
