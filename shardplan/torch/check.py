"""Checks of `parallelize` against the single-process module: training and collectives.

`train_worker` runs in every process of a gloo world (see `shardplan.torch.launch.spawn`):
1. builds the module (float64, eval mode so dropout is off) and a deep copy for the reference;
2. plans it (D-Rec by default, or `method`): unconstrained first, then (when
   `memory_fraction` < 1) under that fraction of the unconstrained plan's memory per device, so
   the plan really shards (or takes `plan_json`);
3. runs `steps` AdamW steps on the single-process copy and on `parallelize(module, plan=...)`
   (or, with `engine="torch_tp"`, on `parallelize_module(module, mesh, to_torch_tp(plan))`);
4. counts the collectives of the first parallel step (forward + backward) by kind with a
   dispatch mode that sees each functional collective once, after DTensor lowers it (as
   `CommDebugMode` counts them, without its module tracker: under torch 2.13 with
   transformers 5 its forward hook pops past the root module, IndexError), and
   measures their bytes per device (ring formulas, as the cost model counts them) next to the
   plan's prediction per kind (`predict_by_op`, train mode);
5. returns, on rank 0, the losses of both runs, the largest parameter difference and the counts.

Cost: two exports and two plans per process, then 2 x `steps` forward/backward passes.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from shardplan import units
from shardplan.cost.collectives import CollectiveKind as Kind
from shardplan.errors import PlanError

_FUNCOL = {
    "all_reduce": Kind.ALL_REDUCE,
    "all_gather": Kind.ALL_GATHER,
    "reduce_scatter": Kind.REDUCE_SCATTER,
    "all_to_all": Kind.ALL_TO_ALL,
}
KINDS = tuple(_FUNCOL.values())
"""The collectives torch's functional collectives issue (no collective-permute), in table order."""
_PREDICTED = {
    Kind.ALL_REDUCE: "all_reduce_bytes",
    Kind.ALL_GATHER: "all_gather_bytes",
    Kind.ALL_TO_ALL: "all_to_all_bytes",
}


def kind_of(op_name: str) -> Kind | None:
    """`c10d_functional.all_gather_into_tensor` -> `all-gather` (None: not a collective)."""
    for key, kind in _FUNCOL.items():
        if key in op_name:
            return kind
    return None


def loss_of(output: Any) -> Any:
    """The training loss of a module's output: its `.loss` (Hugging Face models given labels),
    the output itself if it is a scalar, else the mean square of its first tensor."""
    import torch

    loss = getattr(output, "loss", None)
    if loss is not None:
        return loss
    if isinstance(output, torch.Tensor) and output.dim() == 0:
        return output
    leaves = [v for v in _leaves(output) if isinstance(v, torch.Tensor)]
    if not leaves:
        raise PlanError("the module's output has no tensor to make a loss of")
    return leaves[0].pow(2).mean()


def _leaves(output: Any) -> list[Any]:
    from torch.utils import _pytree as pytree

    if hasattr(output, "to_tuple"):
        output = output.to_tuple()
    return pytree.tree_leaves(output)


def hf_model(
    name: str,
    layers: int = 2,
    hidden: int = 32,
    heads: int = 4,
    batch: int = 4,
    seq: int = 8,
    vocab: int = 64,
) -> tuple[Any, ...]:
    """A tiny Hugging Face causal LM (`"gpt2"` or `"llama"`), eager attention, no cache, random
    weights from seed 0: `(model, (input_ids,), {"use_cache": False}, loss)` where `loss(output)`
    is the next-token cross-entropy of the logits in the model's dtype (Hugging Face's own loss
    casts logits to float32, which would hide float64 agreement)."""
    import torch
    import transformers

    torch.manual_seed(0)
    if name == "gpt2":
        config = transformers.GPT2Config(
            n_layer=layers,
            n_embd=hidden,
            n_head=heads,
            vocab_size=vocab,
            n_positions=seq,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        cls = transformers.GPT2LMHeadModel
    elif name == "llama":
        config = transformers.LlamaConfig(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2),
            intermediate_size=2 * hidden,
            vocab_size=vocab,
            max_position_embeddings=seq,
            tie_word_embeddings=False,
        )
        cls = transformers.LlamaForCausalLM
    else:
        raise PlanError(f"hf_model: {name!r} is not 'gpt2' or 'llama'")
    config.use_cache = False
    model = cls._from_config(config, attn_implementation="eager").eval()
    ids = torch.randint(0, vocab, (batch, seq))

    def loss(output: Any) -> Any:
        logits = output.logits[:, :-1]
        return torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), ids[:, 1:].reshape(-1))

    return model, (ids,), {"use_cache": False}, loss


class _Recorder:
    """Collectives seen under a dispatch mode: kind -> [count, bytes sent per device]."""

    def __init__(self) -> None:
        self.kinds: dict[str, list[float]] = {k: [0, 0.0] for k in KINDS}

    def add(self, kind: str, nbytes: float, q: int) -> None:
        sent = {
            Kind.ALL_REDUCE: 2 * (q - 1) / q * nbytes,
            Kind.ALL_GATHER: (q - 1) * nbytes,  # the input is the local shard, 1/q of the output
            Kind.REDUCE_SCATTER: (q - 1) / q * nbytes,
            Kind.ALL_TO_ALL: (q - 1) / q * nbytes,
        }[kind]
        self.kinds[kind][0] += 1
        self.kinds[kind][1] += sent


def _byte_mode(recorder: _Recorder) -> Any:
    import torch
    from torch.distributed.distributed_c10d import _resolve_process_group
    from torch.distributed.tensor import DTensor
    from torch.utils._python_dispatch import TorchDispatchMode

    class ByteMode(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None):
            if any(t is DTensor for t in types):
                return NotImplemented  # let DTensor lower to collectives first
            kind = kind_of(str(func))
            if kind is not None and args and isinstance(args[0], torch.Tensor):
                group = next((a for a in reversed(args[1:]) if isinstance(a, str)), None)
                q = _resolve_process_group(group).size() if group else 1
                recorder.add(kind, args[0].numel() * args[0].element_size(), q)
            return func(*args, **(kwargs or {}))

    return ByteMode()


def predicted_bytes(plan: Any) -> dict[str, float]:
    """The plan's predicted bytes per device and kind for one training step (forward+backward)."""
    from shardplan.fidelity.predict import byte_options, predict_by_op

    total = {k: 0.0 for k in KINDS}
    for pred in predict_by_op(plan, byte_options(plan, True)).values():
        terms = pred.total
        for kind, fld in _PREDICTED.items():
            total[kind] += float(getattr(terms, fld))
    return total


def _train(
    module: Any,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    loss_fn: Callable[..., Any],
    steps: int,
    lr: float,
    first_step_mode: Callable[[], Any] | None = None,
) -> list[float]:
    import contextlib

    import torch

    opt = torch.optim.AdamW(module.parameters(), lr=lr, foreach=False)
    losses = []
    for step in range(steps):
        ctx = first_step_mode() if (step == 0 and first_step_mode) else contextlib.nullcontext()
        with ctx:
            loss = loss_fn(module(*args, **kwargs))
            loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def _plan_for(
    graph: Any, mesh: str, method: str, memory_fraction: float, plan_json: str | None
) -> tuple[Any, float]:
    """(the plan to run, the unconstrained plan's memory per device): `plan_json` when given,
    else `method`'s plan under `memory_fraction` of its unconstrained memory."""
    from shardplan.search.api import plan as make_plan

    if plan_json is not None:  # a plan made elsewhere for this module (verify --user-module)
        from shardplan.exporters.plan_json import from_json

        plan = from_json(plan_json)
        return plan, plan.cost.memory_per_device
    plan = make_plan(graph, mesh, method=method)
    memory = plan.cost.memory_per_device
    if memory_fraction < 1:
        plan = make_plan(graph, mesh, method=method, memory=memory * memory_fraction)
    return plan, memory


def _parallel_module(engine: str, module: Any, trace: Any, plan: Any) -> tuple[Any, bool]:
    """(`module` parallelized by `engine` for `plan`, whether it runs the plan round by round)."""
    from shardplan.torch.parallelize import parallelize_traced

    if engine == "parallelize":
        parallel = parallelize_traced(module, trace, plan)
        return parallel, parallel.shardplan.per_round
    if engine == "torch_tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module

        from shardplan.exporters.torch_tp import to_torch_tp

        tp = to_torch_tp(plan)  # on the innermost axis; the others replicate the whole batch
        names = plan.mesh.names
        dmesh = init_device_mesh("cpu", plan.mesh.shape, mesh_dim_names=names)
        return parallelize_module(module, dmesh[names[-1]], tp), False
    raise PlanError(f"engine must be 'parallelize' or 'torch_tp', not {engine!r}")


def _param_difference(reference: dict[str, Any], parallel: dict[str, Any]) -> tuple[float, int]:
    """(largest |parallel - reference| over all parameters, parameters sharded in `parallel`)."""
    from torch.distributed.tensor import DTensor

    worst, sharded = 0.0, 0
    for name, value in parallel.items():
        if isinstance(value, DTensor):
            sharded += any(not p.is_replicate() for p in value.placements)
            value = value.full_tensor()
        worst = max(worst, float((value - reference[name]).abs().max()))
    return worst, sharded


def train_worker(
    builder: Callable[..., Any],
    builder_args: Sequence[Any] = (),
    mesh: str = "2x2",
    memory_fraction: float = 0.5,
    steps: int = 3,
    lr: float = 1e-2,
    engine: str = "parallelize",
    method: str = "drec",
    plan_json: str | None = None,
    seed: int = 0,
    dtype: str = "float64",
) -> dict[str, Any] | None:
    """One process of the comparison (see the module docstring); rank 0 returns the report.

    `builder(*builder_args)` returns `(module, args, kwargs)` or `(module, args, kwargs, loss)`
    (default loss: `loss_of`), called after `torch.manual_seed(seed)` with `dtype` as the
    default dtype; the module is converted to `dtype`. `plan_json` (the
    `exporters.plan_json.to_json` of a plan of this module's graph) replaces the planning step.
    """
    import torch
    import torch.distributed as dist

    from shardplan.exporters.plan_json import to_json
    from shardplan.importers.torch import trace_torch

    if dtype not in ("float64", "float32"):
        raise PlanError(f"dtype must be 'float64' or 'float32', not {dtype!r}")
    torch.set_default_dtype(getattr(torch, dtype))
    torch.manual_seed(seed)
    built = builder(*builder_args)
    module, args, kwargs = built[:3]
    loss_fn = built[3] if len(built) > 3 else loss_of
    module = module.to(getattr(torch, dtype))
    reference = copy.deepcopy(module)
    trace = trace_torch(module, args, kwargs)
    graph = trace.result.graph
    plan, memory = _plan_for(graph, mesh, method, memory_fraction, plan_json)
    recorder = _Recorder()

    @_contextmanager
    def measured() -> Any:
        with _byte_mode(recorder):
            yield

    parallel, per_round = _parallel_module(engine, module, trace, plan)
    ref_losses = _train(reference, args, kwargs, loss_fn, steps, lr)
    par_losses = _train(parallel, args, kwargs, loss_fn, steps, lr, measured)
    ref_state = reference.state_dict()
    worst, sharded = _param_difference(ref_state, parallel.state_dict())
    if dist.get_rank() != 0:
        return None
    counts = {k: int(v[0]) for k, v in recorder.kinds.items()}
    return {
        "engine": engine,
        "method": method,
        "mesh": mesh,
        "per_round": per_round,
        "memory_unconstrained": memory,
        "memory_planned": plan.cost.memory_per_device,
        "sharded_params": sharded,
        "params": len(ref_state),
        "reference_losses": ref_losses,
        "parallel_losses": par_losses,
        "max_param_error": worst,
        "measured_counts": counts,
        "measured_bytes": {k: v[1] for k, v in recorder.kinds.items()},
        "predicted_bytes": predicted_bytes(plan),
        "plan": to_json(plan),
    }


def _contextmanager(fn: Callable[..., Any]) -> Callable[..., Any]:
    import contextlib

    return contextlib.contextmanager(fn)


def comm_table(report: dict[str, Any]) -> str:
    """Markdown: per collective kind, measured count and bytes next to the predicted bytes."""
    lines = [
        "| kind | measured count | measured bytes/device | predicted bytes/device |",
        "|---|---:|---:|---:|",
    ]
    for kind in KINDS:
        pred = report["predicted_bytes"][kind] if kind in _PREDICTED else None
        lines.append(
            f"| {kind} | {report['measured_counts'][kind]} | "
            f"{units.nbytes(report['measured_bytes'][kind])} | "
            f"{'not modelled' if pred is None else units.nbytes(pred)} |"
        )
    return "\n".join(lines)


def train_many(configs: Sequence[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """`train_worker(**config)` for several configs in one set of processes (start-up once);
    a config that raises a ShardplanError gives `{"error": message}` instead of a report."""
    from shardplan.errors import ShardplanError

    out: list[dict[str, Any] | None] = []
    for config in configs:
        try:
            out.append(train_worker(**config))
        except ShardplanError as e:
            out.append({"error": f"{type(e).__name__}: {e}"})
    return out


__all__ = [
    "KINDS",
    "comm_table",
    "hf_model",
    "kind_of",
    "loss_of",
    "predicted_bytes",
    "train_many",
    "train_worker",
]
