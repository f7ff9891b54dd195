"""The audio routes' requests: the multipart form of transcriptions and translations, and the
JSON body of speech."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mlxcel.backends.audio.encode import SpeechFormat
from mlxcel.backends.audio.languages import LANGUAGES
from mlxcel.protocol.errors import invalid_request

TranscriptFormat = Literal["json", "text", "srt", "vtt", "verbose_json"]
TRANSCRIPT_FORMATS: tuple[TranscriptFormat, ...] = ("json", "text", "srt", "vtt", "verbose_json")
MAX_SPEECH_INPUT = 4096
# OpenAI's upload limit.
MAX_UPLOAD_BYTES = 25 * 1024 * 1024

# Form fields OpenAI defines that only its diarizing or gpt-transcribe models act on.
_UNSUPPORTED_FIELDS = ("known_speaker_names", "known_speaker_references", "keywords", "languages")
# `chunking_strategy` is accepted with no effect: Whisper cuts 30 s windows itself.
_TRANSCRIBE_FIELDS = frozenset(
    {
        "file",
        "model",
        "language",
        "prompt",
        "response_format",
        "temperature",
        "timestamp_granularities",
        "stream",
        "include",
        "chunking_strategy",
    }
)
_TRANSLATE_FIELDS = frozenset({"file", "model", "prompt", "response_format", "temperature"})


@dataclass(frozen=True)
class TranscriptionForm:
    """A transcription or translation request, its fields checked; the audio not yet decoded."""

    audio: bytes
    model: str | None
    language: str | None
    prompt: str | None
    response_format: TranscriptFormat
    temperature: float
    words: bool
    segments: bool
    stream: bool
    logprobs: bool


def _field(name: str) -> str:
    """`include[]` is how the openai SDK sends a list field; the name is `include`."""
    return name[:-2] if name.endswith("[]") else name


def parse_form(fields: list[tuple[str, Any]], audio: bytes, translate: bool) -> TranscriptionForm:
    """The request from its form fields (name, value) with the file's bytes; a 400 naming the
    first field that is wrong."""
    values: dict[str, list[str]] = {}
    for raw, value in fields:
        name = _field(raw)
        if name == "file":
            continue
        if name in _UNSUPPORTED_FIELDS and not translate:
            raise invalid_request(
                f"'{name}' is not supported by Whisper models", param=name, code="unsupported_field"
            )
        if name not in (_TRANSLATE_FIELDS if translate else _TRANSCRIBE_FIELDS):
            raise invalid_request(
                f"unsupported field '{name}'", param=name, code="unsupported_field"
            )
        if not isinstance(value, str):
            raise invalid_request(f"'{name}' must be a form field, not a file", param=name)
        values.setdefault(name, []).append(value)

    def one(name: str) -> str | None:
        given = values.get(name)
        return given[-1].strip() if given else None

    response_format = one("response_format") or "json"
    if response_format not in TRANSCRIPT_FORMATS:
        raise invalid_request(
            f"'response_format' must be one of {', '.join(TRANSCRIPT_FORMATS)}",
            param="response_format",
        )
    granularities = set(values.get("timestamp_granularities", ()))
    if granularities - {"word", "segment"}:
        raise invalid_request(
            "'timestamp_granularities' may hold 'word' and 'segment'",
            param="timestamp_granularities",
        )
    if granularities and response_format != "verbose_json":
        raise invalid_request(
            "'timestamp_granularities' needs response_format verbose_json",
            param="timestamp_granularities",
        )
    include = set(values.get("include", ()))
    if include - {"logprobs"}:
        raise invalid_request("'include' may only hold 'logprobs'", param="include")
    stream = _boolean(one("stream"), "stream")
    if stream and response_format not in ("json", "text"):
        raise invalid_request(
            f"stream=true sends text events: response_format {response_format} cannot stream",
            param="stream",
        )
    if include and response_format != "json":
        raise invalid_request("'include' logprobs needs response_format json", param="include")
    return TranscriptionForm(
        audio=audio,
        model=one("model"),
        language=_language(one("language")),
        prompt=one("prompt") or None,
        response_format=response_format,  # type: ignore[arg-type]
        temperature=_temperature(one("temperature")),
        words="word" in granularities or bool(include),
        segments="segment" in granularities or not granularities,
        stream=stream,
        logprobs=bool(include),
    )


def _boolean(value: str | None, name: str) -> bool:
    if value is None or value.lower() in ("false", "0", ""):
        return False
    if value.lower() in ("true", "1"):
        return True
    raise invalid_request(f"'{name}' must be true or false", param=name)


def _language(value: str | None) -> str | None:
    if not value:
        return None
    code = value.lower()
    if code not in LANGUAGES:
        raise invalid_request(
            f"'language' must be an ISO-639-1 code Whisper knows (en, fr, de, ...), not {value!r}",
            param="language",
        )
    return code


def _temperature(value: str | None) -> float:
    if not value:
        return 0.0
    try:
        temperature = float(value)
    except ValueError:
        raise invalid_request("'temperature' must be a number", param="temperature") from None
    if not 0.0 <= temperature <= 1.0:
        raise invalid_request("'temperature' must be between 0 and 1", param="temperature")
    return temperature


class VoiceId(BaseModel):
    """A voice named as an object, as OpenAI's custom voices are."""

    model_config = ConfigDict(extra="forbid")
    id: str


class SpeechRequest(BaseModel):
    """POST /v1/audio/speech."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    input: str = Field(max_length=MAX_SPEECH_INPUT)
    voice: str | VoiceId
    response_format: SpeechFormat = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    instructions: str | None = None
    """Accepted; the engines here have no way to act on it (documented)."""
    stream_format: Literal["audio", "sse"] = "audio"

    @property
    def voice_name(self) -> str:
        """The voice's name, however it was given."""
        return self.voice.id if isinstance(self.voice, VoiceId) else self.voice
