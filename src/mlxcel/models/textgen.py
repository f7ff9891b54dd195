"""A text-generation model across the process boundary, as the HTTP process serves it.

`RemoteTextModel` answers what serving reads of the model from the facts its worker sent once
(context, slots, the chat template) and tokenizes, detokenizes and embeds media through calls;
`RemoteEngine.submit` returns a `RequestHandle` per sequence, fed by the worker's events, whose
cancellation travels back. The worker's side is `worker/text_service.py`.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from mlxcel.engine.adapters import AdapterSet
from mlxcel.engine.capabilities import DeviceInfo, FimTokens, KvCacheInfo
from mlxcel.engine.handle import RequestHandle, ends
from mlxcel.engine.replica_router import NO_HINT, RouteHint, RouteRequest
from mlxcel.engine.slots import SlotReport
from mlxcel.engine.types import (
    ChatTemplate,
    EngineError,
    MediaSpan,
    SamplingParams,
    TokenEvent,
    TokenLogprob,
)
from mlxcel.media.audio import SentMedia
from mlxcel.models.remote import Worker, WorkerGone
from mlxcel.wire.facts import (
    MODEL_UNAVAILABLE,
    MediaPrompt,
    TextFacts,
    TextSequence,
)


class Calls(Protocol):
    """What answers a model's calls: its worker, or any serving replica of a replica set."""

    def call(self, method: str, *args: Any) -> Any:
        """Call a method of the model and wait for its result."""
        ...


class RemoteTextModel:
    """`TextModel` for serving in the HTTP process: facts kept, tokenizing by a call."""

    def __init__(self, worker: Calls, facts: TextFacts) -> None:
        self._worker = worker
        self._facts = facts

    @property
    def n_ctx_seq(self) -> int:
        return self._facts.n_ctx_seq

    @property
    def n_vocab(self) -> int:
        return self._facts.n_vocab

    @property
    def n_slots(self) -> int:
        return self._facts.n_slots

    @property
    def batched(self) -> bool:
        return self._facts.batched

    @property
    def max_feed_tokens(self) -> int:
        return self._facts.max_feed_tokens

    @property
    def chat_template(self) -> ChatTemplate | None:
        return self._facts.own_template

    @property
    def generation_config(self) -> Mapping[str, float]:
        return self._facts.generation_config

    @property
    def add_bos(self) -> bool:
        return self._facts.add_bos

    @property
    def input_modalities(self) -> tuple[str, ...]:
        return self._facts.input_modalities

    @property
    def kv_cache(self) -> KvCacheInfo | None:
        return self._facts.kv_cache

    @property
    def devices(self) -> tuple[DeviceInfo, ...]:
        return self._facts.devices

    @property
    def longest_token(self) -> int:
        return self._facts.longest_token

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        tokens: list[int] = self._worker.call("tokenize", text, add_special, parse_special)
        return tokens

    def token_pieces(self, tokens: Sequence[int], *, special: bool = False) -> list[bytes]:
        pieces: list[bytes] = self._worker.call("token_pieces", list(tokens), special)
        return pieces

    @property
    def scores_prompts(self) -> bool:
        return self._facts.scores_prompts

    def score_prompt(
        self, tokens: Sequence[int], top_n: int, adapters: AdapterSet
    ) -> list[TokenLogprob]:
        """Each prompt token's log-probability after those before it, from the second on
        (a call that waits for a free slot in the worker: engine/scoring.py)."""
        scores: list[TokenLogprob] = self._worker.call(
            "score_prompt", list(tokens), top_n, adapters
        )
        return scores


class RemoteFimModel(RemoteTextModel):
    """A remote text model whose vocabulary has fill-in-the-middle tokens (`FillsInTheMiddle`)."""

    @property
    def fim_tokens(self) -> FimTokens:
        fim = self._facts.fim_tokens
        assert fim is not None
        return fim


class RemoteMediaModel(RemoteTextModel):
    """A remote text model that reads images or audio (`TakesMedia`): the worker lays out and
    embeds them."""

    @property
    def media_marker(self) -> str:
        marker = self._facts.media_marker
        assert marker is not None
        return marker

    @property
    def audio_rate(self) -> int | None:
        return self._facts.audio_rate

    def tokenize_with_media(
        self, text: str, media: Sequence[SentMedia]
    ) -> tuple[list[int], tuple[MediaSpan, ...]]:
        """The prompt's tokens and where its media sit (the spans carry no rows: they stay in
        the worker, which embeds them again, or from its cache, for a generation)."""
        laid_out: tuple[list[int], tuple[MediaSpan, ...]] = self._worker.call(
            "tokenize_with_media", text, list(media)
        )
        return laid_out


class RemoteFimMediaModel(RemoteFimModel, RemoteMediaModel):
    """A remote model with fill-in-the-middle tokens that also reads images or audio."""


def remote_text_model(worker: Calls, facts: TextFacts) -> RemoteTextModel:
    """The serving side of a worker's text model."""
    fim, media = facts.fim_tokens is not None, facts.media_marker is not None
    if fim and media:
        return RemoteFimMediaModel(worker, facts)
    if media:
        return RemoteMediaModel(worker, facts)
    return RemoteFimModel(worker, facts) if fim else RemoteTextModel(worker, facts)


def unavailable(error: WorkerGone) -> EngineError:
    """The engine error of a request whose model's worker is gone (a 503 that says retry)."""
    return EngineError(f"{error}; retry the request", MODEL_UNAVAILABLE)


class RemoteHandle(RequestHandle):
    """A request's handle whose events come from the model's worker; cancelling it tells the
    worker."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop, worker: Worker) -> None:
        super().__init__(request_id, loop)
        self._worker = worker
        self.stream_id: int | None = None
        self._ended = False
        self.on_end: Callable[[TokenEvent | None], None] | None = None
        """Called once on the event loop when the sequence ends: with its last event, or
        None when it was cancelled first (a replica set counts its requests in flight)."""

    def fail(self, error: BaseException) -> None:
        """From the reader thread: the generation cannot go on (the worker died, or it could
        not start); its last event carries the error."""
        if isinstance(error, EngineError):
            engine_error = error
        elif isinstance(error, WorkerGone):
            engine_error = unavailable(error)
        else:
            engine_error = EngineError(str(error) or type(error).__name__)
        self.deliver(TokenEvent("", (), error=engine_error))

    def receive(self, event: TokenEvent) -> None:
        if ends(event) and not self._ended:
            self._ended = True
            self._end(event)
        super().receive(event)

    def cancel(self) -> None:
        if not self.cancelled and not self._ended and self.stream_id is not None:
            self._worker.cancel(self.stream_id)
        if not self._ended:
            self._ended = True
            self._end(None)
        super().cancel()

    def _end(self, event: TokenEvent | None) -> None:
        if self.on_end is not None:
            self.on_end(event)


class TextEngine(ABC):
    """A text model's scheduler as serving submits to it: one worker's (`RemoteEngine`) or a
    replica set's (`models/replica_engine.ReplicaEngine`)."""

    def submit(
        self, request_id: str, sequences: Sequence[TextSequence], route: RouteHint = NO_HINT
    ) -> list[RequestHandle]:
        """Queue every sequence of one request, all or none: their events arrive on the
        returned handles, and a refusal (no room for all) is each one's first event;
        EngineError if the worker is gone. The first prompt and `route` pick a replica."""
        request = RouteRequest(sequences[0][0] if sequences else (), route)
        return [*self.start(request_id, "generate", (list(sequences),), len(sequences), request)]

    def submit_with_media(
        self,
        request_id: str,
        prompt: MediaPrompt,
        params: Sequence[SamplingParams],
        route: RouteHint = NO_HINT,
    ) -> list[RequestHandle]:
        """Queue one sequence of a media prompt for each of `params`, as `submit` does: the
        worker lays the prompt out first, and a prompt it refuses (its layout, or its length)
        is each one's only event. Its tokens are the worker's: `route` alone picks a replica."""
        args = (prompt, list(params))
        request = RouteRequest((), route)
        return [*self.start(request_id, "generate_with_media", args, len(params), request)]

    @abstractmethod
    def start(
        self,
        request_id: str,
        method: str,
        args: tuple[object, ...],
        count: int,
        route: RouteRequest,
    ) -> Sequence[RequestHandle]:
        """Start `count` sequences of one request, by the worker's `method`."""

    @abstractmethod
    def slots(self) -> list[SlotReport]:
        """Each slot's state and its request's progress."""

    @abstractmethod
    def stop(self) -> None:
        """End every generation running or waiting with a shutdown error."""

    @abstractmethod
    def slot_file(self, action: str, slot: int, filename: str) -> dict[str, Any]:
        """llama-server's slot save, restore or erase (an EngineError says why not)."""

    @abstractmethod
    def prompt_cache(self) -> dict[str, Any]:
        """The prompt cache's tiers, as /props shows them."""


class RemoteEngine(TextEngine):
    """The scheduler of a model in its worker."""

    def __init__(self, worker: Worker) -> None:
        self._worker = worker

    def start(
        self,
        request_id: str,
        method: str,
        args: tuple[object, ...],
        count: int,
        route: RouteRequest,
    ) -> list[RemoteHandle]:
        """Start `count` sequences of one request on the worker, by `method`."""
        loop = asyncio.get_running_loop()
        handles = [RemoteHandle(request_id, loop, self._worker) for _ in range(count)]
        try:
            ids = self._worker.stream(method, args, handles)
        except WorkerGone as exc:
            raise unavailable(exc) from exc
        for handle, stream_id in zip(handles, ids, strict=True):
            handle.stream_id = stream_id
        return handles

    def slots(self) -> list[SlotReport]:
        """Each slot's state and its request's progress (a call to the worker)."""
        snapshot: list[SlotReport] = self._worker.call("slots")
        return snapshot

    def slot_file(self, action: str, slot: int, filename: str) -> dict[str, Any]:
        """llama-server's slot save, restore or erase, done in the worker once the slot is free
        (an EngineError says why not)."""
        answer: dict[str, Any] = self._worker.call("slot_file", action, slot, filename)
        return answer

    def prompt_cache(self) -> dict[str, Any]:
        """The prompt cache's tiers: entries, bytes, and the disk tier's hits and load time."""
        answer: dict[str, Any] = self._worker.call("prompt_cache")
        return answer

    def stop(self) -> None:
        """End every generation running or waiting with a shutdown error (at shutdown, once
        the drain gave up); the worker keeps running until the registry stops it."""
        try:
            self._worker.call("stop")
        except WorkerGone:
            return
