"""The Realtime API's settings: which models a session joins, and its limits."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RealtimeConfig:
    """`/v1/realtime` sessions: the models they join (None: the server's default model of
    that kind, or the one a session names) and the limits each is held to."""

    chat_model: str | None = None
    """The text model that answers in a conversation session."""
    transcription_model: str | None = None
    """The Whisper model that hears the input audio."""
    speech_model: str | None = None
    """The voice that speaks the answers."""
    max_sessions: int = 4
    """Sessions open at once; one more is refused (an `error` event, close code 1013)."""
    max_session_seconds: float = 1800.0
    """How long one session may stay open (30 minutes), then it is closed (code 1000)."""
    idle_timeout: float = 120.0
    """Seconds without a client event before the session is closed (code 1000)."""
    max_audio_seconds: float = 1800.0
    """Seconds of input audio one session may append, all turns together."""
    max_message_bytes: int = 4 << 20
    """Bytes one client event may hold (4 MiB: 87 s of 24 kHz pcm16 in base64)."""
