"""One image pipeline, one batch at a time, on a thread of its own: admission by queue size
and queue timeout, and cancellation between denoising steps."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial

from mlxcel.engine.handle import Cancellable
from mlxcel.engine.image_types import (
    GenerationCancelled,
    ImageEvent,
    ImageGenerator,
    ImageJob,
    ImageResult,
)
from mlxcel.engine.scheduler import SchedulerLimits
from mlxcel.engine.types import EngineError

logger = logging.getLogger(__name__)

SHUTTING_DOWN = "the server is shutting down"

ImageUpdate = ImageEvent | ImageResult | EngineError


class ImageHandle(Cancellable):
    """The asyncio side of one image request: progress, previews, then the result."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(request_id)
        self._loop = loop
        self._events: asyncio.Queue[ImageUpdate] = asyncio.Queue()
        self._started = asyncio.Event()

    def _on_loop(self, callback: Callable[..., object], *args: object) -> None:
        """Run `callback(*args)` on the event loop; cancel the request if the loop is gone."""
        try:
            self._loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:
            self.cancel()

    def deliver(self, update: ImageUpdate) -> None:
        """Called from the pipeline's thread: hand an update to the event loop."""
        self._on_loop(self._events.put_nowait, update)

    def mark_started(self) -> None:
        """Called from the pipeline's thread when the batch leaves the queue."""
        self._on_loop(self._started.set)

    async def started(self, timeout: float) -> None:
        """Wait until the batch leaves the queue; after `timeout` seconds (0: forever) give up
        on it with EngineError(code='server_busy')."""
        try:
            await asyncio.wait_for(self._started.wait(), timeout or None)
        except asyncio.TimeoutError:
            self.cancel()
            message = f"the request waited more than {timeout:g}s for the pipeline"
            raise EngineError(message, "server_busy") from None

    async def updates(self) -> AsyncIterator[ImageEvent | ImageResult]:
        """Progress and previews, then the result; an engine error is raised."""
        while True:
            update = await self._events.get()
            if isinstance(update, EngineError):
                raise update
            yield update
            if isinstance(update, ImageResult):
                return


def _about(handle: ImageHandle) -> dict[str, str]:
    return {"request_id": handle.request_id}


@dataclass(frozen=True)
class _Request:
    handle: ImageHandle
    job: ImageJob


class ImageQueue:
    """Owns one ImageGenerator on its own thread; nothing else may call into it."""

    def __init__(self, generator: ImageGenerator, *, limits: SchedulerLimits, name: str) -> None:
        self._generator = generator
        self._limits = limits
        self._waiting: deque[_Request] = deque()
        self._busy = False
        self._wakeup = threading.Condition()
        self._stopped: EngineError | None = None
        """Once the queue stops: what the batch running and those waiting end with."""
        self._thread = threading.Thread(target=self._run, name=f"images-{name}", daemon=True)

    def start(self) -> None:
        """Start the pipeline's thread."""
        self._thread.start()

    def stop(self, error: EngineError | None = None) -> None:
        """Stop the batch running now at its next step and end the thread: it, the waiting
        requests and any submitted after get `error` (by default a `shutting_down` one)."""
        with self._wakeup:
            if self._stopped is None:
                self._stopped = error or EngineError(SHUTTING_DOWN, "shutting_down")
            self._wakeup.notify()
        self._thread.join(timeout=60)

    @property
    def queue_timeout(self) -> float:
        """Seconds a request may wait for the pipeline (0: forever)."""
        return self._limits.queue_timeout

    def submit(self, request_id: str, job: ImageJob) -> ImageHandle:
        """Queue a batch (all of a request's images); EngineError(code='server_busy') when the
        queue is full, the queue's stop error once it has stopped."""
        handle = ImageHandle(request_id, asyncio.get_running_loop())
        with self._wakeup:
            if self._stopped is not None:
                raise self._stopped
            room = self._limits.queue_size + (0 if self._busy else 1)
            if len(self._waiting) >= room:
                raise EngineError("the server is busy: the image queue is full", "server_busy")
            self._waiting.append(_Request(handle, job))
            self._wakeup.notify()
        handle.when_cancelled(partial(self._withdraw, handle))
        return handle

    def _withdraw(self, handle: ImageHandle) -> None:
        """A request was cancelled: a waiting one leaves the queue now, so the queue holds only
        live requests; a running one stops at its next step."""
        with self._wakeup:
            left = deque(r for r in self._waiting if r.handle is not handle)
            if len(left) < len(self._waiting):
                logger.info("cancelled while waiting for the pipeline", extra=_about(handle))
            self._waiting = left

    def _run(self) -> None:
        while True:
            request = self._next()
            if isinstance(request, EngineError):
                break
            self._serve(request)
        with self._wakeup:
            waiting, self._waiting = list(self._waiting), deque()
        for left in waiting:
            # Out of the queue, so that its route stops waiting for the pipeline and reads it.
            left.handle.mark_started()
            left.handle.deliver(request)

    def _next(self) -> _Request | EngineError:
        """The next request to run, skipping those given up on; the stop error to stop."""
        with self._wakeup:
            while self._stopped is None:
                while self._waiting:
                    request = self._waiting.popleft()
                    if not request.handle.cancelled:
                        self._busy = True
                        request.handle.mark_started()
                        return request
                self._wakeup.wait(timeout=0.5)
            return self._stopped

    def _gives_up(self, handle: ImageHandle) -> bool:
        """Whether to stop a batch: its client went away, or the server is stopping."""
        return handle.cancelled or self._stopped is not None

    def _serve(self, request: _Request) -> None:
        handle, job = request.handle, request.job
        about = _about(handle)
        started = time.monotonic()
        try:
            result = self._generator.generate(job, handle.deliver, lambda: self._gives_up(handle))
        except GenerationCancelled:
            if not handle.cancelled and self._stopped is not None:
                logger.info("image batch ended: the server is stopping", extra=about)
                handle.deliver(self._stopped)
                return
            logger.info("image batch cancelled", extra=about)
            handle.deliver(EngineError("cancelled", "cancelled"))
        except EngineError as exc:
            # The engine could not run it (its worker died): the error says why.
            logger.warning("image batch failed: %s", exc, extra=about)
            handle.deliver(exc)
        except Exception as exc:
            logger.exception("image batch failed", extra=about)
            handle.deliver(EngineError(str(exc) or type(exc).__name__))
        else:
            logger.info(
                "%d image(s) of %dx%d in %d steps, %.2fs",
                job.n,
                job.width,
                job.height,
                result.steps,
                time.monotonic() - started,
                extra=about,
            )
            handle.deliver(result)
        finally:
            with self._wakeup:
                self._busy = False
