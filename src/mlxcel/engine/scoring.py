"""Prompt scoring on the engine thread: each prompt token's log-probability after the tokens
before it, for legacy completions' `echo` with `logprobs`.

A prompt is scored into a free slot, between two steps, as a sequence of its own: the other
slots' KV state is not touched, so the requests decoding beside it go on as if it had not
run. Every position's logits are needed, and a prefix cached in a slot keeps its KV state but
not its logits, so the prompt is evaluated from its first token; the slot then holds it, and
the generation that follows (the same prompt) finds it there as a cached prefix and evaluates
only its last token again. What the slot held before is saved to the prompt cache first, as
when a request takes a slot. A scoring waits while every slot is busy, ahead of the requests
waiting for one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

from mlxcel.engine.adapters import AdapterSet
from mlxcel.engine.cache_tiers import CacheTiers
from mlxcel.engine.capabilities import SavesState, ScoresPrompts
from mlxcel.engine.prompt_cache import keep_slot_state
from mlxcel.engine.slots import SlotPool
from mlxcel.engine.types import (
    IMPOSSIBLE_LOGPROB,
    EngineError,
    TextGenerator,
    TokenLogprob,
    possible,
)


@dataclass
class _Scoring:
    tokens: list[int]
    top_n: int
    adapters: AdapterSet
    request_id: str
    future: Future[list[TokenLogprob]] = field(default_factory=Future)


class PromptScoring:
    """Prompts waiting to be scored, and scoring them when a slot is free."""

    def __init__(self, generator: TextGenerator, pool: SlotPool, lock: threading.Condition):
        self._generator = generator
        self._pool = pool
        self._lock = lock
        self._pending: list[_Scoring] = []
        self._stopped: EngineError | None = None

    @property
    def able(self) -> bool:
        """Whether the generator scores prompts at all."""
        generator = self._generator
        return isinstance(generator, ScoresPrompts) and generator.scores_prompts

    @property
    def waiting(self) -> bool:
        """Whether a prompt waits to be scored."""
        return bool(self._pending)

    def submit(
        self, tokens: Sequence[int], top_n: int, adapters: AdapterSet, request_id: str
    ) -> Future[list[TokenLogprob]]:
        """Queue a prompt, from any thread; its future holds its scores."""
        if not self.able:
            raise EngineError("this model's engine cannot score prompts", "invalid_request_error")
        if not tokens:
            raise EngineError("the prompt is empty", "invalid_request_error", "prompt")
        scoring = _Scoring(list(tokens), top_n, adapters, request_id)
        with self._lock:
            if self._stopped is not None:
                raise self._stopped
            self._pending.append(scoring)
            self._lock.notify()
        return scoring.future

    def run_due(self, use: Callable[[AdapterSet], None], cache: CacheTiers | None) -> None:
        """Score what waits while a slot is free (on the engine thread); `use` switches the
        generator to an adapter set."""
        while True:
            # Only this thread changes the pool: the lock is for the threads that read it.
            with self._lock:
                if not self._pending or not self._pool.has_free:
                    return
                scoring = self._pending.pop(0)
            if scoring.future.cancelled():
                continue
            slot, _ = self._pool.choose(scoring.tokens, -1, scoring.adapters)
            try:
                if cache is not None and isinstance(self._generator, SavesState):
                    state = self._pool.slots[slot]
                    keep_slot_state(cache.ram, self._generator, slot, state, 0)
                with self._lock:
                    self._pool.claim(slot, scoring.request_id, 0, scoring.adapters)
                use(scoring.adapters)
                scoring.future.set_result(self._score(slot, scoring))
                kept = True
            except Exception as exc:
                scoring.future.set_exception(exc)
                kept = False
            with self._lock:
                if kept:
                    self._pool.fed(slot, scoring.tokens)
                self._pool.release(slot, keep=kept)

    def _score(self, slot: int, scoring: _Scoring) -> list[TokenLogprob]:
        generator = self._generator
        assert isinstance(generator, ScoresPrompts)
        samples = generator.score_prompt(slot, scoring.tokens, scoring.top_n)
        piece = self._generator.token_bytes
        return [
            TokenLogprob(
                s.token,
                piece(s.token),
                possible(IMPOSSIBLE_LOGPROB if s.logprob is None else s.logprob),
                tuple((t, piece(t), possible(lp)) for t, lp in s.top),
            )
            for s in samples
        ]

    def cancel_all(self, error: EngineError) -> None:
        """Fail what still waits, and what comes after (the engine is stopping)."""
        with self._lock:
            pending, self._pending = self._pending, []
            self._stopped = error
        for scoring in pending:
            scoring.future.set_exception(error)
