"""One realtime session's state machine: its configuration, the input audio buffer and its
turns (server VAD on Silero's probabilities, reckoned in the transcription model's worker),
each turn's live transcript, and, in a conversation, the items and the response in progress.
Events come in through `handle`, one at a time; events go out through `emit` from the tasks
that make them (the route serializes the sends)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlxcel.backends.audio.voice_activity import VAD_RATE, WINDOW
from mlxcel.models.audio import SpeechModel, TranscriptionModel
from mlxcel.models.loaded import LoadedModel
from mlxcel.protocol.errors import APIError
from mlxcel.protocol.realtime import RealtimeError, SessionConfig
from mlxcel.protocol.realtime_update import updated
from mlxcel.serving.realtime_audio import (
    TurnChange,
    TurnDetector,
    decoded_chunk,
    input_resampler,
    ms,
)
from mlxcel.serving.realtime_conversation import Conversation
from mlxcel.serving.realtime_items import new_id, user_audio_item
from mlxcel.serving.realtime_transcribe import LiveTranscript

logger = logging.getLogger(__name__)

Send = Callable[[dict[str, Any]], Awaitable[None]]
_MIN_COMMIT = VAD_RATE // 10  # OpenAI's least committed audio: 100 ms


@dataclass
class SessionModels:
    """How a session gets the models it joins (leased for the session's life by the route)."""

    transcriber: Callable[[str | None], Awaitable[TranscriptionModel]]
    chat: Callable[[str | None], Awaitable[LoadedModel]]
    voice: Callable[[str | None], Awaitable[SpeechModel]]


@dataclass(frozen=True)
class SessionLimits:
    max_audio_seconds: float
    """Input audio the whole session may append."""
    max_turn_seconds: float
    """Input audio one buffer may hold before it is committed."""


def as_realtime_error(exc: APIError) -> RealtimeError:
    """An HTTP-side error (a model not served, a worker gone) as an error event's."""
    return RealtimeError(
        exc.message, code=exc.code or "server_error", param=exc.param, type=exc.type
    )


class RealtimeSession:
    """A session, from `session.created` until its socket closes."""

    def __init__(
        self, config: SessionConfig, models: SessionModels, limits: SessionLimits, send: Send
    ) -> None:
        self.config = config
        self.models = models
        self.limits = limits
        self._send = send
        self._resampler = input_resampler(config.input_format)
        self._turn: list[np.ndarray] = []
        self._turn_start = 0
        self._heard = 0
        self._appended_s = 0.0
        self._detector = TurnDetector(config.turn_detection) if config.turn_detection else None
        self._vad_pending: list[np.ndarray] = []
        self._vad_done = 0
        self._vad_context: np.ndarray | None = None
        self._vad_task: asyncio.Task[None] | None = None
        self._live: LiveTranscript | None = None
        self._item_id: str | None = None
        self._transcripts: set[asyncio.Task[None]] = set()
        self._last_item: str | None = None
        self.conversation = Conversation(self)

    async def emit(self, type_: str, **fields: Any) -> None:
        """Send a server event."""
        await self._send({"type": type_, "event_id": new_id("event"), **fields})

    async def error(self, exc: RealtimeError, event_id: str | None = None) -> None:
        """Send an `error` event."""
        await self.emit("error", error=exc.event_error(event_id))

    async def start(self) -> None:
        """Announce the session."""
        await self.emit("session.created", session=self.config.as_object())

    async def handle(self, event: dict[str, Any]) -> None:
        """One client event; an event the session cannot take is an `error` event."""
        kind = event.get("type")
        event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
        try:
            await self._dispatch(kind, event)
        except RealtimeError as exc:
            await self.error(exc, event_id)
        except APIError as exc:
            await self.error(as_realtime_error(exc), event_id)

    async def _dispatch(self, kind: Any, event: dict[str, Any]) -> None:
        if kind in ("session.update", "transcription_session.update"):
            await self._update(event.get("session"), kind)
        elif kind == "input_audio_buffer.append":
            await self._append(event.get("audio"))
        elif kind == "input_audio_buffer.commit":
            await self._commit_now()
        elif kind == "input_audio_buffer.clear":
            self._clear()
            await self.emit("input_audio_buffer.cleared")
        elif isinstance(kind, str) and kind.split(".")[0] in ("conversation", "response"):
            if self.config.kind == "transcription":
                raise RealtimeError(
                    f"'{kind}' is for conversation sessions; this one transcribes",
                    code="invalid_event",
                    param="type",
                )
            await self.conversation.handle(kind, event)
        else:
            name = kind if isinstance(kind, str) else repr(kind)
            raise RealtimeError(f"unknown event type '{name}'", code="unknown_event", param="type")

    async def _update(self, body: Any, kind: str) -> None:
        config = updated(self.config, body, kind)
        if config.input_format != self.config.input_format:
            self._resampler = input_resampler(config.input_format)
        if config.turn_detection != self.config.turn_detection:
            self._detector = TurnDetector(config.turn_detection) if config.turn_detection else None
        self.config = config
        await self.emit("session.updated", session=config.as_object())

    async def _append(self, audio: Any) -> None:
        if not isinstance(audio, str):
            raise RealtimeError(
                "'audio' must be a base64 string", code="invalid_type", param="audio"
            )
        chunk = decoded_chunk(audio, self.config.input_format)
        seconds = len(chunk) / self.config.input_format.rate
        if self._appended_s + seconds > self.limits.max_audio_seconds:
            raise RealtimeError(
                f"this session has appended {self._appended_s:.1f} s of audio; a session may "
                f"append {self.limits.max_audio_seconds:g} s (--realtime-max-audio-seconds)",
                code="session_audio_limit",
                param="audio",
            )
        turn = (self._heard - self._turn_start) / VAD_RATE
        if turn + seconds > self.limits.max_turn_seconds:
            raise RealtimeError(
                f"the input audio buffer holds {turn:.1f} s; commit or clear it (a buffer may "
                f"hold {self.limits.max_turn_seconds:g} s, --max-audio-seconds)",
                code="input_audio_buffer_full",
                param="audio",
            )
        self._appended_s += seconds
        samples = self._resampler.push(chunk)
        self._turn.append(samples)
        self._heard += len(samples)
        if self._detector is not None:
            self._vad_pending.append(samples)
            if self._vad_task is None or self._vad_task.done():
                self._vad_task = asyncio.ensure_future(self._scan())

    def turn_audio(self) -> np.ndarray:
        """The input buffer's audio, 16 kHz."""
        if len(self._turn) != 1:
            joined = np.concatenate(self._turn) if self._turn else np.zeros(0, np.float32)
            self._turn = [joined]
        return self._turn[0]

    def _trim(self, start: int) -> None:
        """Drop the buffer's audio before absolute sample `start`."""
        cut = start - self._turn_start
        if cut > 0:
            self._turn = [self.turn_audio()[cut:]]
            self._turn_start = start

    def _clear(self) -> None:
        self._turn, self._turn_start = [], self._heard
        if self._live is not None:
            self._live.cancel()
        self._live, self._item_id = None, None

    async def _scan(self) -> None:
        """Score the audio waiting for voice activity, in the worker, and act on each change."""
        try:
            while self._vad_pending and self._detector is not None:
                pending = np.concatenate(self._vad_pending)
                whole = len(pending) // WINDOW * WINDOW
                self._vad_pending = [pending[whole:]] if whole < len(pending) else []
                if whole == 0:
                    return
                model = await self.models.transcriber(self.config.transcription.model)
                windows = pending[:whole]
                scores = await asyncio.to_thread(
                    model.engine.speech_probabilities, windows, self._vad_context
                )
                first, self._vad_context = self._vad_done, windows[-WINDOW:]
                self._vad_done += whole
                for change in self._detector.feed(scores, first):
                    await self._turn_changed(change, model)
                if not self._detector.speaking:
                    prefix = self._detector.settings.prefix_padding_ms * VAD_RATE // 1000
                    self._trim(max(self._turn_start, self._vad_done - prefix))
                elif self._live is not None:
                    self._live.grew(self._vad_done - self._turn_start)
        except RealtimeError as exc:
            await self.error(exc)
        except APIError as exc:
            await self.error(as_realtime_error(exc))

    async def _turn_changed(self, change: TurnChange, model: TranscriptionModel) -> None:
        assert self._detector is not None
        if change.started is not None:
            prefix = self._detector.settings.prefix_padding_ms * VAD_RATE // 1000
            self._trim(max(self._turn_start, change.started - prefix))
            self._item_id = new_id("item")
            start = ms(change.started)
            await self.emit(
                "input_audio_buffer.speech_started", audio_start_ms=start, item_id=self._item_id
            )
            if self._detector.settings.interrupt_response:
                await self.conversation.interrupt()
            self._live = self._live_transcript(model, self._item_id)
        elif change.paused is not None and self._live is not None:
            self._live.grew(self._vad_done - self._turn_start, paused=True)
        elif change.stopped is not None and self._item_id is not None:
            end = ms(change.stopped)
            await self.emit(
                "input_audio_buffer.speech_stopped", audio_end_ms=end, item_id=self._item_id
            )
            speech_end = self._detector.last_speech - self._turn_start
            await self._commit(change.stopped, speech_end)

    def _live_transcript(self, model: TranscriptionModel, item_id: str) -> LiveTranscript:
        async def delta(text: str) -> None:
            await self.emit(
                "conversation.item.input_audio_transcription.delta",
                item_id=item_id,
                content_index=0,
                delta=text,
            )

        return LiveTranscript(model, self.config.transcription, self.turn_audio, delta)

    async def _commit_now(self) -> None:
        """The client's commit: with server VAD on, once the audio sent is scored, so the turn
        knows where its speech ended (and a decode that heard it all is reused)."""
        speech_end = None
        if self._detector is not None:
            if self._vad_task is not None and not self._vad_task.done():
                await asyncio.wait([self._vad_task])
            if self._detector.speaking:
                speech_end = self._detector.last_speech - self._turn_start
                self._detector.reset()
        await self._commit(self._heard, speech_end, auto=False)

    async def _commit(self, upto: int, speech_end: int | None, auto: bool = True) -> None:
        """Commit the buffer's audio up to absolute sample `upto` as a user item."""
        length = upto - self._turn_start
        if length < _MIN_COMMIT:
            raise RealtimeError(
                f"the input audio buffer holds {length * 1000 // VAD_RATE} ms; a commit needs "
                "at least 100 ms of audio",
                code="input_audio_buffer_commit_empty",
            )
        audio = self.turn_audio()[:length]
        item_id = self._item_id or new_id("item")
        model = await self.models.transcriber(self.config.transcription.model)
        live = self._live or self._live_transcript(model, item_id)
        live.audio = lambda: audio
        self._turn, self._turn_start = [self.turn_audio()[length:]], upto
        self._live, self._item_id = None, None
        previous, self._last_item = self._last_item, item_id
        await self.emit("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous)
        item = user_audio_item(item_id, None)
        await self.emit("conversation.item.added", item=item, previous_item_id=previous)
        self.conversation.add(item)
        auto = auto and speech_end is not None and self._auto_response()
        task = asyncio.ensure_future(self._transcript(item, live, length, speech_end, auto))
        self._transcripts.add(task)
        task.add_done_callback(self._transcripts.discard)

    def _auto_response(self) -> bool:
        detection = self.config.turn_detection
        return (
            self.config.kind == "realtime" and detection is not None and detection.create_response
        )

    async def _transcript(
        self, item: dict[str, Any], live: LiveTranscript, length: int, end: int | None, auto: bool
    ) -> None:
        try:
            text = await live.final(length, end)
        except (APIError, RealtimeError, RuntimeError) as exc:
            error = {"type": "server_error", "code": "transcription_failed", "message": str(exc)}
            await self.emit(
                "conversation.item.input_audio_transcription.failed",
                item_id=item["id"],
                content_index=0,
                error=error,
            )
            return
        item["content"][0]["transcript"] = text
        await self.emit(
            "conversation.item.input_audio_transcription.completed",
            item_id=item["id"],
            content_index=0,
            transcript=text,
            usage={"type": "duration", "seconds": round(length / VAD_RATE, 3)},
        )
        await self.emit("conversation.item.done", item=item, previous_item_id=None)
        if auto:
            await self.conversation.respond(None)

    async def transcribed(self) -> None:
        """Wait for the committed turns' transcripts."""
        while pending := {t for t in self._transcripts if t is not asyncio.current_task()}:
            await asyncio.wait(pending)

    def close(self) -> None:
        """Stop everything the session runs."""
        for task in (self._vad_task, *self._transcripts):
            if task is not None:
                task.cancel()
        if self._live is not None:
            self._live.cancel()
        self.conversation.cancel()
