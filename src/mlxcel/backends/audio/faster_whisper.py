"""Whisper on CTranslate2 (faster-whisper): the fast engine on a CPU."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxcel.backends.audio.transcript import (
    FALLBACK_TEMPERATURES,
    Segment,
    TranscribeJob,
    TranscriptInfo,
    Word,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WhisperOptions:
    """How the engine runs: its threads split between side-by-side workers."""

    threads: int = 1
    parallel: int = 1
    compute_type: str = "int8"
    beam_size: int = 5


def is_ctranslate2_whisper(path: Path) -> bool:
    """A CTranslate2 Whisper folder: model.bin beside a config with Whisper's alignment heads."""
    return (path / "model.bin").is_file() and (path / "config.json").is_file()


class FasterWhisperTranscriber:
    """A CTranslate2 Whisper model; `parallel` transcriptions run at once, each on its own
    worker with an equal share of the threads, with no lock between them."""

    def __init__(self, path: Path, options: WhisperOptions) -> None:
        from faster_whisper import WhisperModel

        self._options = options
        self._parallel = max(1, options.parallel)
        threads = max(1, options.threads // self._parallel)
        logger.info(
            "loading %s with faster-whisper (%s, %d worker(s) x %d thread(s))",
            path,
            options.compute_type,
            self._parallel,
            threads,
        )
        self._model: Any = WhisperModel(
            str(path),
            device="cpu",
            compute_type=options.compute_type,
            cpu_threads=threads,
            num_workers=self._parallel,
            local_files_only=True,
        )

    @property
    def multilingual(self) -> bool:
        """Whether the model knows languages other than English."""
        return bool(self._model.model.is_multilingual)

    @property
    def parallel(self) -> int:
        """Transcriptions that run side by side."""
        return self._parallel

    def transcribe(self, job: TranscribeJob) -> Iterator[TranscriptInfo | Segment]:
        """The info, then each segment as the model decodes it."""
        temperatures = FALLBACK_TEMPERATURES if job.temperature == 0 else (job.temperature,)
        if job.draft:
            temperatures = (0.0,)
        segments, info = self._model.transcribe(
            job.audio,
            language=job.language,
            task=job.task,
            initial_prompt=job.prompt or None,
            temperature=list(temperatures),
            beam_size=1 if job.draft else self._options.beam_size,
            word_timestamps=job.words,
        )
        yield TranscriptInfo(info.language, float(info.language_probability), info.duration)
        for index, segment in enumerate(segments):
            yield Segment(
                id=index,
                seek=int(segment.seek),
                start=float(segment.start),
                end=float(segment.end),
                text=segment.text,
                tokens=tuple(int(t) for t in segment.tokens),
                temperature=float(segment.temperature or 0.0),
                avg_logprob=float(segment.avg_logprob),
                compression_ratio=float(segment.compression_ratio),
                no_speech_prob=float(segment.no_speech_prob),
                words=tuple(
                    Word(float(w.start), float(w.end), w.word, float(w.probability))
                    for w in segment.words or ()
                ),
            )

    def close(self) -> None:
        """Drop the model (CTranslate2 frees it with the object)."""
        self._model = None
