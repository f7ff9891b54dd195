"""One engine thread per model: admits requests, steps all running sequences together."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from mlxcel.engine.text import IncrementalText, StopMatcher
from mlxcel.engine.types import (
    EngineError,
    Feed,
    Sample,
    SamplingParams,
    TextGenerator,
    TokenEvent,
    TokenLogprob,
)

logger = logging.getLogger(__name__)


class RequestHandle:
    """The asyncio side of one request: its events, and a way to cancel it."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        self.request_id = request_id
        self._loop = loop
        self._events: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self._cancelled = threading.Event()

    @property
    def cancelled(self) -> bool:
        """Whether the client went away or the server gave up on this request."""
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop generating for this request at the next step."""
        self._cancelled.set()

    def deliver(self, event: TokenEvent) -> None:
        """Called from the engine thread: hand an event to the event loop."""
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:
            self.cancel()

    async def events(self) -> AsyncIterator[TokenEvent]:
        """Events until the one that carries a finish reason or an error."""
        while True:
            event = await self._events.get()
            yield event
            if event.finish_reason is not None or event.error is not None:
                return


@dataclass
class _Job:
    handle: RequestHandle
    prompt: list[int]
    params: SamplingParams


@dataclass
class _Running:
    job: _Job
    slot: int
    fed: int = 0
    generated: int = 0
    last_token: int = -1
    text: IncrementalText = field(default_factory=IncrementalText)
    stops: StopMatcher = field(init=False)
    logprobs: list[TokenLogprob] = field(default_factory=list)

    def __post_init__(self) -> None:
        params = self.job.params
        self.stops = StopMatcher(params.stop, include_stop=params.include_stop_str)

    def take_logprobs(self) -> tuple[TokenLogprob, ...]:
        """Log-probabilities gathered since the last event."""
        taken, self.logprobs = tuple(self.logprobs), []
        return taken

    @property
    def prefilling(self) -> bool:
        return self.fed < len(self.job.prompt)


class Scheduler:
    """Owns one TextGenerator on its own thread; nothing else may call into it."""

    def __init__(self, generator: TextGenerator, *, queue_size: int, name: str) -> None:
        self._generator = generator
        self._waiting: queue.Queue[_Job | None] = queue.Queue(maxsize=max(1, queue_size))
        self._free_slots = list(range(generator.n_slots))
        self._running: list[_Running] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=f"engine-{name}", daemon=True)

    def start(self) -> None:
        """Start the engine thread."""
        self._thread.start()

    def stop(self) -> None:
        """Finish the engine thread; running requests end with an error."""
        self._stopping = True
        with contextlib.suppress(queue.Full):
            self._waiting.put_nowait(None)
        self._thread.join(timeout=30)

    def submit(self, request_id: str, prompt: list[int], params: SamplingParams) -> RequestHandle:
        """Queue a request; raises EngineError(code='server_busy') when the queue is full."""
        handle = RequestHandle(request_id, asyncio.get_running_loop())
        try:
            self._waiting.put_nowait(_Job(handle, prompt, params))
        except queue.Full:
            raise EngineError("the server is busy: request queue is full", "server_busy") from None
        return handle

    def _run(self) -> None:
        while not self._stopping:
            self._admit(block=not self._running)
            self._drop_cancelled()
            if self._running:
                self._step()
        for running in self._running:
            self._finish(running, "", error=EngineError("the server is shutting down"))

    def _admit(self, *, block: bool) -> None:
        while self._free_slots:
            try:
                job = self._waiting.get(block=block, timeout=0.5 if block else None)
            except queue.Empty:
                return
            if job is None:
                return
            block = False
            if job.handle.cancelled:
                continue
            slot = self._free_slots.pop(0)
            try:
                self._generator.open_slot(slot, job.params)
            except Exception as exc:
                logger.exception("[%s] could not open a slot", job.handle.request_id)
                self._free_slots.append(slot)
                job.handle.deliver(TokenEvent("", (), error=EngineError(str(exc))))
                continue
            self._running.append(_Running(job, slot))

    def _drop_cancelled(self) -> None:
        for running in [r for r in self._running if r.job.handle.cancelled]:
            logger.info(
                "[%s] cancelled after %d tokens", running.job.handle.request_id, running.generated
            )
            self._release(running)

    def _feeds(self) -> list[Feed]:
        feeds = [Feed(r.slot, (r.last_token,), True) for r in self._running if not r.prefilling]
        budget = max(1, self._generator.max_feed_tokens - len(feeds))
        for r in self._running:
            if r.prefilling and budget > 0:
                chunk = r.job.prompt[r.fed : r.fed + budget]
                budget -= len(chunk)
                feeds.append(Feed(r.slot, chunk, r.fed + len(chunk) == len(r.job.prompt)))
        return feeds

    def _step(self) -> None:
        feeds = self._feeds()
        try:
            samples = self._generator.step(feeds)
        except Exception as exc:
            logger.exception("engine step failed")
            for running in list(self._running):
                self._finish(running, "", error=EngineError(f"generation failed: {exc}"))
            return
        by_slot = {r.slot: r for r in self._running}
        for feed, sample in zip(feeds, samples, strict=True):
            running = by_slot[feed.slot]
            running.fed += len(feed.tokens) if running.prefilling else 0
            if sample is not None:
                self._on_token(running, sample)

    def _on_token(self, running: _Running, sample: Sample) -> None:
        generator = self._generator
        params = running.job.params
        token = sample.token
        if token in params.stop_token_ids or (
            generator.is_end_of_generation(token) and not params.ignore_eos
        ):
            reason = "token" if token in params.stop_token_ids else "eos"
            running.generated += 1
            tail = running.text.flush() + running.stops.flush()
            self._finish(running, tail, "stop", stop_reason=reason)
            return
        running.generated += 1
        running.last_token = token
        piece = generator.token_bytes(token)
        if sample.logprob is not None:
            top = tuple((t, generator.token_bytes(t), lp) for t, lp in sample.top)
            running.logprobs.append(TokenLogprob(token, piece, sample.logprob, top))
        text, stopped = running.stops.push(running.text.push(piece))
        if stopped:
            self._finish(running, text, "stop", stop_reason="word")
        elif running.generated >= params.max_tokens or (
            len(running.job.prompt) + running.generated >= generator.n_ctx_seq
        ):
            tail = running.stops.push(running.text.flush())[0] + running.stops.flush()
            self._finish(running, text + tail, "length", stop_reason="limit")
        elif text:
            running.job.handle.deliver(TokenEvent(text, (token,), logprobs=running.take_logprobs()))

    def _finish(
        self,
        running: _Running,
        text: str,
        reason: str | None = None,
        error: EngineError | None = None,
        stop_reason: str | None = None,
    ) -> None:
        running.job.handle.deliver(
            TokenEvent(
                text,
                (),
                finish_reason=reason,
                prompt_tokens=len(running.job.prompt),
                completion_tokens=running.generated,
                error=error,
                logprobs=running.take_logprobs(),
                stop_reason=stop_reason,
                stop_word=running.stops.matched if stop_reason == "word" else None,
            )
        )
        self._release(running)

    def _release(self, running: _Running) -> None:
        self._running.remove(running)
        try:
            self._generator.close_slot(running.slot)
        finally:
            self._free_slots.append(running.slot)
