"""One engine thread per model: admits requests, steps all running sequences together."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from functools import partial
from typing import Any

from mlxcel.engine import media
from mlxcel.engine.adapters import (
    AdapterSet,
    EngineCalls,
    SwitchesAdapters,
    Turns,
    adapter_refusal,
    names_in_use,
)
from mlxcel.engine.cache_tiers import CacheTiers
from mlxcel.engine.capabilities import SavesState
from mlxcel.engine.feeds import next_feeds
from mlxcel.engine.handle import EventSink, TurnBatch, Unbatched
from mlxcel.engine.metrics import RecordsMetrics
from mlxcel.engine.scoring import PromptScoring
from mlxcel.engine.sequence import Job, Running, about, slot_reports
from mlxcel.engine.sharing import awaits_prefill, reuse_prefix
from mlxcel.engine.slots import SlotPool, SlotReport, SlotState
from mlxcel.engine.speculation import Speculation
from mlxcel.engine.speculative import SpeculativeConfig
from mlxcel.engine.types import (
    EngineError,
    PromptProgress,
    Sample,
    TextGenerator,
    TokenEvent,
    TokenLogprob,
    possible,
)
from mlxcel.engine.waiting import Admitted, SchedulerLimits, WaitingRoom

logger = logging.getLogger(__name__)

__all__ = ["Admitted", "Scheduler", "SchedulerLimits"]

SlotWork = Callable[[TextGenerator, SlotState], Any]
"""Something done to one idle slot on the engine thread (a slot file's save or restore)."""


class Scheduler:
    """Owns one TextGenerator on its own thread; nothing else may call into it."""

    def __init__(
        self,
        generator: TextGenerator,
        *,
        limits: SchedulerLimits,
        name: str,
        metrics: RecordsMetrics,
        prompt_cache: CacheTiers | None = None,
        speculative: SpeculativeConfig | None = None,
        batch: TurnBatch | None = None,
    ) -> None:
        self._generator = generator
        self._batch = batch or Unbatched()
        self._speculation = Speculation(generator, speculative)
        # Saved slot states, when the generator can save them.
        saves = isinstance(generator, SavesState) and generator.can_save_state
        self._cache = prompt_cache if saves else None
        self._metrics = metrics
        self._waiting = WaitingRoom(limits, generator.n_slots, metrics)
        self._wakeup = self._waiting.wakeup
        self._pool = SlotPool(generator.n_slots)
        self._running: list[Running] = []
        self._turns = Turns()
        self._calls = EngineCalls()
        self.scoring = PromptScoring(generator, self._pool, self._wakeup)
        """Prompts to score between two steps (`submit` from any thread)."""
        self._active: AdapterSet = ()
        self._slot_work: list[tuple[int, SlotWork, Future[Any]]] = []
        self._stopping = False
        self._thread: threading.Thread | None = None

    def run(self) -> None:
        """Serve on the calling thread until `stop`: the thread that opened the generator, so
        that all its compute (warm-up, draft timing, steps) comes from one thread, as llama.cpp's
        OpenMP keeps a thread pool per caller (docs/architecture.md, Measured choices)."""
        self._thread = threading.current_thread()
        self._batch.hold()
        while not self._stopping:
            self._batch.release()  # what the last turn delivered, as one message
            self._calls.run_pending()
            self._do_slot_work()
            self.scoring.run_due(self._use, self._cache)
            self._admit()
            self._drop_cancelled()
            if self._running:
                self._step()
        shutting_down = EngineError("the server is shutting down", "shutting_down")
        self._calls.cancel_all(shutting_down)
        self.scoring.cancel_all(shutting_down)
        for running in list(self._running):
            self._finish(running, "", error=shutting_down)
        with self._wakeup:
            self._waiting.drain(shutting_down)
            self._update_gauges()
            for *_, future in self._slot_work:
                future.set_exception(shutting_down)
        if self._cache is not None and isinstance(self._generator, SavesState):
            # Drained to disk: this engine's states outlive it (SIGTERM, unload, eviction).
            self._cache.drain(self._generator, self._pool.slots, self._metrics)
        self._batch.release()

    def stop(self) -> None:
        """Finish the engine thread; running and waiting requests end with an error."""
        with self._wakeup:
            self._stopping = True
            self._wakeup.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=30)

    def submit(self, sequences: Sequence[Admitted]) -> None:
        """Queue every sequence of one request (its prompts and choices, each with the sink
        its events go to and the media spans of its prompt), or none of them: raises
        EngineError(code='server_busy') when there is no room for all."""
        with self._wakeup:
            self._waiting.add(sequences, self._pool.free_count)
            self._update_gauges()
            self._wakeup.notify()
        for sink, *_ in sequences:
            sink.when_cancelled(partial(self._withdraw, sink))

    def call(self, call: Callable[[], Any]) -> Future[Any]:
        """Run `call` on the engine thread between two steps (loading an adapter)."""
        future = self._calls.submit(call)
        with self._wakeup:
            self._wakeup.notify()
        return future

    def adapters_in_use(self) -> set[str]:
        """The adapters that running or waiting sequences run with (on the engine thread)."""
        with self._wakeup:
            waiting = [job.params.adapters for job in self._waiting]
        return names_in_use([*waiting, *(r.job.params.adapters for r in self._running)])

    def _withdraw(self, handle: EventSink) -> None:
        """A request was cancelled: a waiting one leaves the queue now; a running one is
        dropped by the engine thread, which this wakes."""
        with self._wakeup:
            if self._waiting.withdraw(handle):
                self._update_gauges()
            self._wakeup.notify()

    def slots(self) -> list[SlotReport]:
        """A snapshot for /slots: each slot's state and its request's progress."""
        return slot_reports(self._pool.slots, self._running)

    def when_idle(self, slot: int, work: SlotWork) -> Future[Any]:
        """Do `work` on the engine thread once slot `slot` is free (llama-server defers a slot
        action on a busy slot); its result or exception."""
        future: Future[Any] = Future()
        with self._wakeup:
            self._slot_work.append((slot, work, future))
            self._wakeup.notify()
        return future

    def _do_slot_work(self) -> None:
        with self._wakeup:
            due = [w for w in self._slot_work if not self._pool.slots[w[0]].busy]
            self._slot_work = [w for w in self._slot_work if w not in due]
        for slot, work, future in due:
            try:
                future.set_result(work(self._generator, self._pool.slots[slot]))
            except Exception as exc:
                future.set_exception(exc)

    def _next_job(self) -> Job | None:
        """The next waiting job to start, answering the ones that waited too long."""
        self._batch.release()  # before the thread can wait for work
        with self._wakeup:
            busy = self._calls.waiting or self._slot_work or self.scoring.waiting
            idle = not (self._running or self._waiting or busy)
            if idle and not self._stopping:
                self._wakeup.wait(timeout=0.5)
            defer = partial(awaits_prefill, self._generator, self._pool, self._running)
            return self._waiting.next_job(self._pool.can_take, defer)

    def _admit(self) -> None:
        while (job := self._next_job()) is not None:
            adapters = job.params.adapters
            slot, shared = self._pool.choose(job.prompt, job.params.id_slot, adapters)
            # cache_prompt false: the prompt is evaluated from its first token.
            cached = self._reuse(slot, shared, job) if job.params.cache_prompt else 0
            cached = media.reusable(job.media, cached)
            with self._wakeup:
                self._pool.claim(slot, job.handle.request_id, cached, adapters)
            error = self._open(job, slot, cached)
            if error is not None:
                with self._wakeup:
                    self._pool.release(slot, keep=False)
                job.handle.deliver(TokenEvent("", (), error=error))
                continue
            self._on_admitted(job, slot, cached)
            drafter = self._speculation.drafter(job)
            running = Running(job, slot, fed=cached, cached=cached, drafter=drafter)
            self._running.append(running)
            if job.params.return_progress:
                # llama-server's first report, before any token is evaluated: the cache's, at 0.
                progress = PromptProgress(len(job.prompt), cached, cached, 0.0)
                job.handle.deliver(running.event("", progress=progress, now=running.started))
        self._update_gauges()

    def _reuse(self, slot: int, shared: int, job: Job) -> int:
        """The prompt tokens the slot holds once busy slots and the prompt cache had their
        say (engine/sharing.py)."""
        args = (self._generator, self._pool, self._cache, slot, shared, job.prompt)
        return reuse_prefix(*args, job.params.adapters, self._metrics)

    def _open(self, job: Job, slot: int, cached: int) -> EngineError | None:
        """Set the slot up for the job; what went wrong, if anything."""
        refusal = adapter_refusal(self._generator, job.params.adapters)
        if refusal is not None:
            return EngineError(refusal, "invalid_request_error", "lora")
        try:
            self._generator.open_slot(slot, job.params, reuse=cached)
        except EngineError as exc:
            logger.warning("%s", exc, extra=about(job))
            return exc
        except Exception as exc:
            logger.exception("could not open a slot", extra=about(job))
            return EngineError(str(exc))
        return None

    def _on_admitted(self, job: Job, slot: int, cached: int) -> None:
        logger.info(
            "slot %d: %d prompt tokens, %d of them from the prefix cache",
            slot,
            len(job.prompt),
            cached,
            extra=about(job),
        )
        self._metrics.admitted(len(job.prompt), cached)

    def _update_gauges(self) -> None:
        self._metrics.load(len(self._running), len(self._waiting))

    def _drop_cancelled(self) -> None:
        for running in [r for r in self._running if r.job.handle.cancelled]:
            logger.info("cancelled after %d tokens", running.generated, extra=about(running.job))
            self._release(running, "cancelled")

    def _adapter_turn(self) -> list[Running]:
        """The running sequences of the adapter set whose turn this step is, that set on."""
        turn = self._turns.pick([r.job.params.adapters for r in self._running])
        self._use(turn)
        return [r for r in self._running if r.job.params.adapters == turn]

    def _use(self, adapters: AdapterSet) -> None:
        if adapters != self._active and isinstance(self._generator, SwitchesAdapters):
            self._generator.lora.apply(adapters)
            self._active = adapters

    def _step(self) -> None:
        try:
            feeds = next_feeds(self._adapter_turn(), self._generator, self._speculation)
            samples = self._generator.step(feeds)
        except Exception as exc:
            logger.exception("engine step failed")
            # An engine's own error keeps its code (a lost rank's model_unavailable).
            error = (
                exc if isinstance(exc, EngineError) else EngineError(f"generation failed: {exc}")
            )
            for running in list(self._running):
                self._finish(running, "", error=error)
            return
        by_slot = {r.slot: r for r in self._running}
        prompt = sum(len(f.tokens) for f in feeds if by_slot[f.slot].prefilling)
        fed = sum(len(f.tokens) + len(f.draft) for f in feeds)
        self._metrics.stepped(len(feeds), fed, prompt)
        for feed, sample in zip(feeds, samples, strict=True):
            running = by_slot[feed.slot]
            accepted = 0 if sample is None else len(sample.then)
            self._pool.fed(feed.slot, [*feed.tokens, *feed.draft[:accepted]])
            if running.prefilling:
                running.fed += len(feed.tokens)
                self._speculation.prompt_fed(running)
                self._on_prompt_fed(running)
            if feed.draft:
                self._on_draft(running, len(feed.draft), accepted)
            if sample is not None:
                self._on_samples(running, (sample, *sample.then))

    def _on_draft(self, running: Running, drafted: int, accepted: int) -> None:
        running.drafted += drafted
        running.accepted += accepted
        if running.drafter is not None:
            running.drafter.record(drafted, accepted)
        self._metrics.drafted(drafted, accepted)

    def _on_samples(self, running: Running, samples: tuple[Sample, ...]) -> None:
        """A step's tokens for one sequence, in order, until one of them ends it."""
        for sample in samples:
            if running.drafter is not None:
                running.drafter.extend((sample.token,))
            self._on_token(running, sample, self._observe_latency(running))
            if running not in self._running:
                return

    def _on_prompt_fed(self, running: Running) -> None:
        params = running.job.params
        if params.return_progress:
            total, prompt_ms = len(running.job.prompt), running.elapsed_ms(time.monotonic())[0]
            progress = PromptProgress(total, running.cached, running.fed, prompt_ms)
            running.job.handle.deliver(running.event("", progress=progress))
        if not running.prefilling and params.max_tokens == 0:
            self._finish(running, "", "length", stop_reason="limit")

    def _observe_latency(self, running: Running) -> float:
        now = time.monotonic()
        first = running.generated == 0
        self._metrics.token(first, now - (running.job.arrived if first else running.last_time))
        running.last_time = now
        if first:
            running.first_time = now
        return now

    def _on_token(self, running: Running, sample: Sample, now: float) -> None:
        generator = self._generator
        params = running.job.params
        token = sample.token
        # A grammar ends generation when it is complete, ignore_eos or not.
        constrained = params.grammar is not None or params.json_schema is not None
        if token in params.stop_token_ids or (
            generator.is_end_of_generation(token) and (constrained or not params.ignore_eos)
        ):
            reason = "token" if token in params.stop_token_ids else "eos"
            running.generated += 1
            tail = running.text.flush() + running.stops.flush()
            self._finish(running, tail, "stop", stop_reason=reason)
            return
        running.generated += 1
        running.last_token = token
        running.pending.append(token)
        special = params.render_special
        piece = generator.token_bytes(token, special=special)
        running.newline = running.newline or b"\n" in piece
        if sample.logprob is not None:
            top = tuple(
                (t, generator.token_bytes(t, special=special), possible(lp)) for t, lp in sample.top
            )
            running.logprobs.append(TokenLogprob(token, piece, possible(sample.logprob), top))
        text, stopped = running.stops.push(running.text.push(piece))
        if stopped:
            self._finish(running, text, "stop", stop_reason="word")
        elif (
            running.generated >= params.max_tokens
            or len(running.job.prompt) + running.generated >= generator.n_ctx_seq
            or running.out_of_time(now)
        ):
            tail = running.stops.push(running.text.flush())[0] + running.stops.flush()
            self._finish(running, text + tail, "length", stop_reason="limit")
        elif text:
            running.job.handle.deliver(running.event(text))

    def _finish(
        self,
        running: Running,
        text: str,
        reason: str | None = None,
        error: EngineError | None = None,
        stop_reason: str | None = None,
    ) -> None:
        running.job.handle.deliver(
            running.event(text, finish_reason=reason, error=error, stop_reason=stop_reason)
        )
        logger.debug(
            "slot %d: %s after %d tokens",
            running.slot,
            error or stop_reason or reason,
            running.generated,
            extra=about(running.job),
        )
        self._release(running, "error" if error else reason or "stop")

    def _release(self, running: Running, reason: str) -> None:
        self._running.remove(running)
        self._metrics.finished(reason)
        prompt_ms, predicted_ms = running.elapsed_ms(time.monotonic())
        length = len(running.job.prompt) + running.generated
        self._metrics.measured(length, prompt_ms / 1e3, predicted_ms / 1e3)
        if self._cache is not None and running.first_time is not None:
            self._cache.prefilled(len(running.job.prompt) - running.cached, prompt_ms / 1e3)
        try:
            self._generator.close_slot(running.slot)
        finally:
            with self._wakeup:
                self._pool.release(running.slot, keep=reason != "error")
        self._update_gauges()
