"""One DeepSpeed training step on CPU with gloo under an exported config (run once per rank).

`python deepspeed_step.py RANK WORLD PORT CONFIG.json` initialises DeepSpeed (gloo on
127.0.0.1:PORT), wraps a tiny torch MLP that stands in for the planned model with a plain
torch AdamW (so no DeepSpeed op is compiled), runs `gradient_accumulation_steps` micro-batches of
`train_micro_batch_size_per_gpu` samples and prints one JSON line: the optimizer steps DeepSpeed
took, its batch settings, ZeRO stage, ZeRO-3 prefetch bucket and the final loss.
"""

from __future__ import annotations

import json
import os
import sys
import warnings


def main(rank: int, world: int, port: int, path: str) -> None:
    warnings.simplefilter("ignore")
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # a CPU kernel, unrelated
    import deepspeed
    import torch

    cfg = json.loads(open(path).read())
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    deepspeed.init_distributed(dist_backend="gloo")
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)
    dtype = torch.bfloat16 if cfg.get("bf16", {}).get("enabled") else torch.float32
    torch.manual_seed(1 + rank)
    loss = None
    for _ in range(engine.gradient_accumulation_steps()):
        x = torch.randn(engine.train_micro_batch_size_per_gpu(), 16, dtype=dtype)
        loss = engine(x).float().pow(2).mean()
        engine.backward(loss)
        engine.step()
    result = {
        "rank": rank,
        "optimizer_steps": engine.global_steps,
        "train_batch_size": engine.train_batch_size(),
        "gradient_accumulation_steps": engine.gradient_accumulation_steps(),
        "zero_stage": engine.zero_optimization_stage(),
        "prefetch_bucket_size": engine.zero_prefetch_bucket_size(),
        "loss": float(loss.detach()) if loss is not None else None,
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
