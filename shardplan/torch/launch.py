"""`spawn`: run a function on N local gloo processes (CPU) and return what rank 0 returns.

Each process gets MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE, initialises the default process group
(gloo), calls `fn(*args)` and destroys the group; rank 0 pickles its result to a file the parent
reads. A rank that succeeded then leaves without interpreter finalization (`exit_fast`): CI saw a
gloo rank abort (SIGABRT, "terminate called without an active exception"; a C++ thread destroyed
while joinable, as in teardown), and finalization costs seconds per process with torch loaded.
`fn` must be importable by name (a module-level function): processes are started with the
"spawn" method. Cost: one interpreter start-up and torch import per process (~5-10 s each on a
small machine), then whatever `fn` does. The launch loop is
`shardplan.engines.spawn.spawn_and_wait`.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Sequence
from typing import Any

from shardplan.engines.spawn import exit_fast, free_port, spawn_and_wait

DEFAULT_TIMEOUT = 600.0


def _entry(
    rank: int, fn: Callable[..., Any], world: int, port: int, out: str, args: Sequence[Any]
) -> None:
    import torch.distributed as dist

    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world)
    )
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = fn(*args)
        if rank == 0:
            with open(out, "wb") as f:
                pickle.dump(result, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    exit_fast()  # only on success: an exception above reaches the parent with its traceback


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    timeout: float = DEFAULT_TIMEOUT,
) -> Any:
    """`fn(*args)` on `world_size` gloo processes; rank 0's (picklable) result.

    Raises:
        BackendError: a rank raised (the tail of its traceback is in the message), exited, or
            the run took longer than `timeout` seconds (its processes are then terminated).
    """
    name = getattr(fn, "__qualname__", repr(fn))
    workdir = tempfile.mkdtemp(prefix="shardplan-spawn-")
    out = os.path.join(workdir, "result.pkl")
    try:
        entry_args = (fn, world_size, free_port(), out, tuple(args))
        spawn_and_wait(_entry, entry_args, world_size, timeout, name, frames=40)
        with open(out, "rb") as f:
            return pickle.load(f)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


__all__ = ["DEFAULT_TIMEOUT", "spawn"]
