"""Text to speech: the voice resolved, sentences synthesised and encoded in the model's worker as
they come, answered as chunked audio or as OpenAI's speech.audio SSE events."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

from mlxcel.backends.audio.speech import OPENAI_VOICES, SpeechJob, Voice
from mlxcel.models.audio import SpeechModel
from mlxcel.protocol.audio import SpeechRequest
from mlxcel.protocol.errors import invalid_request


def voice_for(model: SpeechModel, requested: str) -> str:
    """The model's voice a request means: its own name if present, OpenAI's names mean the
    default voice; 400 naming the voices present otherwise."""
    voices = {voice.id: voice for voice in model.engine.voices()}
    own = voices.get(requested)
    if own is not None and own.present:
        return own.id
    if requested in OPENAI_VOICES:
        return model.engine.default_voice
    present = ", ".join(v.id for v in voices.values() if v.present)
    why = "is not downloaded on this machine" if own is not None else "does not exist"
    raise invalid_request(
        f"the voice '{requested}' {why}; voices present: {present} (OpenAI's voice names "
        f"mean {model.engine.default_voice})",
        param="voice",
        code="voice_not_found",
    )


def prepare_speech(model: SpeechModel, body: SpeechRequest) -> SpeechJob:
    """The synthesis a request asks for; 400 for empty input or a voice not here."""
    if not body.input.strip():
        raise invalid_request("'input' is empty: there is nothing to say", param="input")
    return SpeechJob(body.input, voice_for(model, body.voice_name), body.speed)


async def audio_chunks(
    model: SpeechModel, job: SpeechJob, body: SpeechRequest
) -> AsyncIterator[bytes]:
    """The encoded file, in pieces as each sentence is synthesised (and encoded, on the same
    thread of the model's worker), in one of the model's places; 400 before any piece if the
    voice found nothing to say in the text (emoji or symbols alone): the worker sends no
    piece then, not an empty file."""
    said = False
    async with model.place():
        async for piece in model.engine.speak(job, body.response_format):
            said = True
            yield piece
    if not said:
        raise invalid_request(
            "'input' has nothing the voice can say: it reads words and numbers, not emoji or "
            "symbols alone",
            param="input",
        )


async def speech_events(
    model: SpeechModel, job: SpeechJob, body: SpeechRequest
) -> AsyncIterator[dict[str, Any]]:
    """`speech.audio.delta` per encoded piece (base64), then `speech.audio.done` with usage:
    characters in, pieces out (these engines count no tokens)."""
    pieces = 0
    async for piece in audio_chunks(model, job, body):
        pieces += 1
        yield {"type": "speech.audio.delta", "audio": base64.b64encode(piece).decode()}
    usage = {"input_tokens": len(job.text), "output_tokens": pieces}
    usage["total_tokens"] = usage["input_tokens"] + usage["output_tokens"]
    yield {"type": "speech.audio.done", "usage": usage}


def voice_listing(model: SpeechModel) -> dict[str, Any]:
    """GET /v1/audio/voices: every voice the model knows and whether it is here."""
    return {
        "object": "list",
        "model": model.name,
        "default": model.engine.default_voice,
        "data": [_voice(v) for v in model.engine.voices()],
    }


def _voice(voice: Voice) -> dict[str, Any]:
    return {
        "id": voice.id,
        "object": "voice",
        "name": voice.name,
        "language": voice.language,
        "gender": voice.gender,
        "present": voice.present,
    }
