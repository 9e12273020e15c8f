"""D-Rec on the stage segments in a worker process, beside the training-step search.

The step search plans each distinct stage segment with D-Rec (once per segment structure, stage
mesh and micro-batch count) and prices every family of every chunk; D-Rec's runs depend on
nothing the pricing computes. On a machine with more than one core, a search whose model has at
least `MIN_OPS` ops, or whose first layout took `SLOW_LAYOUT` seconds or more (a search of
seconds either way), starts one worker: a fresh interpreter (`python -c`, never a fork, as torch
may have run in this one; and not `multiprocessing`'s spawn, which would run the caller's
unguarded script again in the child) that is sent segments `_AHEAD` at a time and answers each
with D-Rec's strategies. A profiler queues its segments when it is made, and the search makes
the profiler of the group next in line before pricing the current one (`search._Search.warm`),
so the worker plans ahead; the search prices the expert families meanwhile and, when a D-Rec
family needs a segment the worker has not answered, plans the queued segments not sent yet
itself, from the back of the queue, until the answer is in: each segment is planned once, by
whichever process is free. D-Rec is deterministic, so the strategies, and the plan, are those
of an in-process run. A worker that cannot start, dies or
is sent what does not pickle leaves the rest in process (an error D-Rec itself raises is raised
there again). When the search ends the worker is ended and reaped. Cost: one interpreter start
(while the first layouts are bounded) and one pickle per segment each way.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import threading
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any

from shardplan.cost import CostOptions
from shardplan.ir.graph import Graph
from shardplan.mesh import Mesh
from shardplan.sharding import Strategy

Planner = Callable[[Graph, Mesh, CostOptions], tuple[Strategy, ...]]
"""A segment's strategies in op order (D-Rec's, as the worker's `serve` gives them)."""

MIN_OPS = 1000
"""Models this large take the search seconds: a worker pays for its start. Smaller ones (tests,
small models) plan in process."""

SLOW_LAYOUT = 0.1
"""A smaller model's search starts the worker once a layout took this long to evaluate: its
other layouts will take seconds, and the worker's start (about 0.3 s of the other core) pays."""

_SERVE = "import pickle, sys; sys.path[:0] = pickle.load(sys.stdin.buffer); " + (
    "from shardplan.search.step.workers import serve; serve()"
)
_READY = -1
"""The job id of the worker's first message: idle, nothing answered yet."""
_AHEAD = 2
"""Segments with the worker at once: the next one waits in its pipe while it answers one (an
answer reaches this process's reader thread only when the search yields the interpreter)."""


def serve() -> None:
    """The worker's loop: says it is idle (with the answer to the last job: its strategies in op
    order, or the error D-Rec raised), then plans the (job id, graph, mesh, options) it is
    sent, until its stdin closes."""
    from shardplan.search.drec.search import drec

    source, sink = sys.stdin.buffer, sys.stdout.buffer
    answer: tuple[int, Any] = (_READY, None)
    while True:
        pickle.dump(answer, sink)
        sink.flush()
        try:
            job, graph, mesh, opts = pickle.load(source)
        except EOFError:
            return
        try:
            found = drec(graph, mesh, opts)
            answer = (job, tuple(found[op.name] for op in graph.ops))
        except Exception as e:  # sent back: the search plans the segment in process instead
            answer = (job, e)


class SegmentWorkers:
    """At most one worker process and its jobs, keyed by the caller (`StageProfiler`'s D-Rec
    cache keys): `submit` queues a segment, `take` gives its strategies or None (the caller
    plans it: never queued, or failed in the worker)."""

    def __init__(self, enabled: bool) -> None:
        self._futures: dict[Hashable, Future[Any]] = {}  # queued or sent, by key
        self._queue: deque[tuple[int, Hashable, Future[Any], Any]] = deque()  # not sent yet
        self._sent: dict[int, Future[Any]] = {}  # job id -> its answer, sent
        self._ids = 0
        self._ready = False  # the worker has started
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._started = False
        if enabled:
            self.start()

    def start(self) -> None:
        """Start the worker (once; nothing on one core): segments submitted from now on go to
        it. A search may start it late, once its layouts prove slow (`search._Search`)."""
        if self._started or (os.cpu_count() or 1) < 2:
            return
        self._started = True
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-c", _SERVE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
            )
            self._write(list(sys.path))  # the same shardplan as this process imports
        except (OSError, ValueError):  # no interpreter to start (an embedded Python)
            self._proc = None
            return
        self._reader = threading.Thread(target=self._read, args=(self._proc,), daemon=True)
        self._reader.start()

    @property
    def active(self) -> bool:
        """Whether a worker takes segments."""
        return self._proc is not None

    def __contains__(self, key: Hashable) -> bool:
        return key in self._futures

    def _write(self, message: Any) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        pickle.dump(message, self._proc.stdin)
        self._proc.stdin.flush()

    def _dispatch(self) -> None:
        """Send queued segments until `_AHEAD` are with the worker (under the lock); one that
        does not pickle is answered None (planned in process) and the next one is tried."""
        while self._ready and len(self._sent) < _AHEAD and self._queue and self._proc is not None:
            entry = self._queue.popleft()
            job, _, future, message = entry
            try:
                self._write((job, *message))
            except (pickle.PickleError, AttributeError, TypeError):
                future.set_result(None)
                continue
            except OSError:  # the worker is gone: `_read` answers the rest
                self._queue.appendleft(entry)
                return
            self._sent[job] = future

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        """Each answer resolves its job and hands the worker the next queued segment; when the
        worker ends, everything not answered is answered None and the worker is reaped."""
        stream = proc.stdout
        while stream is not None:
            try:
                job, reply = pickle.load(stream)
            except Exception:  # EOF or a broken answer: the worker is gone
                break
            with self._lock:
                future = self._sent.pop(job, None)
                if future is not None:
                    future.set_result(reply)
                self._ready = True
                self._dispatch()
        with self._lock:
            self._proc, self._ready = None, False
            for future in [*(q[2] for q in self._queue), *self._sent.values()]:
                future.set_result(None)
            self._queue.clear()
            self._sent.clear()
        proc.wait()

    def submit(self, key: Hashable, graph: Graph, mesh: Mesh, opts: CostOptions) -> None:
        """Queue one segment for the worker (nothing when there is none or it has the key)."""
        with self._lock:
            if self._proc is None or key in self._futures:
                return
            future: Future[Any] = Future()
            self._futures[key] = future
            self._queue.append((self._ids, key, future, (graph, mesh, opts)))
            self._ids += 1
            self._dispatch()

    def take(self, key: Hashable, plan: Planner) -> tuple[Strategy, ...] | None:
        """The strategies of the segment queued under `key`, or None when the caller should
        plan it (never queued, or failed in the worker). While it is not answered, this process
        plans the queued segments the worker has not been sent, from the back of the queue
        (`plan`: graph, mesh, options -> strategies in op order), so both work until it is."""
        with self._lock:
            future = self._futures.pop(key, None)
        if future is None:
            return None
        while not future.done():
            with self._lock:
                entry = self._queue.pop() if self._queue else None
            if entry is None:
                break
            other, (graph, mesh, opts) = entry[2], entry[3]
            try:
                other.set_result(plan(graph, mesh, opts))
            except Exception as e:  # raised again when that segment is planned by its caller
                other.set_result(e)
        reply = future.result()
        return reply if isinstance(reply, tuple) else None

    def close(self) -> None:
        """End the worker (the search is done: what it still holds is not needed) and reap it,
        so its CPU time counts as this process's children's."""
        with self._lock:
            proc = self._proc
        if proc is None:
            return
        proc.kill()
        if self._reader is not None:
            self._reader.join(timeout=5.0)


__all__ = ["MIN_OPS", "SLOW_LAYOUT", "SegmentWorkers", "serve"]
