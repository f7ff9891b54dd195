"""What the scheduler keeps for each request: the job as submitted, and the running sequence's
progress, text, stops and events."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from mlxcel.engine.handle import EventSink
from mlxcel.engine.slots import SlotReport, SlotState
from mlxcel.engine.speculative import Drafter
from mlxcel.engine.text import IncrementalText, StopMatcher
from mlxcel.engine.types import (
    EngineError,
    MediaSpan,
    PromptProgress,
    SamplingParams,
    TokenEvent,
    TokenLogprob,
)


@dataclass
class Job:
    """One sequence of a request, as submitted."""

    handle: EventSink
    prompt: list[int]
    params: SamplingParams
    media: tuple[MediaSpan, ...] = ()
    arrived: float = field(default_factory=time.monotonic)


@dataclass
class Running:
    """A job in a slot: how far its prompt is fed, what it generated, its text and stops."""

    job: Job
    slot: int
    fed: int = 0
    cached: int = 0
    generated: int = 0
    last_token: int = -1
    last_time: float = 0.0
    started: float = field(default_factory=time.monotonic)
    first_time: float | None = None
    """When the first token was sampled: prompt time ends and generation time starts."""
    newline: bool = False
    text: IncrementalText = field(default_factory=IncrementalText)
    stops: StopMatcher = field(init=False)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    """Tokens generated since the last event."""
    drafter: Drafter | None = None
    """Its speculative drafts, when the model speculates."""
    drafted: int = 0
    accepted: int = 0

    def __post_init__(self) -> None:
        params = self.job.params
        self.stops = StopMatcher(params.stop, include_stop=params.include_stop_str)

    @property
    def prefilling(self) -> bool:
        return self.fed < len(self.job.prompt)

    def take_logprobs(self) -> tuple[TokenLogprob, ...]:
        """Log-probabilities gathered since the last event."""
        taken, self.logprobs = tuple(self.logprobs), []
        return taken

    def take_tokens(self) -> tuple[int, ...]:
        """Token ids generated since the last event."""
        taken, self.pending = tuple(self.pending), []
        return taken

    def elapsed_ms(self, now: float) -> tuple[float, float]:
        """Milliseconds spent on the prompt, and generating since the first token."""
        first = now if self.first_time is None else self.first_time
        return (first - self.started) * 1e3, (now - first) * 1e3

    def out_of_time(self, now: float) -> bool:
        """llama-server's t_max_predict_ms: past the limit, once a newline has been generated."""
        limit = self.job.params.t_max_predict_ms
        return limit > 0 and self.newline and self.elapsed_ms(now)[1] > limit

    def event(
        self,
        text: str,
        *,
        finish_reason: str | None = None,
        error: EngineError | None = None,
        stop_reason: str | None = None,
        progress: PromptProgress | None = None,
        now: float | None = None,
    ) -> TokenEvent:
        """An event for the request, with what every event reports, timed `now` (default:
        this moment)."""
        prompt_ms, predicted_ms = self.elapsed_ms(time.monotonic() if now is None else now)
        return TokenEvent(
            text,
            self.take_tokens(),
            finish_reason=finish_reason,
            prompt_tokens=len(self.job.prompt),
            completion_tokens=self.generated,
            error=error,
            logprobs=self.take_logprobs(),
            stop_reason=stop_reason,
            stop_word=self.stops.matched if stop_reason == "word" else None,
            cached_tokens=self.cached,
            prompt_ms=prompt_ms,
            predicted_ms=predicted_ms,
            slot=self.slot,
            progress=progress,
            draft_tokens=self.drafted,
            draft_accepted=self.accepted,
        )


def about(job: Job) -> dict[str, str]:
    """Log `extra` naming the request a line is about (this thread serves every request)."""
    return {"request_id": job.handle.request_id}


def slot_reports(slots: Sequence[SlotState], running: Sequence[Running]) -> list[SlotReport]:
    """Each slot's state, copied, and the progress of the request running in it."""
    by_slot = {r.slot: r for r in running}
    reports = []
    for index, slot in enumerate(slots):
        copy = SlotState(list(slot.tokens), slot.busy, slot.last_used, slot.request_id)
        r = by_slot.get(index)
        if r is None:
            reports.append(SlotReport(copy, 0, 0, -1, False))
        else:
            left = r.job.params.max_tokens - r.generated
            reports.append(SlotReport(copy, r.generated, len(r.job.prompt), left, r.newline))
    return reports
