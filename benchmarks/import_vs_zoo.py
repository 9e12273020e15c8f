"""Imported Hugging Face models against the built-in zoo (same shapes): parameter counts and the
D-Rec plan cost. Issue: importing must not change the plan the user gets.

Run: python benchmarks/import_vs_zoo.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import table, write  # noqa: E402

import shardplan as sp  # noqa: E402
from shardplan.importers.hf import import_hf  # noqa: E402

CASES = [  # (HF name, zoo name, zoo overrides matching the HF config)
    ("gpt2", "gpt2-small", {}),
    ("bert-base-uncased", "bert-base", {"max_positions": 512}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="seq 128 instead of 512")
    args = parser.parse_args()
    batch, seq = 8, (128 if args.quick else 512)
    rows = []
    for hf_name, zoo_name, extra in CASES:
        start = time.perf_counter()
        imported = import_hf(hf_name, batch=batch, seq=seq).graph
        import_s = time.perf_counter() - start
        import torch
        import transformers

        arch_params = None
        if hf_name == "gpt2":
            model = transformers.GPT2LMHeadModel(transformers.GPT2Config())
        else:
            model = transformers.BertForSequenceClassification(transformers.BertConfig())
        arch_params = sum(p.numel() for p in model.parameters())
        del model, torch
        zoo_graph = sp.zoo.build(zoo_name, batch=batch, seq=seq, **extra)
        for mesh in ("8", "2x8"):
            a = sp.plan(imported, mesh)
            b = sp.plan(zoo_graph, mesh)
            rows.append(
                {
                    "hf": hf_name,
                    "zoo": zoo_name,
                    "mesh": mesh,
                    "batch": batch,
                    "seq": seq,
                    "hf_params": arch_params,
                    "imported_params": imported.num_params,
                    "zoo_params": zoo_graph.num_params,
                    "imported_ops": len(imported.ops),
                    "zoo_ops": len(zoo_graph.ops),
                    "import_s": import_s,
                    "imported_cost": a.cost.total,
                    "zoo_cost": b.cost.total,
                    "ratio": a.cost.total / b.cost.total,
                }
            )
    md = "# Imported Hugging Face models vs the zoo\n\nCommand: `python benchmarks/import_vs_zoo.py"
    md += " --quick`\n\n" if args.quick else "`\n\n"
    md += table(
        [
            "HF model",
            "zoo model",
            "mesh",
            "params (HF)",
            "params (imported)",
            "params (zoo)",
            "ops imported/zoo",
            "D-Rec cost imported",
            "D-Rec cost zoo",
            "ratio",
        ],
        [
            [
                r["hf"],
                r["zoo"],
                r["mesh"],
                r["hf_params"],
                r["imported_params"],
                r["zoo_params"],
                f"{r['imported_ops']}/{r['zoo_ops']}",
                f"{r['imported_cost']:.4g}",
                f"{r['zoo_cost']:.4g}",
                f"{r['ratio']:.3f}",
            ]
            for r in rows
        ],
    )
    md += (
        "\nThe zoo's BERT has a 2-class head on a mean-pooled output and separate q/k/v; "
        "HF's uses the first token and its own pooler; GPT-2 in HF fuses q/k/v into one "
        "Conv1D that the importer splits with slices.\n"
    )
    write("import_vs_zoo", {"rows": rows}, md)


if __name__ == "__main__":
    main()
