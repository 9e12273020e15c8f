"""From `nn.Module` to plan: the torch importer's time split (export, translation, search).

The 24-block GPT of issue 13 (hidden 1024, 16 heads, FFN 4096, seq 512, vocab 50304; batch 8 per
slot of the outer mesh axis), built on the meta device (no weights in memory), on meshes 8 and
2x4: `torch.export.export` (torch's own time), translation by `import_torch` (decomposing to
core ATen only when an op needs it) and, for comparison, translation after the full core-ATen
decomposition the importer always ran before, then the D-Rec search. Wall clock and CPU time of
this process (on a shared machine the CPU time is the one other jobs do not inflate).

Run: python benchmarks/torch_import.py [--layers 24] [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import run_info, table, write  # noqa: E402

import shardplan as sp  # noqa: E402
from shardplan.cost import CostOptions, evaluate_strategies  # noqa: E402
from shardplan.search.drec.search import drec  # noqa: E402


def gpt_module(layers: int, hidden: int, heads: int, ffn: int, vocab: int, seq: int) -> Any:
    import torch
    from torch import nn
    from torch.nn import functional

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
            self.q, self.k = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
            self.v, self.o = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
            self.fc, self.proj = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)

        def forward(self, x: Any) -> Any:
            b, t, h = x.shape
            y = self.ln1(x)
            q, k, v = (
                f(y).view(b, t, heads, h // heads).transpose(1, 2) for f in (self.q, self.k, self.v)
            )
            a = (q @ k.transpose(-2, -1)) * (h // heads) ** -0.5
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
            a = a.masked_fill(mask, float("-inf")).softmax(-1) @ v
            x = x + self.o(a.transpose(1, 2).reshape(b, t, h))
            return x + self.proj(functional.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, hidden), nn.Embedding(seq, hidden)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln, self.head = nn.LayerNorm(hidden), nn.Linear(hidden, vocab, bias=False)

        def forward(self, ids: Any) -> Any:
            x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
            for block in self.blocks:
                x = block(x)
            return self.head(self.ln(x))

    with torch.device("meta"):
        return GPT()


def clock(fn: Any) -> tuple[Any, float, float]:
    start, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - start, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--repeat", type=int, default=3, help="search runs (best is kept)")
    args = parser.parse_args()
    import torch

    from shardplan.importers import torch as importer

    info = run_info(__file__, layers=args.layers, repeat=args.repeat)
    opts = CostOptions.make()
    rows = []
    for mesh_text, batch in (("8", 8), ("2x4", 16)):
        mesh = sp.parse_mesh(mesh_text)
        module = gpt_module(args.layers, 1024, 16, 4096, 50304, 512)
        ids = torch.zeros(batch, 512, dtype=torch.long, device="meta")
        program, export_s, export_cpu = clock(lambda m=module, i=ids: torch.export.export(m, (i,)))
        result, trans_s, trans_cpu = clock(
            lambda p=program: importer._translate(torch, p, "gpt", "error")
        )
        old, old_s, old_cpu = clock(
            lambda p=program: importer._translate(torch, p, "gpt", "error", decompose=True)
        )
        graph = result.graph
        searches = [clock(lambda g=graph, m=mesh: drec(g, m, opts)) for _ in range(args.repeat)]
        plan = searches[0][0]
        search_s = min(s[1] for s in searches)
        search_cpu = min(s[2] for s in searches)
        old_plan = drec(old.graph, mesh, opts)
        rows.append(
            {
                "mesh": mesh_text,
                "batch": batch,
                "ops": len(graph.ops),
                "export_s": export_s,
                "export_cpu_s": export_cpu,
                "translate_s": trans_s,
                "translate_cpu_s": trans_cpu,
                "decomposed_translate_s": old_s,
                "decomposed_translate_cpu_s": old_cpu,
                "search_s": search_s,
                "search_cpu_s": search_cpu,
                "end_to_end_s": export_s + trans_s + search_s,
                "end_to_end_cpu_s": export_cpu + trans_cpu + search_cpu,
                "cost": evaluate_strategies(graph, mesh, plan, opts).total,
                "decomposed_cost": evaluate_strategies(old.graph, mesh, old_plan, opts).total,
            }
        )
    md = "# nn.Module to plan: the torch importer's time split\n\n"
    md += f"Command: `{info['command']}` (source {info['source']})\n\n"
    md += (
        f"GPT `nn.Module`, {args.layers} blocks, hidden 1024, 16 heads, FFN 4096, seq 512, "
        "vocab 50304, on the meta device. Seconds wall (CPU of this process). Translation: "
        "`import_torch` after export (decomposing only when needed); 'with full decomposition': "
        "the core-ATen decomposition the importer always ran before. Search: D-Rec, best of "
        f"{args.repeat}. Cost: the evaluator's, of the plan from each translation.\n\n"
    )

    def both(r: dict[str, Any], key: str) -> str:
        return f"{r[key + '_s']:.3f} ({r[key + '_cpu_s']:.3f})"

    md += table(
        [
            "mesh",
            "batch",
            "ops",
            "export",
            "translation",
            "with full decomposition",
            "D-Rec search",
            "end to end",
            "cost",
            "cost (decomposed)",
        ],
        [
            [
                r["mesh"],
                r["batch"],
                r["ops"],
                both(r, "export"),
                both(r, "translate"),
                both(r, "decomposed_translate"),
                both(r, "search"),
                both(r, "end_to_end"),
                f"{r['cost']:.6g}",
                f"{r['decomposed_cost']:.6g}",
            ]
            for r in rows
        ],
    )
    write("torch_import", {**info, "rows": rows}, md)


if __name__ == "__main__":
    main()
