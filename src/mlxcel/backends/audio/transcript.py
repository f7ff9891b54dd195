"""What a transcription engine takes and gives: plain, picklable data, no engine objects."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

Task = Literal["transcribe", "translate"]
# Where temperature 0 falls back to when a segment decodes badly (whisper's own schedule).
FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)


@dataclass(frozen=True)
class TranscribeJob:
    """One transcription: 16 kHz mono samples and how to decode them."""

    audio: np.ndarray
    task: Task = "transcribe"
    language: str | None = None
    """An ISO-639-1 code, or None to detect it."""
    prompt: str | None = None
    temperature: float = 0.0
    """0: greedy first, then higher temperatures where decoding fails (as OpenAI's whisper-1)."""
    words: bool = False
    """Word timestamps and probabilities."""
    draft: bool = False
    """A partial transcript of audio still being spoken: greedy, at temperature 0 alone
    (cheaper; the turn's last decode is a full one)."""


@dataclass(frozen=True)
class Word:
    """One word, its times in seconds and the engine's probability for it."""

    start: float
    end: float
    word: str
    probability: float


@dataclass(frozen=True)
class Segment:
    """One decoded segment, with what OpenAI's verbose_json reports about it."""

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: tuple[Word, ...] = ()


@dataclass(frozen=True)
class TranscriptInfo:
    """What is known before the first segment: the language and the audio's length."""

    language: str
    language_probability: float
    duration: float


class Transcriber(Protocol):
    """The transcription capability: what a route may ask of a speech-to-text model."""

    @property
    def multilingual(self) -> bool:
        """Whether it knows languages other than English (and so can translate)."""
        ...

    @property
    def parallel(self) -> int:
        """How many transcriptions it runs side by side."""
        ...

    def transcribe(self, job: TranscribeJob) -> Iterator[TranscriptInfo | Segment]:
        """The info first, then each segment as it is decoded (CPU-heavy: call on a thread)."""
        ...

    def close(self) -> None:
        """Free the weights."""
        ...
