"""One replica of a model on a Ray cluster: a Ray Serve replica actor that runs the model's
worker process, `python -m mlxcel.worker`, as the HTTP process runs it for a local model
(`models/remote.Worker`, the same services over the same wire), and relays calls and streams
to it from the HTTP process's deployment handle.

Imported only by `--ray` (`models/ray_worker.py`) and, by reference, in Ray's replica actors.
A replica whose worker process ends fails its streams in flight (their last item is the
`WorkerGone`), then ends, so Ray replaces it.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import ray
from ray import serve

from mlxcel.engine.handle import call_on_loop, ends
from mlxcel.engine.metrics import RECORDED, RecordsMetrics
from mlxcel.models.ray_series import Record
from mlxcel.models.remote import Worker, WorkerGone
from mlxcel.wire.messages import Setup

# Seconds a replica whose worker died lives on, for the errors of its streams to be sent.
EXIT_DELAY_S = 1.0
# What a sequence's relay queues: (sequence index, item, None) for an item, (sequence index,
# None, error) for a sequence that failed; a sequence ends with its `last` item or its error.
Item = tuple[int, Any, BaseException | None]


class _Records:
    """The worker's metric calls, held until a stream of this replica takes them to the HTTP
    process, which applies them to the model's Prometheus series as for a local worker."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[Record] = []

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name not in RECORDED:
            raise AttributeError(name)
        return lambda *args: self._hold((name, args))

    def _hold(self, record: Record) -> None:
        with self._lock:
            self._held.append(record)

    def take(self) -> list[Record]:
        """The calls held since the last take, in order."""
        with self._lock:
            held, self._held = self._held, []
        return held


class _Relay:
    """Where one sequence's items go: the generator's queue on the replica's event loop."""

    def __init__(self, index: int, loop: asyncio.AbstractEventLoop, queue: asyncio.Queue[Item]):
        self.index, self._loop, self._queue = index, loop, queue

    def deliver(self, item: Any) -> None:
        call_on_loop(self._loop, self._queue.put_nowait, (self.index, item, None))

    def fail(self, error: BaseException) -> None:
        call_on_loop(self._loop, self._queue.put_nowait, (self.index, None, error))


class ModelReplica:
    """The deployment's class: the model loads when Ray starts the replica."""

    def __init__(self, setup: Setup) -> None:
        self._gone: str | None = None
        self._records = _Records()
        self._worker, self._facts = Worker.start(
            setup.config, setup, cast(RecordsMetrics, self._records), self._on_exit
        )

    def _on_exit(self, worker: Worker, reason: str) -> None:
        """The worker process ended: its streams have their error; a moment later (for them
        to reach their callers) the actor ends too, and Ray starts another replica at once
        rather than after failed health checks."""
        self._gone = reason
        threading.Timer(EXIT_DELAY_S, os._exit, (1,)).start()

    def facts(self) -> Any:
        """The model's facts, as its worker sent them."""
        return self._facts

    def describe(self) -> dict[str, Any]:
        """Which replica this is: its worker's pid, the actor's, and the node's address."""
        return {
            "replica": serve.get_replica_context().replica_id.unique_id,
            "pid": self._worker.pid,
            "actor_pid": os.getpid(),
            "node": ray.util.get_node_ip_address(),
        }

    async def call(self, method: str, args: tuple[Any, ...]) -> Any:
        """A call to the model (tokenizing, the slots, the prompt cache)."""
        return await asyncio.to_thread(self._worker.call, method, *args)

    async def stream(
        self, method: str, args: tuple[Any, ...], count: int, **routing: Any
    ) -> AsyncIterator[Any]:
        """Start `count` sequences on the worker and yield first which replica this is, then
        each queued `Item` with the metric calls the worker made since a stream last took them
        (a turn's calls come before its tokens, so a request's last item carries its own);
        `routing` is the router's (`models/ray_router.py`). Cancelled, it cancels them."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Item] = asyncio.Queue()
        relays = [_Relay(i, loop, queue) for i in range(count)]
        yield {**self.describe(), "decision": routing.get("decision")}
        try:
            ids = self._worker.stream(method, args, relays)
        except WorkerGone as exc:
            for i in range(count):
                yield (i, None, exc, self._records.take())
            return
        open_ = set(range(count))
        try:
            while open_:
                index, item, error = await queue.get()
                if error is not None or ends(item):
                    open_.discard(index)
                yield (index, item, error, self._records.take())
        finally:
            for index in open_:
                self._worker.cancel(ids[index])

    def check_health(self) -> None:
        """Ray's health check: failed once the worker process has ended."""
        if self._gone is not None:
            raise RuntimeError(self._gone)

    def __del__(self) -> None:
        if self._gone is None and hasattr(self, "_worker"):
            self._worker.stop()
