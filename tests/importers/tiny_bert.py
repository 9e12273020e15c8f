"""A small Hugging Face BERT with distinct random weights, exported to ONNX in memory (shared by
the ONNX importer tests; torch and transformers are imported by the caller's skips)."""

from __future__ import annotations

import io


def tiny_bert(vocab: int, hidden: int, intermediate: int, pooled: bool):
    """(module, bert): the module maps input_ids to the last hidden state (and the pooler
    output when `pooled`)."""
    import torch
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=intermediate,
        max_position_embeddings=64,
        attn_implementation="eager",
    )
    bert = transformers.BertModel(config).eval()
    with torch.no_grad():  # distinct values: the exporter merges equal initializers
        for p in bert.parameters():
            p.normal_()

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids):  # noqa: ANN001, ANN201
            out = self.bert(input_ids=input_ids)
            if pooled:
                return out.last_hidden_state, out.pooler_output
            return out.last_hidden_state

    return Wrapper(), bert


def onnx_bytes(module, ids) -> bytes:  # noqa: ANN001
    import torch

    buffer = io.BytesIO()
    torch.onnx.export(module, (ids,), buffer, dynamo=False, input_names=["input_ids"])
    return buffer.getvalue()
