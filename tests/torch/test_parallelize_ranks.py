"""`parallelize` on 2 spawned gloo ranks (issue 28 items 9-12): convolutions under channel
splits, an FSDP module that starts with an Embedding, asymmetric padding before a convolution,
`scaled_dot_product_attention` (causal; grouped-query, whose CPU kernel's backward has no
DTensor rule without shardplan's rewrite), dropout that follows train()/eval() and gives
replicated copies one mask, and failures that reach every rank instead of leaving one waiting.
One spawn runs the value cases; two more run the failure cases (they close the group).
"""

from __future__ import annotations

import json
import os
import time

import pytest

torch = pytest.importorskip("torch")

from shardplan.engines.spawn import exit_fast, free_port, init_gloo, spawn_and_wait  # noqa: E402
from shardplan.torch.launch import spawn  # noqa: E402


class LinConv(torch.nn.Module):
    """Linear -> Conv1d: the channels the Linear splits are the convolution's input channels."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 32)
        self.conv = torch.nn.Conv1d(32, 8, 3, padding=1)

    def forward(self, x):
        return self.conv(self.lin(x).transpose(1, 2))


class RMSNorm(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(n))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Stem(torch.nn.Module):
    """A user's Conv1d stem -> transpose -> hand-written RMSNorm -> Linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 16, 3, padding=1)
        self.norm = RMSNorm(16)
        self.out = torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.out(self.norm(self.conv(x).transpose(1, 2)))


class EmbLin(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.lin = torch.nn.Linear(8, 4)

    def forward(self, ids):
        return self.lin(self.emb(ids))


class PadConv(torch.nn.Module):
    """TF-ported "same" padding (one more after than before, two axes) before a convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2)

    def forward(self, x):
        return self.conv(torch.nn.functional.pad(x, (0, 1, 0, 1)))


class Sdpa(torch.nn.Module):
    """`F.scaled_dot_product_attention` (imported whole as `attention`; run by parallelize as
    its math on DTensors): causal over 4 heads, or 4 query heads on 2 key/value heads."""

    def __init__(self, gqa: bool = False) -> None:
        super().__init__()
        self.gqa, self.kv = gqa, 2 if gqa else 4
        self.q, self.out = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.k, self.v = torch.nn.Linear(8, 2 * self.kv), torch.nn.Linear(8, 2 * self.kv)

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q(x).reshape(b, t, 4, 2).transpose(1, 2)
        k = self.k(x).reshape(b, t, self.kv, 2).transpose(1, 2)
        v = self.v(x).reshape(b, t, self.kv, 2).transpose(1, 2)
        o = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=not self.gqa, enable_gqa=self.gqa
        )
        return self.out(o.transpose(1, 2).reshape(b, t, 8))


def _dropout_model():
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Dropout(0.5), torch.nn.Linear(16, 8), torch.nn.Dropout(0.5)
    )


def _inputs(name):
    gen = torch.Generator().manual_seed(1)
    if name == "emb":
        return (torch.randint(0, 16, (4, 6), generator=gen),)
    if name == "pad":
        return (torch.randn(4, 3, 8, 8, generator=gen, dtype=torch.float64),)
    if name == "stem":
        return (torch.randn(4, 4, 8, generator=gen, dtype=torch.float64),)
    return (torch.randn(4, 8, 8, generator=gen, dtype=torch.float64),)


MODELS = {"linconv": LinConv, "stem": Stem, "emb": EmbLin, "pad": PadConv, "sdpa": Sdpa,
          "sdpa-gqa": lambda: Sdpa(gqa=True)}  # fmt: skip
CASES = [("linconv", "megatron"), ("linconv", "fsdp"), ("linconv", "drec"),
         ("stem", "megatron"), ("stem", "fsdp"), ("stem", "drec"), ("emb", "fsdp"),
         ("emb", "megatron"), ("pad", "drec"), ("pad", "fsdp"), ("sdpa", "fsdp"),
         ("sdpa", "megatron"), ("sdpa-gqa", "fsdp")]  # fmt: skip


def _against_one_process(name, method):
    """Output and every gradient of the parallelized module against a deep copy run whole."""
    import copy

    from shardplan.torch import parallelize

    torch.manual_seed(0)
    model = MODELS[name]().double()
    args = _inputs(name)
    ref = copy.deepcopy(model)
    want = ref(*args)
    want.square().sum().backward()
    try:
        got = parallelize(model, args, mesh="2", method=method)(*args)
        got.square().sum().backward()
    except Exception as e:  # reported, so the test names the case
        return {"error": f"{type(e).__name__}: {e}"[:500]}
    grads = {
        n: float((p.grad.full_tensor() - dict(ref.named_parameters())[n].grad).abs().max())
        for n, p in model.named_parameters()
    }
    return {"out": float((got - want).abs().max()), "grads": grads}


def _dropout_cases():
    """Eval mode against one process; in training, the ranks' copies of the replicated output
    and parameters agree after a step; the dropout rewrite on a replicated and a split tensor."""
    import copy

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from shardplan.torch import parallelize
    from shardplan.torch._rewrites import dropout

    torch.manual_seed(0)
    model = _dropout_model().double()
    x = torch.randn(4, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    ref = copy.deepcopy(model).eval()
    parallelize(model, (x,), mesh="2", method="megatron")
    model.eval()
    eval_err = float((model(x) - ref(x)).abs().max())
    model.train()
    out = model(x)
    dropped = float((out - ref(x)).abs().max())
    out.square().sum().backward()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.step()
    mine = [out.detach()] + [p.detach().full_tensor() for p in model.parameters()]
    theirs = [None] * 2
    dist.all_gather_object(theirs, mine)
    copies_differ = max(float((a - b).abs().max()) for a, b in zip(*theirs, strict=True))
    mesh = init_device_mesh("cpu", (2,))
    ones = torch.ones(64, 64, dtype=torch.float64)
    pieces = {}
    for label, placement in (("replicated", Replicate()), ("split", Shard(1))):
        out, _ = dropout(distribute_tensor(ones, mesh, [placement]), 0.5, True,
                         training=True, seed=7)  # fmt: skip
        got = [None] * 2
        dist.all_gather_object(got, out.to_local())
        pieces[label] = bool(torch.equal(got[0], got[1]))
    return {"eval": eval_err, "dropped": dropped, "copies_differ": copies_differ, **pieces}


def _worker():
    return [_against_one_process(*c) for c in CASES], _dropout_cases()


@pytest.fixture(scope="module")
def results():
    values, drop = spawn(_worker, 2, (), timeout=900)
    return dict(zip(CASES, values, strict=True)), drop


@pytest.mark.parametrize("case", CASES, ids=[f"{n}-{m}" for n, m in CASES])
def test_equal_to_one_process(results, case):
    r = results[0][case]
    assert "error" not in r, r.get("error")
    assert r["out"] < 1e-12
    assert max(r["grads"].values()) < 1e-12, r["grads"]


def test_dropout_follows_eval_and_replicated_copies_agree(results):
    drop = results[1]
    assert drop["eval"] < 1e-12  # eval mode: no dropout, as in one process
    assert drop["dropped"] > 1e-3  # train mode: dropout is on
    assert drop["copies_differ"] == 0.0  # every rank holds the same replicated values
    assert drop["replicated"] is True and drop["split"] is False  # one mask; shards differ


def _fail_entry(rank, world, port, out_dir, where):
    """Rank 1 fails (at set-up or inside the forward); every rank records what it raised and
    when, and no rank may wait for the group's timeout (set to 120 s)."""
    init_gloo(rank, world, port, 120.0)
    from shardplan.torch import parallelize

    torch.manual_seed(0)
    model = LinConv().double()
    args = _inputs("linconv")
    start = time.perf_counter()
    try:
        method = "bogus" if (where == "setup" and rank == 1) else "megatron"
        model = parallelize(model, args, mesh="2", method=method)
        if rank == 1:  # a node of the forward fails on this rank only
            runner = model.forward
            real = runner._call

            def fail(node, *rest):
                if node.name.startswith(("convolution", "conv1d")):
                    raise RuntimeError("injected failure on rank 1")
                return real(node, *rest)

            runner._call = fail
        model(*args)
        outcome = "no error"
    except Exception as e:
        outcome = f"{type(e).__name__}: {e}"
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump({"error": outcome, "seconds": time.perf_counter() - start}, f)
    exit_fast()


@pytest.mark.parametrize("where", ["setup", "forward"])
def test_a_failure_on_one_rank_reaches_every_rank(tmp_path, where):
    spawn_and_wait(_fail_entry, (2, free_port(), str(tmp_path), where), 2, 300, "failure")
    got = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    if where == "setup":
        assert got[1]["error"].startswith("SolverError")
        assert got[0]["error"].startswith("BackendError: parallelize: rank 1 failed to set up")
    else:
        assert got[1]["error"].startswith("BackendError: parallelize: rank 1 failed running")
        assert got[0]["error"].startswith("BackendError: parallelize: rank 0 failed running")
    assert all(g["seconds"] < 60 for g in got)  # nobody waited for the 120 s group timeout
