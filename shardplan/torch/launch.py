"""`spawn`: run a function on N local gloo processes (CPU) and return what rank 0 returns.

Each process gets MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE, initialises the default process group
(gloo), calls `fn(*args)` and destroys the group; rank 0 pickles its result to a file the parent
reads. `fn` must be importable by name (a module-level function): processes are started with
the "spawn" method. Cost: one interpreter start-up and torch import per process (~5-10 s each on
a small machine), then whatever `fn` does.
"""

from __future__ import annotations

import os
import pickle
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from shardplan.errors import BackendError

DEFAULT_TIMEOUT = 600.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

    name = getattr(fn, "__qualname__", repr(fn))
    workdir = tempfile.mkdtemp(prefix="shardplan-spawn-")
    out = os.path.join(workdir, "result.pkl")
    context = None
    start = time.perf_counter()
    try:
        context = mp.start_processes(
            _entry,
            args=(fn, world_size, _free_port(), out, tuple(args)),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        while not context.join(timeout=1.0):
            if time.perf_counter() - start > timeout:
                raise BackendError(
                    f"{name} on {world_size} processes did not finish within {timeout:.0f}s; "
                    "its processes were terminated (raise timeout=...)"
                )
        with open(out, "rb") as f:
            return pickle.load(f)
    except ProcessRaisedException as e:
        lines = str(e).strip().splitlines()
        raise BackendError(
            f"{name} failed on rank {e.error_index}: {lines[-1] if lines else e!r}\n"
            + "\n".join(lines[-40:-1])
        ) from None
    except ProcessExitedException as e:
        raise BackendError(f"{name}: rank {e.error_index} exited with code {e.exit_code}") from None
    finally:
        if context is not None:
            for p in context.processes:
                if p.is_alive():
                    p.terminate()
            for p in context.processes:
                p.join(5)
        shutil.rmtree(workdir, ignore_errors=True)


__all__ = ["DEFAULT_TIMEOUT", "spawn"]
