"""A loaded speech model as the audio routes use it: its engine, how many requests it runs at
once, and the limits it enforces. The engine is behind its capability class (Transcriber,
Synthesizer), which takes and gives plain data only."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from mlxcel.backends.audio.defaults import HIBARI, packaged_transcription
from mlxcel.backends.audio.speech import Synthesizer
from mlxcel.backends.audio.transcript import Transcriber

logger = logging.getLogger(__name__)

T = TypeVar("T")
_END = object()
# OpenAI's upload limit.
MAX_UPLOAD_BYTES = 25 * 1024 * 1024
DEFAULT_MAX_AUDIO_SECONDS = 3600.0


@dataclass
class AudioModel:
    """What audio models share: a name and a bound on requests running side by side."""

    name: str
    parallel: int
    _slots: asyncio.Semaphore | None = field(default=None, init=False, repr=False)

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the model's `parallel` places while a request runs on it."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.parallel)
        async with self._slots:
            yield


@dataclass
class TranscriptionModel(AudioModel):
    """A speech-to-text model."""

    engine: Transcriber = field(kw_only=True)
    max_seconds: float = field(default=DEFAULT_MAX_AUDIO_SECONDS, kw_only=True)

    def close(self) -> None:
        """Free the engine."""
        self.engine.close()


@dataclass
class SpeechModel(AudioModel):
    """A text-to-speech model."""

    engine: Synthesizer = field(kw_only=True)

    def close(self) -> None:
        """Free the engine."""
        self.engine.close()


async def on_threads(items: Iterator[T]) -> AsyncIterator[T]:
    """An engine's iterator, each step run on a worker thread so the event loop never blocks."""
    while True:
        item = await asyncio.to_thread(next, items, _END)
        if item is _END:
            return
        yield item  # type: ignore[misc]


def default_parallel(threads: int) -> int:
    """Requests a model runs side by side when not told: one per two threads, up to four."""
    return max(1, min(4, threads // 2))


def open_transcriber(source: Path, threads: int, parallel: int) -> Transcriber:
    """The engine for a transcription model: a packaged name, or a CTranslate2 Whisper folder."""
    from mlxcel.backends.audio.faster_whisper import (
        FasterWhisperTranscriber,
        WhisperOptions,
        is_ctranslate2_whisper,
    )

    path = packaged_transcription(str(source)) or source
    if not is_ctranslate2_whisper(path):
        raise ValueError(
            f"{source} is not a Whisper model this server reads: a CTranslate2 Whisper folder "
            "(model.bin, config.json), or default, whisper-tiny.en or whisper-base"
        )
    return FasterWhisperTranscriber(path, WhisperOptions(threads=threads, parallel=parallel))


def open_synthesizer(source: Path) -> Synthesizer:
    """The engine for a speech model: hibari's voices for `default` or `hibari`."""
    from mlxcel.backends.audio.hibari_voice import HibariSynthesizer

    if str(source) not in ("default", HIBARI):
        raise ValueError(f"{source} is not a speech model this server reads: use default or hibari")
    return HibariSynthesizer()
