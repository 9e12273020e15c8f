"""Torch GPT `nn.Module`s shared by the torch importer tests and benchmarks/torch_import.py (which
puts this folder on sys.path). Import only after `importorskip("torch")`.

Two block forms, the same parameters (ln1, ln2, q, k, v, o, fc, proj per block):
  * the GPT of issue 13 (`plain=False`): token + position embeddings, heads split with view and
    transpose, scaled scores under a causal mask, GELU;
  * the plain blocks of issue 24 (`plain=True`): one embedding, attention written
    `softmax(q @ k.T) @ v` on the whole hidden width (no heads, no mask), ReLU.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional


class Block(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, plain: bool) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.q, self.k = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
        self.v, self.o = nn.Linear(hidden, hidden), nn.Linear(hidden, hidden)
        self.fc, self.proj = nn.Linear(hidden, ffn), nn.Linear(ffn, hidden)
        self.heads, self.plain = heads, plain

    def attend(self, y: Any) -> Any:
        if self.plain:
            q, k, v = self.q(y), self.k(y), self.v(y)
            return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
        b, t, h = y.shape
        q, k, v = (
            f(y).view(b, t, self.heads, h // self.heads).transpose(1, 2)
            for f in (self.q, self.k, self.v)
        )
        a = (q @ k.transpose(-2, -1)) * (h // self.heads) ** -0.5
        mask = torch.ones(t, t, dtype=torch.bool, device=y.device).triu(1)
        a = a.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return a.transpose(1, 2).reshape(b, t, h)

    def forward(self, x: Any) -> Any:
        x = x + self.o(self.attend(self.ln1(x)))
        act = torch.relu if self.plain else functional.gelu
        return x + self.proj(act(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(
        self, layers: int, hidden: int, heads: int, ffn: int, vocab: int, seq: int, plain: bool
    ) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, hidden)
        self.wpe = None if plain else nn.Embedding(seq, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, ffn, plain) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(hidden), nn.Linear(hidden, vocab, bias=False)

    def forward(self, ids: Any) -> Any:
        x = self.wte(ids)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))
