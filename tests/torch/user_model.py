"""A new user's own model, written by hand: a conv stem, an RMSNorm, causal attention and a
SwiGLU MLP (no library blocks, no names the planner could key on). `build()` returns
`(model, (x,))` for `shardplan verify --torch user_model:build`; float64 so a parallel run can be
compared with one process to ~1e-12."""

from __future__ import annotations

import torch
from torch import nn

WIDTH, HEADS, SEQ, BATCH, CHANNELS = 16, 4, 8, 4, 3


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, w = x.shape
        q, k, v = self.qkv(x).split(w, dim=-1)
        q, k, v = (t.view(b, s, self.heads, w // self.heads).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / (w // self.heads) ** 0.5
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)
        attn = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        return self.out((attn @ v).transpose(1, 2).reshape(b, s, w))


class SwiGLU(nn.Module):
    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.n1, self.attn = RMSNorm(width), Attention(width, heads)
        self.n2, self.mlp = RMSNorm(width), SwiGLU(width, 4 * width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.n1(x))
        return x + self.mlp(self.n2(x))


class UserModel(nn.Module):
    """A conv stem over [batch, channels, seq], two blocks, a head; returns a scalar loss."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv1d(CHANNELS, WIDTH, kernel_size=3, padding=1)
        self.blocks = nn.ModuleList([Block(WIDTH, HEADS) for _ in range(2)])
        self.norm = RMSNorm(WIDTH)
        self.head = nn.Linear(WIDTH, WIDTH, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x).transpose(1, 2)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h)).pow(2).mean()


def build() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = UserModel().double()
    return model, (torch.randn(BATCH, CHANNELS, SEQ, dtype=torch.float64),)
