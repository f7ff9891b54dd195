"""Batching across requests for encoder models: concurrent requests' inputs are packed into
shared forward passes by token budget (as Text Embeddings Inference does), on one engine thread.

While a batch runs, new requests queue; the next batch takes every queued request that fits
the budget, so sixteen clients sending one sentence each cost two forward passes, not sixteen."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from mlxcel.engine.types import EngineError

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class _Job(Generic[T]):
    items: list[Any]
    future: asyncio.Future[list[T]]
    loop: asyncio.AbstractEventLoop
    tokens: int


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    """Resolve a request's future unless its client has gone (cancelled)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class EncoderBatcher(Generic[T]):
    """One thread that owns an encoder and runs its queued inputs in shared batches."""

    def __init__(
        self,
        run: Callable[[list[Any]], list[T]],
        budget: int,
        name: str,
        cost: Callable[[Any], int] = len,
    ) -> None:
        self._run = run
        self._budget = budget
        self._cost = cost
        """What one input takes of the budget: a text its tokens, an image its patches."""
        self._jobs: deque[_Job[T]] = deque()
        self._ready = threading.Condition()
        self._stopped = False
        self.batches = 0
        """Forward batches run so far (each may hold several requests)."""
        self._thread = threading.Thread(target=self._loop, name=f"encoder-{name}", daemon=True)
        self._thread.start()

    async def submit(self, items: list[Any]) -> list[T]:
        """Each input's result, once a batch holding them has run."""
        if not items:
            return []
        loop = asyncio.get_running_loop()
        tokens = sum(self._cost(item) for item in items)
        job: _Job[T] = _Job(items, loop.create_future(), loop, tokens)
        with self._ready:
            if self._stopped:
                raise RuntimeError("the model is unloading")
            self._jobs.append(job)
            self._ready.notify()
        return await job.future

    def _take(self) -> list[_Job[T]] | None:
        """The queued jobs of the next batch: the oldest, then any that still fit."""
        with self._ready:
            while not self._jobs and not self._stopped:
                self._ready.wait()
            if self._stopped:
                return None
            taken = [self._jobs.popleft()]
            tokens = taken[0].tokens
            while self._jobs and tokens + self._jobs[0].tokens <= self._budget:
                job = self._jobs.popleft()
                taken.append(job)
                tokens += job.tokens
            return taken

    def _loop(self) -> None:
        while (jobs := self._take()) is not None:
            live = [j for j in jobs if not j.future.cancelled()]
            if not live:
                continue
            flat = [item for job in live for item in job.items]
            error: Exception | None
            try:
                results, error = self._run(flat), None
            except EngineError as exc:
                # The engine's own answer (the server is shutting down), not a fault to trace.
                results, error = [], exc
            except Exception as exc:
                logger.exception("encoder batch of %d inputs failed", len(flat))
                results, error = [], exc
            self.batches += 1
            start = 0
            for job in live:
                part = results[start : start + len(job.items)] if error is None else None
                start += len(job.items)
                job.loop.call_soon_threadsafe(_settle, job.future, part, error)

    def stop(self) -> None:
        """End the thread after the batch in progress; queued requests fail."""
        with self._ready:
            self._stopped = True
            pending = list(self._jobs)
            self._jobs.clear()
            self._ready.notify_all()
        for job in pending:
            job.loop.call_soon_threadsafe(
                _settle, job.future, None, RuntimeError("the model was unloaded")
            )
        self._thread.join()
