"""POST /v1/audio/transcriptions, /v1/audio/translations and /v1/audio/speech, and
GET /v1/audio/voices."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.datastructures import FormData, UploadFile
from starlette.formparsers import MultiPartException
from starlette.types import Send

from mlxcel.api.auth import require_api_key
from mlxcel.api.body_check import CheckedJsonRoute
from mlxcel.api.routes.text import unless_disconnected
from mlxcel.api.sse import typed_event_stream
from mlxcel.api.state import served_for
from mlxcel.backends.audio.encode import MEDIA_TYPES
from mlxcel.backends.audio.transcript import Task
from mlxcel.engine.types import EngineError
from mlxcel.logs import current_request
from mlxcel.models.audio import SpeechModel, TranscriptionModel
from mlxcel.models.loaded import Capability
from mlxcel.models.remote import WorkerGone
from mlxcel.protocol.audio import MAX_UPLOAD_BYTES, SpeechRequest, parse_form
from mlxcel.protocol.errors import APIError, invalid_request
from mlxcel.serving.audio_speech import audio_chunks, prepare_speech, speech_events, voice_listing
from mlxcel.serving.audio_transcription import (
    formatted,
    prepare,
    stream_error,
    transcribe,
    transcript_events,
)

logger = logging.getLogger(__name__)

router = APIRouter(route_class=CheckedJsonRoute, dependencies=[Depends(require_api_key)])

M = TypeVar("M", TranscriptionModel, SpeechModel)
_TEXT_TYPES = {"text": "text/plain", "srt": "application/x-subrip", "vtt": "text/vtt"}


async def _model(request: Request, name: str | None, capability: Capability, kind: type[M]) -> M:
    model = await served_for(request, name, capability)
    assert isinstance(model, kind), f"a {capability} model is a {kind.__name__}"
    return model


async def _form(request: Request) -> tuple[FormData, bytes]:
    """The multipart form and its file's bytes: 400 if it has no file, 413 past 25 MiB."""
    try:
        form = await request.form()
    except MultiPartException as exc:
        raise invalid_request(f"the multipart form could not be read: {exc.message}") from None
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise invalid_request(
            "'file' is required: send the audio as a multipart file field", param="file"
        )
    if upload.size is not None and upload.size > MAX_UPLOAD_BYTES:
        raise _too_large(upload.size)
    data = await upload.read(MAX_UPLOAD_BYTES + 1)
    if len(data) > MAX_UPLOAD_BYTES:
        raise _too_large(len(data))
    return form, data


def _request_id() -> str:
    record = current_request()
    return record.request_id if record is not None else "-"


def _too_large(size: int) -> APIError:
    return APIError(
        413,
        f"the file is {size} bytes; uploads are limited to {MAX_UPLOAD_BYTES} bytes (25 MiB)",
        param="file",
        code="file_too_large",
    )


async def _transcription(request: Request, task: Task) -> Response:
    form_data, audio = await _form(request)
    try:
        form = parse_form(form_data.multi_items(), audio, translate=task == "translate")
    finally:
        await form_data.close()
    model = await _model(request, form.model, "transcription", TranscriptionModel)
    job = await prepare(model, form, task, request.app.state.max_audio_seconds)
    if form.stream:
        events = transcript_events(model, job, form)
        return await typed_event_stream(events, _request_id(), stream_error)
    transcript = await unless_disconnected(request, transcribe(model, job))
    body = formatted(transcript, form)
    if isinstance(body, str):
        return PlainTextResponse(body, media_type=_TEXT_TYPES[form.response_format])
    return JSONResponse(body)


@router.post("/audio/transcriptions", response_model=None)
async def transcriptions(request: Request) -> Response:
    """Speech to text, in the language spoken (OpenAI's shape)."""
    return await _transcription(request, "transcribe")


@router.post("/audio/translations", response_model=None)
async def translations(request: Request) -> Response:
    """Speech in any language to English text (multilingual models only)."""
    return await _transcription(request, "translate")


@router.post("/audio/speech", response_model=None)
async def speech(body: SpeechRequest, request: Request) -> Response:
    """Text to speech: chunked audio as it is synthesised, or speech.audio SSE events."""
    model = await _model(request, body.model, "speech", SpeechModel)
    job = prepare_speech(model, body)
    if body.stream_format == "sse":
        events = speech_events(model, job, body)
        return await typed_event_stream(events, _request_id(), stream_error)
    media_type = MEDIA_TYPES[body.response_format]
    begun = await _begun(request, audio_chunks(model, job, body))
    if isinstance(begun, bytes):
        return Response(begun, media_type=media_type)
    return AudioStream(begun, media_type=media_type)


class AudioStream(StreamingResponse):
    """Audio in chunks, a sentence at a time. When the synthesis fails once the first chunk is
    out (the server shutting down past its timeout, the worker gone), the status cannot change
    and there is no envelope to put in a file: the body ends without its last chunk, which
    HTTP clients report as an incomplete body, and the log says why in one line."""

    async def stream_response(self, send: Send) -> None:
        await send(
            {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
        )
        try:
            async for chunk in self.body_iterator:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except (EngineError, WorkerGone) as exc:
            logger.warning("speech cut after its first audio: %s", exc)
            return
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _begun(request: Request, chunks: AsyncIterator[bytes]) -> bytes | AsyncIterator[bytes]:
    """`chunks` with its first piece made before the headers go: the synthesis starts as the
    request is read, not after its headers are sent (0.3-0.5 ms sooner here), an error before
    any audio keeps its status, and a client that leaves while its request waits for one of
    the model's places frees it. The whole file instead when the stream ended with its first
    piece (a text of one sentence, whose piece and end the worker sends together): answered
    with its length, not chunked, and without a streaming response's task group."""
    first = await unless_disconnected(request, anext(chunks))
    following = asyncio.ensure_future(anext(chunks, None))
    # One turn of the loop: a stream whose end has come already runs out in it.
    await asyncio.sleep(0)
    if following.done() and following.result() is None:
        return first

    async def pieces() -> AsyncIterator[bytes]:
        try:
            yield first
            second = await following
            if second is None:
                return
            yield second
            async for piece in chunks:
                yield piece
        finally:
            following.cancel()

    return pieces()


@router.get("/audio/voices")
async def voices(request: Request, model: str | None = None) -> dict[str, Any]:
    """The voices a speech model knows, and which are on this machine."""
    return voice_listing(await _model(request, model, "speech", SpeechModel))
