"""Transcriptions and translations: the upload decoded, the model run in its worker, the
transcript answered in its response format or streamed as OpenAI's transcript events."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from mlxcel.backends.audio.transcript import Segment, Task, TranscribeJob, TranscriptInfo
from mlxcel.engine.types import EngineError
from mlxcel.media.decode import AudioError, DecodedAudio, decode_audio
from mlxcel.models.audio import TranscriptionModel
from mlxcel.models.remote import WorkerGone
from mlxcel.protocol.audio import TranscriptionForm
from mlxcel.protocol.errors import APIError, invalid_request, model_unavailable, unavailable_now
from mlxcel.serving.audio_formats import (
    Transcript,
    json_body,
    srt,
    verbose_body,
    vtt,
    word_logprobs,
)

logger = logging.getLogger(__name__)


async def prepare(
    model: TranscriptionModel, form: TranscriptionForm, task: Task, max_seconds: float
) -> TranscribeJob:
    """The job a request asks for: 400 when the model cannot, or the upload is not audio or
    lasts longer than `max_seconds`."""
    if task == "translate" and not model.engine.multilingual:
        raise invalid_request(
            f"the model '{model.name}' is English-only and cannot translate; serve a "
            "multilingual Whisper (e.g. --transcription-model whisper-base)",
            param="model",
            code="model_not_supported",
        )
    if form.language not in (None, "en") and not model.engine.multilingual:
        raise invalid_request(
            f"the model '{model.name}' is English-only; it cannot transcribe "
            f"language '{form.language}'",
            param="language",
        )
    audio = await decoded(form.audio, max_seconds)
    return TranscribeJob(
        audio=audio.samples,
        task=task,
        language=form.language,
        prompt=form.prompt,
        temperature=form.temperature,
        words=form.words,
    )


async def decoded(data: bytes, max_seconds: float) -> DecodedAudio:
    """The upload decoded on a thread; its AudioError as a 400 with the error's code."""
    try:
        return await asyncio.to_thread(decode_audio, data, max_seconds)
    except AudioError as exc:
        raise invalid_request(str(exc), param="file", code=exc.code) from None


async def transcribe(model: TranscriptionModel, job: TranscribeJob) -> Transcript:
    """The whole transcript, in one of the model's places."""
    info: TranscriptInfo | None = None
    segments: list[Segment] = []
    async with model.place():
        async for event in model.engine.transcribe(job):
            if isinstance(event, TranscriptInfo):
                info = event
            else:
                segments.append(event)
    assert info is not None, "the engine yields its info first"
    return Transcript(job.task, info, tuple(segments))


def formatted(transcript: Transcript, form: TranscriptionForm) -> dict[str, Any] | str:
    """The transcript in the requested response format (text formats as strings)."""
    fmt = form.response_format
    if fmt == "json":
        return json_body(transcript, form.logprobs)
    if fmt == "verbose_json":
        return verbose_body(transcript, form.segments, form.words)
    if fmt == "srt":
        return srt(transcript)
    if fmt == "vtt":
        return vtt(transcript)
    return transcript.text + "\n"


async def transcript_events(
    model: TranscriptionModel, job: TranscribeJob, form: TranscriptionForm
) -> AsyncIterator[dict[str, Any]]:
    """`transcript.text.delta` per segment as it is decoded, then `transcript.text.done`."""
    segments: list[Segment] = []
    info: TranscriptInfo | None = None
    async with model.place():
        async for event in model.engine.transcribe(job):
            if isinstance(event, TranscriptInfo):
                info = event
                continue
            # The first delta has no leading space, so the deltas join to the final text.
            delta = event.text.lstrip() if not segments else event.text
            segments.append(event)
            chunk: dict[str, Any] = {"type": "transcript.text.delta", "delta": delta}
            if form.logprobs:
                chunk["logprobs"] = word_logprobs(list(event.words))
            yield chunk
    assert info is not None, "the engine yields its info first"
    transcript = Transcript(job.task, info, tuple(segments))
    done: dict[str, Any] = {"type": "transcript.text.done", "text": transcript.text}
    if form.logprobs:
        done["logprobs"] = word_logprobs(transcript.words)
    yield done


def stream_error(exc: Exception, _last: dict[str, Any]) -> dict[str, Any]:
    """The event that ends a stream that failed after its first event."""
    if isinstance(exc, APIError):
        error = exc
    elif isinstance(exc, WorkerGone):
        error = model_unavailable(f"{exc}; retry the request")
    elif isinstance(exc, EngineError) and (now := unavailable_now(exc)) is not None:
        error = now
    else:
        error = APIError(500, "transcription failed")
    return {"type": "error", **error.body()}
