"""D-Rec on the stage segments in a worker process, beside the training-step search.

The step search plans each distinct stage segment with D-Rec (once per segment structure, stage
mesh and micro-batch count) and prices every family of every chunk; D-Rec's runs depend on
nothing the pricing computes. On a machine with more than one core, a search whose model has at
least `MIN_OPS` ops starts one worker: a fresh interpreter (`python -c`, never a fork, as torch
may have run in this one; and not `multiprocessing`'s spawn, which would run the caller's
unguarded script again in the child), fed pickled segments on its stdin. A profiler sends its
segments when it is made; the search prices the expert families meanwhile and takes D-Rec's
strategies when a D-Rec family needs them. D-Rec is deterministic, so the strategies, and the
plan, are those of an in-process run. A worker that cannot start, dies or is sent what does not
pickle leaves the rest in process (an error D-Rec itself raises is raised there again). When the
search ends the worker is ended and reaped. Cost: one interpreter start (about half a second,
while the first layouts are bounded) and one pickle per segment each way.
"""

from __future__ import annotations

import os
import pickle
import queue
import subprocess
import sys
import threading
from collections.abc import Hashable
from concurrent.futures import Future
from typing import IO, Any

from shardplan.cost import CostOptions
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.sharding import Strategy

MIN_OPS = 1000
"""Models this large take the search seconds: a worker pays for its start. Smaller ones (tests,
small models) plan in process."""

_SERVE = "import pickle, sys; sys.path[:0] = pickle.load(sys.stdin.buffer); " + (
    "from shardplan.search.step.workers import serve; serve()"
)


def serve() -> None:
    """The worker's loop: (job id, graph, mesh, options) in, (job id, strategies in op order or
    the error) out, until its stdin closes."""
    from shardplan.search.drec.search import drec

    source, sink = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            job, graph, mesh, opts = pickle.load(source)
        except EOFError:
            return
        try:
            found = drec(graph, mesh, opts)
            reply: Any = tuple(found[op.name] for op in graph.ops)
        except Exception as e:  # sent back: the search plans the segment in process instead
            reply = e
        pickle.dump((job, reply), sink)
        sink.flush()


class SegmentWorkers:
    """At most one worker process and its jobs, keyed by the caller (`StageProfiler`'s D-Rec
    cache keys); `take` gives a job's strategies, or None when the caller should plan the
    segment itself."""

    def __init__(self, enabled: bool) -> None:
        self.jobs: dict[Hashable, Future[Any]] = {}
        self._by_id: dict[int, Future[Any]] = {}
        self._sent = 0  # job ids
        self._lock = threading.Lock()
        self._gone = False  # the worker ended: what is submitted after is planned in process
        self._outbox: queue.SimpleQueue[Any] = queue.SimpleQueue()  # written by `_write`
        self._proc: subprocess.Popen[bytes] | None = None
        self._threads: list[threading.Thread] = []
        if not enabled or (os.cpu_count() or 1) < 2:
            return
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _SERVE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
        except OSError:
            return
        self._outbox.put(list(sys.path))  # the same shardplan as this process imports
        self._threads = [  # a full pipe never blocks the search
            threading.Thread(target=loop, args=(self._proc,), daemon=True)
            for loop in (self._read, self._write)
        ]
        for thread in self._threads:
            thread.start()

    @property
    def active(self) -> bool:
        """Whether a worker takes segments."""
        return self._proc is not None

    def _write(self, proc: subprocess.Popen[bytes]) -> None:
        """Send what `submit` queues, in order; None (`close`) closes the worker's stdin."""
        stdin = proc.stdin
        while stdin is not None:
            message = self._outbox.get()
            try:
                if message is None:
                    stdin.close()
                    return
                pickle.dump(message, stdin)
                stdin.flush()
            except (pickle.PickleError, AttributeError, TypeError):  # this job: done here
                self._fail(message[0])
            except OSError:  # the worker is gone: `_read` fails what is pending
                return

    def _fail(self, job: int) -> None:
        with self._lock:
            future = self._by_id.pop(job, None)
        if future is not None:
            future.set_result(None)

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        """Resolve each job's future as its reply arrives; when the worker ends, fail the rest
        and reap it."""
        stream: IO[bytes] | None = proc.stdout
        while stream is not None:
            try:
                job, reply = pickle.load(stream)
            except Exception:  # EOF or a broken reply: the worker is gone
                break
            with self._lock:
                future = self._by_id.pop(job, None)
            if future is not None:
                future.set_result(reply)
        with self._lock:
            pending, self._by_id, self._gone = list(self._by_id.values()), {}, True
        for future in pending:
            future.set_result(None)
        proc.wait()

    def submit(self, key: Hashable, graph: Graph, mesh: Mesh, opts: CostOptions) -> None:
        """Queue one segment for the worker (nothing when there is none or it has the key)."""
        if self._proc is None or key in self.jobs:
            return
        future: Future[Any] = Future()
        self.jobs[key] = future
        with self._lock:
            if self._gone:
                future.set_result(None)
                return
            job, self._sent = self._sent, self._sent + 1
            self._by_id[job] = future
        self._outbox.put((job, graph, mesh, opts))

    def take(self, key: Hashable) -> tuple[Strategy, ...] | None:
        """The strategies of the segment sent under `key` (waiting for them), or None: not
        sent, or the worker failed it (the caller plans it in process)."""
        future = self.jobs.pop(key, None)
        if future is None:
            return None
        reply = future.result()
        return reply if isinstance(reply, tuple) else None

    def close(self) -> None:
        """End the worker (the search is done: what it still holds is not needed) and reap it,
        so its CPU time counts as this process's children's."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        self._outbox.put(None)
        proc.kill()
        for thread in self._threads:
            thread.join(timeout=5.0)


__all__ = ["MIN_OPS", "SegmentWorkers", "serve"]
