"""`parallelize` on random small modules over 2 spawned gloo ranks (issue 28): each module, under
a random method, gives the output and gradients of one process (float64, 1e-9) or a typed
ShardplanError on every rank — never a hang (the spawn has a deadline) and never another error.

Modules are chains of Linear, activation, LayerNorm, a hand-written RMSNorm, Conv1d (through
transposes), Embedding (first only) and residual adds over sizes with primes. Hypothesis draws
the list; one spawn runs it (process start-up dominates). The number of modules follows the
profile: 4 under "ci", >= 200 under "long".
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from shardplan.errors import BackendError  # noqa: E402
from shardplan.torch.launch import spawn  # noqa: E402

SIZES = st.sampled_from([2, 3, 4, 5, 6, 8])
LAYERS = st.sampled_from(["linear", "act", "layernorm", "rmsnorm", "conv", "residual"])
METHODS = st.sampled_from(["drec", "megatron", "fsdp", "data-parallel"])


@st.composite
def specs(draw):
    embed = draw(st.booleans())
    first = draw(SIZES)
    width = first  # each layer's input width is the previous layer's output
    layers = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(LAYERS)
        out = draw(SIZES) if kind in ("linear", "conv") else width
        layers.append((kind, out))
        width = out
    return {
        "embed": embed,
        "first": first,
        "layers": layers,
        "batch": draw(st.sampled_from([2, 3, 4])),
        "seq": draw(st.sampled_from([3, 4, 5])),
        "method": draw(METHODS),
    }


def _module(spec):
    nn = torch.nn

    class RMSNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    class Conv(nn.Module):
        def __init__(self, n, out):
            super().__init__()
            self.conv = nn.Conv1d(n, out, 3, padding=1)

        def forward(self, x):
            return self.conv(x.transpose(1, 2)).transpose(1, 2)

    class Residual(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.lin = nn.Linear(n, n)

        def forward(self, x):
            return x + self.lin(x)

    blocks = [nn.Embedding(11, spec["first"])] if spec["embed"] else []
    width = spec["first"]
    make = {
        "linear": lambda n, out: nn.Linear(n, out),
        "act": lambda n, out: nn.GELU(),
        "layernorm": lambda n, out: nn.LayerNorm(n),
        "rmsnorm": lambda n, out: RMSNorm(n),
        "conv": lambda n, out: Conv(n, out),
        "residual": lambda n, out: Residual(n),
    }
    for kind, out in spec["layers"]:
        blocks.append(make[kind](width, out))
        width = out
    return nn.Sequential(*blocks).double()


def _run(spec):
    import copy

    from shardplan.errors import ShardplanError
    from shardplan.torch import parallelize

    torch.manual_seed(0)
    model = _module(spec)
    gen = torch.Generator().manual_seed(1)
    shape = (spec["batch"], spec["seq"])
    x = (torch.randint(0, 11, shape, generator=gen) if spec["embed"]
         else torch.randn(*shape, spec["first"], generator=gen, dtype=torch.float64))  # fmt: skip
    ref = copy.deepcopy(model)
    want = ref(x)
    want.square().sum().backward()
    try:
        got = parallelize(model, (x,), mesh="2", method=spec["method"])(x)
        got.square().sum().backward()
    except ShardplanError as e:
        return {"typed": f"{type(e).__name__}: {e}"[:300]}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"[:500]}
    refs = dict(ref.named_parameters())
    worst = max(
        [float((got - want).detach().abs().max())]
        + [
            float((p.grad.full_tensor() - refs[n].grad).abs().max())
            for n, p in model.named_parameters()
        ]  # fmt: skip
    )
    return {"worst": worst}


def _worker(batch):
    return [_run(s) for s in batch]


COUNT = max(4, settings.default.max_examples // 12)
"""Modules per run from the profile loaded at collection (ci: 4; long: 208); inside the test
`settings.default` is the test's own max_examples=1."""


def _spawned(batch):
    """The batch's results from two spawned ranks; spawned once more when a rank was killed by a
    signal (CI saw a gloo rank abort once, SIGABRT, on the 2-op module of the first draw; the
    same modules passed when hypothesis re-ran them). A module that breaks a rank every time
    still fails."""
    try:
        return spawn(_worker, 2, (batch,), timeout=60 + 20 * len(batch))
    except BackendError as e:
        if "(signal SIG" not in str(e):
            raise
        return spawn(_worker, 2, (batch,), timeout=60 + 20 * len(batch))


@settings(max_examples=1)
@given(st.data())
def test_random_modules_match_one_process_or_raise_typed(data):
    batch = data.draw(st.lists(specs(), min_size=COUNT, max_size=COUNT))
    results = _spawned(batch)
    failures = [(s, r) for s, r in zip(batch, results, strict=True)
                if "error" in r or r.get("worst", 0.0) > 1e-9]  # fmt: skip
    print(
        f"\n{len(batch)} modules: {sum('worst' in r for r in results)} equal to one process, "
        f"{sum('typed' in r for r in results)} typed errors"
    )
    assert not failures, failures[:3]
