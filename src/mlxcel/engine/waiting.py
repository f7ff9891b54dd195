"""The sequences waiting for a slot: admitted a request at a time (all its sequences or none),
withdrawn when cancelled, answered with an error when they waited too long; and the condition
the engine thread sleeps on while nothing is to be done."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from mlxcel.engine.handle import EventSink
from mlxcel.engine.metrics import RecordsMetrics
from mlxcel.engine.sequence import Job, about
from mlxcel.engine.types import EngineError, MediaSpan, SamplingParams, TokenEvent

logger = logging.getLogger(__name__)

Admitted = tuple[EventSink, list[int], SamplingParams, tuple[MediaSpan, ...]]
"""One sequence for `Scheduler.submit`: where its events go, its prompt, its sampling and the
media spans of its prompt."""


@dataclass(frozen=True)
class SchedulerLimits:
    """Admission settings: how many may wait, and for how long (seconds; 0 = forever)."""

    queue_size: int
    queue_timeout: float = 0.0


class WaitingRoom:
    """Jobs in arrival order; `wakeup`'s lock guards them (and the scheduler's slot pool)."""

    def __init__(self, limits: SchedulerLimits, n_slots: int, metrics: RecordsMetrics) -> None:
        self.wakeup = threading.Condition()
        self._jobs: deque[Job] = deque()
        self._limits = limits
        self._n_slots = n_slots
        self._metrics = metrics

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[Job]:
        return iter(self._jobs)

    def add(self, sequences: Sequence[Admitted], free_slots: int) -> None:
        """Queue every sequence of one request or none (holding the lock): raises
        EngineError(code='server_busy') when there is no room for all."""
        limits = self._limits
        most = limits.queue_size + self._n_slots
        if len(sequences) > limits.queue_size + free_slots - len(self._jobs):
            self._metrics.rejected("queue_full")
            if len(sequences) > most:
                message = (
                    f"the request needs {len(sequences)} sequences but the server runs "
                    f"{self._n_slots} and queues {limits.queue_size}"
                )
            else:
                message = "the server is busy: request queue is full"
            raise EngineError(message, "server_busy")
        self._jobs.extend(Job(*sequence) for sequence in sequences)

    def withdraw(self, handle: EventSink) -> bool:
        """A cancelled request's waiting job leaves (holding the lock); whether it was here."""
        job = next((j for j in self._jobs if j.handle is handle), None)
        if job is None:
            return False
        self._jobs.remove(job)
        logger.info("cancelled while waiting for a slot", extra=about(job))
        self._metrics.finished("cancelled")
        return True

    def next_job(self, can_take: Callable[[int], bool], defer: Callable[[Job], bool]) -> Job | None:
        """The first job that is not deferred (`defer`: it waits for a prompt being evaluated,
        engine/sharing.py), if a slot it may take is free (holding the lock), answering the
        ones that waited too long."""
        timeout = self._limits.queue_timeout
        index = 0
        while index < len(self._jobs):
            job = self._jobs[index]
            expired = timeout > 0 and time.monotonic() - job.arrived > timeout
            if not expired and not can_take(job.params.id_slot):
                return None
            if not expired and defer(job):
                index += 1
                continue
            del self._jobs[index]
            if not expired:
                return job
            self._metrics.rejected("queue_timeout")
            message = f"the request waited more than {timeout:g}s for a slot"
            job.handle.deliver(TokenEvent("", (), error=EngineError(message, "server_busy")))
        return None

    def drain(self, error: EngineError) -> None:
        """Answer every waiting job with `error` (holding the lock)."""
        while self._jobs:
            job = self._jobs.popleft()
            self._metrics.finished("error")
            job.handle.deliver(TokenEvent("", (), error=error))
