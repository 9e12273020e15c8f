"""Write docs/models.md: every zoo model with its source configuration and parameter counts.

Each model is built at its default size (batch 1; the parameter count does not depend on the
batch) and the counts are read from the graph: `Graph.num_params`, and for MoE models the
parameters a token activates (`shardplan.zoo.llm.activated_params`). Published figures and source
configurations come from the zoo entries (`shardplan/zoo/__init__.py`,
`shardplan/zoo/entries_llm.py`, which cite them). Run from the repository root:
`PYTHONPATH=$PWD python docs/make_models_md.py` (`--check` exits 1 if the page is stale).
"""

from __future__ import annotations

import sys
from pathlib import Path

from shardplan.zoo import MODELS, build
from shardplan.zoo.llm import activated_params

PAGE = Path(__file__).resolve().parent / "models.md"
HEAD = """# The model zoo

`shardplan models` lists these; `shardplan plan NAME --mesh ...` plans one, `--small` starts from
the reduced sizes the tests use and size flags (`--layers`, `--hidden`, ...) override the
defaults. Counts below are read from the built graphs by `docs/make_models_md.py` (do not edit
this page by hand). "Source" is the published configuration the defaults are read from; the
Hugging Face configs of the LLMs are also in `tests/data/hf/<name>/config.json`, so
`shardplan plan --hf tests/data/hf/llama3-70b ...` imports the same model from its config (on
torch's meta device, without weights).

The LLM families (`llama`, `moe-llm`; `shardplan/zoo/llm.py`) use the operators the models run:
RMSNorm, grouped-query attention with its K/V head count, RoPE as elementwise work, SwiGLU's
three matmuls, DeepSeek's multi-head latent attention (low-rank q and compressed KV), routed plus
shared experts and dense first layers. "Activated per token" counts an expert weight at k/E of
its size and includes the LM head. It is counted as the publisher counts: with the input
embedding table for Mistral and Qwen, without it for DeepSeek-V3 (marked "no embedding"), whose
weights documentation gives "36.6B (including 0.9B for the output Head)" for the main model (the
technical report rounds it to 37B; sources in `shardplan/zoo/entries_llm.py`).

"""


def _b(n: float) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M"


def _row(name: str) -> str:
    entry = MODELS[name]
    graph = build(name, batch=1) if _takes_batch(name) else build(name)
    active = activated_params(graph, embedding=entry.active_with_embedding)
    pub = entry.published_params
    cells = [
        f"`{name}`",
        entry.description,
        f"[{entry.source}](https://huggingface.co/{entry.source})" if entry.source else "-",
        _b(graph.num_params),
        f"{_b(pub)} ({graph.num_params / pub - 1:+.2%})" if pub else "-",
        "all"
        if active == graph.num_params
        else _b(active) + ("" if entry.active_with_embedding else " (no embedding)"),
        f"{_b(entry.published_active)} ({active / entry.published_active - 1:+.2%})"
        if entry.published_active
        else "-",
        str(len(graph.ops)),
    ]
    return "| " + " | ".join(cells) + " |"


def _takes_batch(name: str) -> bool:
    import inspect

    return "batch" in inspect.signature(MODELS[name].builder).parameters


def render() -> str:
    rows = [
        "| model | what | source configuration | parameters | published (difference) "
        "| activated per token | published activated | ops |",
        "|---|---|---|---|---|---|---|---|",
        *(_row(name) for name in MODELS),
    ]
    return HEAD + "\n".join(rows) + "\n"


def main() -> None:
    text = render()
    if "--check" in sys.argv:
        sys.exit(0 if PAGE.read_text() == text else 1)
    PAGE.write_text(text)
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    main()
