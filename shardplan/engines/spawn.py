"""Start N local processes with torch.multiprocessing ("spawn") and wait for them, with a deadline.

`spawn_and_wait(entry, args, nprocs, timeout, what)` is the one launch loop behind the DTensor
runner (`torch_dist`), the pipeline runner (`torch_pipeline`) and `shardplan.torch.spawn`:
start `entry(rank, *args)` on `nprocs` processes, poll `join` until all exit or `timeout` seconds
pass, and turn every way a rank can fail into a BackendError naming `what`:
- a rank raised: its exception in one line (the last `frames` lines of its traceback are a note
  on the error, for API callers; the CLI prints the one line);
- a rank exited (killed, `os._exit(n)`): its exit code and signal;
- the deadline passed: the processes are terminated (then killed after 5 s).
Whatever happens, no process is left running when it returns. Cost: one interpreter start-up and
torch import per process (~5-10 s each on a small machine), then whatever `entry` does.
"""

from __future__ import annotations

import datetime
import logging
import os
import re
import socket
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from shardplan.errors import BackendError

_EXCEPTION = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*:")
"""The line of a traceback that names the exception (`torch.OutOfMemoryError: ...`)."""


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for the gloo rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require_gloo(torch: Any) -> None:
    """BackendError unless this torch build has torch.distributed with the gloo backend."""
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        raise BackendError("this torch build has no torch.distributed gloo backend")


def terminate(context: Any) -> None:
    """Terminate the processes of a `start_processes` context still alive; kill the stubborn."""
    for p in context.processes:
        if p.is_alive():
            p.terminate()
    for p in context.processes:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join(5)


def spawn_and_wait(
    entry: Callable[..., None],
    args: Sequence[Any],
    nprocs: int,
    timeout: float,
    what: str,
    frames: int = 8,
) -> None:
    """Run `entry(rank, *args)` on `nprocs` spawned processes; return when all exited cleanly.

    Raises:
        BackendError: a rank raised (the last `frames` lines of its traceback are in the
            message), a rank exited with a non-zero code, or `timeout` seconds passed (the
            processes are then terminated). Every message starts with `what`.
    """
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException

    start = time.perf_counter()
    deadline = start + timeout
    context = None
    try:
        context = mp.start_processes(
            entry, args=tuple(args), nprocs=nprocs, join=False, start_method="spawn"
        )
        # poll at most once a second so a deadline is met within ~1 s
        while not context.join(timeout=max(0.05, min(deadline - time.perf_counter(), 1.0))):
            if time.perf_counter() >= deadline:
                raise BackendError(
                    f"{what} on {nprocs} processes did not finish within {timeout:.0f}s; "
                    "its processes were terminated (raise timeout=...)"
                )
    except ProcessRaisedException as e:
        lines = str(e).strip().splitlines()
        error = BackendError(f"{what} failed on rank {e.error_index}: {_one_line(lines, e)}")
        error.add_note("\n".join(lines[-frames:]))  # the rank's traceback, for API callers
        raise error from None
    except ProcessExitedException as e:
        raise BackendError(
            f"{what}: rank {e.error_index} exited with code {e.exit_code} "
            f"(signal {e.signal_name or '-'})"
        ) from None
    finally:
        if context is not None:
            terminate(context)


def _one_line(lines: list[str], e: BaseException) -> str:
    """A rank's error in one line: the exception (`ValueError: ...`) and, when the traceback
    ends in a note (which node was running), that note."""
    exc = next((x for x in reversed(lines) if _EXCEPTION.match(x)), None)
    if exc is None:
        return lines[-1] if lines else repr(e)
    return exc if lines[-1] == exc else f"{exc} ({lines[-1].strip()})"


# -- the child side ------------------------------------------------------------------------------


def init_gloo(rank: int, world: int, port: int, timeout: float) -> None:
    """In a spawned process: one torch thread, DTensor's chatty loggers quiet, the gloo group up.

    `timeout` (seconds) bounds every collective of the group.
    """
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)  # the processes share the machine's cores
    for noisy in ("_redistribute", "_collective_utils"):  # "suboptimal", "no alltoall on CPU"
        logging.getLogger(f"torch.distributed.tensor.{noisy}").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="torch")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=float(timeout)),
    )


def exit_fast() -> NoReturn:
    """Leave a spawned process that succeeded without interpreter finalization.

    Finalization takes seconds per process with torch loaded; call this only after the results
    are written and the process group destroyed. Failures raise instead, so
    torch.multiprocessing records their traceback for the parent.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


__all__ = [
    "exit_fast",
    "free_port",
    "init_gloo",
    "require_gloo",
    "spawn_and_wait",
    "terminate",
]
