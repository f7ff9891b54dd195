"""The Realtime API's session configuration as clients send it, in OpenAI's GA shape (the
current openai SDK's `session.update`) or the beta one (`transcription_session.update`,
`input_audio_format`, `modalities`), and as the server reports it (GA), with its errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

SessionKind = Literal["realtime", "transcription"]
Encoding = Literal["pcm16", "g711_ulaw", "g711_alaw"]
# GA `audio/*` types and beta names of the input formats.
_GA_FORMATS: dict[str, Encoding] = {
    "audio/pcm": "pcm16",
    "audio/pcmu": "g711_ulaw",
    "audio/pcma": "g711_alaw",
}
_RATES = (24_000, 16_000)
# Fields a session update may carry that change nothing here (said so in docs/realtime.md).
NO_EFFECT = frozenset(
    {
        "include",
        "tracing",
        "truncation",
        "prompt",
        "reasoning",
        "parallel_tool_calls",
        "noise_reduction",
        "input_audio_noise_reduction",
        "client_secret",
        "expires_at",
        "id",
        "object",
        "speed",
    }
)


class RealtimeError(Exception):
    """A client event the session cannot take: answered as an `error` event."""

    def __init__(
        self,
        message: str,
        *,
        code: str,
        param: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.param = param
        self.type = type

    def event_error(self, event_id: str | None) -> dict[str, Any]:
        """The `error` object of the event that answers it."""
        return {
            "type": self.type,
            "code": self.code,
            "message": self.message,
            "param": self.param,
            "event_id": event_id,
        }


@dataclass(frozen=True)
class InputFormat:
    """How the client's audio is encoded."""

    encoding: Encoding = "pcm16"
    rate: int = 24_000

    def as_object(self) -> dict[str, Any]:
        """The GA format object."""
        if self.encoding == "pcm16":
            return {"type": "audio/pcm", "rate": self.rate}
        return {"type": "audio/pcmu" if self.encoding == "g711_ulaw" else "audio/pcma"}


@dataclass(frozen=True)
class TurnDetection:
    """server_vad's settings (OpenAI's defaults)."""

    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    create_response: bool = True
    interrupt_response: bool = True

    def as_object(self) -> dict[str, Any]:
        """The GA turn_detection object."""
        return {"type": "server_vad", **self.__dict__, "idle_timeout_ms": None}


@dataclass(frozen=True)
class Transcription:
    """Which model hears the input, and its hints."""

    model: str | None = None
    language: str | None = None
    prompt: str | None = None

    def as_object(self) -> dict[str, Any]:
        """The GA transcription object."""
        return {
            "model": self.model or "whisper-1",
            "language": self.language,
            "prompt": self.prompt,
        }


@dataclass(frozen=True)
class SessionConfig:
    """A session's effective configuration."""

    kind: SessionKind
    id: str
    model: str | None = None
    instructions: str = ""
    modality: Literal["audio", "text"] = "audio"
    voice: str | None = None
    input_format: InputFormat = field(default_factory=InputFormat)
    transcription: Transcription = field(default_factory=Transcription)
    turn_detection: TurnDetection | None = field(default_factory=TurnDetection)
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] = "auto"
    temperature: float | None = None
    max_output_tokens: int | None = None

    def as_object(self) -> dict[str, Any]:
        """The session as session.created and session.updated report it (GA)."""
        audio_in = {
            "format": self.input_format.as_object(),
            "transcription": self.transcription.as_object(),
            "turn_detection": self.turn_detection.as_object() if self.turn_detection else None,
            "noise_reduction": None,
        }
        if self.kind == "transcription":
            return {
                "type": "transcription",
                "object": "realtime.transcription_session",
                "id": self.id,
                "audio": {"input": audio_in},
                "include": [],
            }
        output = {"format": {"type": "audio/pcm", "rate": 24_000}, "voice": self.voice or "alloy"}
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": self.id,
            "model": self.model or "default",
            "instructions": self.instructions,
            "output_modalities": [self.modality],
            "audio": {"input": audio_in, "output": {**output, "speed": 1.0}},
            "tools": list(self.tools),
            "tool_choice": self.tool_choice,
            "max_output_tokens": self.max_output_tokens or "inf",
        }


def fail(param: str, message: str, code: str = "invalid_value") -> RealtimeError:
    return RealtimeError(f"'{param}' {message}", code=code, param=param)


def object_of(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise fail(param, "must be an object", "invalid_type")
    return value


def string_of(value: Any, param: str, *, optional: bool = True) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, str):
        raise fail(param, "must be a string", "invalid_type")
    return value


def refuse_unknown(body: dict[str, Any], known: set[str], where: str) -> None:
    extra = sorted(set(body) - known - NO_EFFECT)
    if extra:
        raise RealtimeError(
            f"unknown field '{where}.{extra[0]}'",
            code="unknown_parameter",
            param=f"{where}.{extra[0]}",
        )


def input_format(value: Any, param: str) -> InputFormat:
    """A GA format object or a beta format name."""
    if isinstance(value, str):
        if value in ("pcm16", "g711_ulaw", "g711_alaw"):
            return InputFormat(value, 24_000 if value == "pcm16" else 8_000)  # type: ignore[arg-type]
        raise fail(param, f"'{value}' is not a format: use pcm16, g711_ulaw or g711_alaw")
    body = object_of(value, param)
    kind = body.get("type", "audio/pcm")
    if kind not in _GA_FORMATS:
        raise fail(f"{param}.type", f"'{kind}' is not a format: audio/pcm, audio/pcmu, audio/pcma")
    encoding = _GA_FORMATS[kind]
    if encoding != "pcm16":
        return InputFormat(encoding, 8_000)
    rate = body.get("rate", 24_000)
    if rate not in _RATES:
        raise fail(f"{param}.rate", f"{rate!r} is not served: audio/pcm at 24000 or 16000 Hz")
    return InputFormat("pcm16", rate)


def output_format(value: Any, param: str) -> None:
    if value in ("pcm16", None) or (
        isinstance(value, dict) and value.get("type", "audio/pcm") == "audio/pcm"
    ):
        if isinstance(value, dict) and value.get("rate", 24_000) != 24_000:
            raise fail(f"{param}.rate", "must be 24000: the audio goes out at 24 kHz")
        return
    raise fail(param, "must be pcm16 (audio/pcm at 24 kHz): the only output format here")


def turn_detection(value: Any, param: str) -> TurnDetection | None:
    """server_vad's settings, or None (the client commits)."""
    if value is None:
        return None
    body = object_of(value, param)
    if body.get("type", "server_vad") != "server_vad":
        raise fail(f"{param}.type", f"'{body.get('type')}' is not served: use server_vad or null")
    known = {"type", "threshold", "prefix_padding_ms", "silence_duration_ms"}
    refuse_unknown(
        body, known | {"create_response", "interrupt_response", "idle_timeout_ms"}, param
    )
    settings = TurnDetection()
    threshold = body.get("threshold", settings.threshold)
    if not isinstance(threshold, int | float) or not 0 <= threshold <= 1:
        raise fail(f"{param}.threshold", "must be a number from 0 to 1")
    times: dict[str, Any] = {}
    for name in ("prefix_padding_ms", "silence_duration_ms"):
        time = body.get(name, getattr(settings, name))
        if not isinstance(time, int) or isinstance(time, bool) or not 0 <= time <= 10_000:
            raise fail(f"{param}.{name}", "must be whole milliseconds from 0 to 10000")
        times[name] = time
    flags = {n: bool(body.get(n, True)) for n in ("create_response", "interrupt_response")}
    return TurnDetection(float(threshold), **times, **flags)


def transcription(value: Any, param: str) -> Transcription:
    """The input transcription's model and hints."""
    if value is None:
        return Transcription()
    body = object_of(value, param)
    refuse_unknown(body, {"model", "language", "prompt", "delay", "keywords", "languages"}, param)
    language = string_of(body.get("language"), f"{param}.language")
    if language is not None and not (len(language) in (2, 3) and language.isalpha()):
        raise fail(f"{param}.language", "must be an ISO-639-1 code, like 'en'")
    return Transcription(
        string_of(body.get("model"), f"{param}.model"),
        language,
        string_of(body.get("prompt"), f"{param}.prompt"),
    )
