"""Whisper on MLX (mlx-whisper): the engine for MLX Whisper folders, on Apple Silicon's GPU or
MLX's CPU backend elsewhere."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mlxcel.backends.audio.mlx_thread import MlxThread
from mlxcel.backends.audio.transcript import (
    FALLBACK_TEMPERATURES,
    Segment,
    TranscribeJob,
    TranscriptInfo,
    Word,
)
from mlxcel.media.decode import WHISPER_RATE

logger = logging.getLogger(__name__)

# mlx-whisper keeps the model it transcribes with in one process-wide holder, and MLX runs on one
# device: every MLX Whisper model in this process takes turns on this lock.
_DEVICE = threading.Lock()
_DIMENSIONS = ("n_mels", "n_audio_ctx", "n_vocab", "n_text_ctx")


def is_mlx_whisper(path: Path) -> bool:
    """An MLX Whisper folder: weights.safetensors (or .npz) beside a config with Whisper's
    dimensions (n_mels, n_audio_ctx, ...)."""
    config = path / "config.json"
    weights = (path / "weights.safetensors").is_file() or (path / "weights.npz").is_file()
    if not weights or not config.is_file():
        return False
    try:
        fields = json.loads(config.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(fields, dict) and all(name in fields for name in _DIMENSIONS)


class MlxWhisperTranscriber:
    """An MLX Whisper model: one transcription at a time (MLX's device is one), greedy decoding
    (mlx-whisper has no beam search), half precision on a GPU and full on a CPU.

    Every MLX call runs on one worker thread the model owns: MLX streams belong to the thread
    that made them, and that thread clears them before it ends."""

    def __init__(self, path: Path) -> None:
        self._path = str(path)
        self._thread = MlxThread("mlx-whisper")
        try:
            self._model, self._fp16 = self._thread.call(self._load)
        except BaseException:
            self._thread.end()
            raise

    def _load(self) -> tuple[Any, bool]:
        import mlx.core as mx
        from mlx_whisper.load_models import load_model

        dtype = mx.float16 if mx.default_device() == mx.gpu else mx.float32
        logger.info("loading %s with mlx-whisper (%s)", self._path, dtype)
        return load_model(self._path, dtype=dtype), dtype == mx.float16

    @property
    def multilingual(self) -> bool:
        """Whether the model knows languages other than English."""
        return bool(self._model.is_multilingual)

    @property
    def parallel(self) -> int:
        """One: requests to MLX models take turns on the device."""
        return 1

    def transcribe(self, job: TranscribeJob) -> Iterator[TranscriptInfo | Segment]:
        """The info, then the segments (mlx-whisper gives them all at the end)."""
        result = self._thread.call(lambda: self._transcribe(job))
        duration = len(job.audio) / WHISPER_RATE
        # mlx-whisper reports the language it detected, not its probability.
        yield TranscriptInfo(str(result["language"]), 1.0, duration)
        for index, segment in enumerate(result["segments"]):
            yield Segment(
                id=index,
                seek=int(segment["seek"]),
                start=float(segment["start"]),
                end=float(segment["end"]),
                text=str(segment["text"]),
                tokens=tuple(int(t) for t in segment["tokens"]),
                temperature=float(segment["temperature"]),
                avg_logprob=float(segment["avg_logprob"]),
                compression_ratio=float(segment["compression_ratio"]),
                no_speech_prob=float(segment["no_speech_prob"]),
                words=tuple(_word(w) for w in segment.get("words") or ()),
            )

    def _transcribe(self, job: TranscribeJob) -> dict[str, Any]:
        import mlx_whisper
        from mlx_whisper.transcribe import ModelHolder

        temperatures = FALLBACK_TEMPERATURES if job.temperature == 0 else (job.temperature,)
        if job.draft:
            temperatures = (0.0,)
        with _DEVICE:
            ModelHolder.model, ModelHolder.model_path = self._model, self._path
            result: dict[str, Any] = mlx_whisper.transcribe(
                job.audio,
                path_or_hf_repo=self._path,
                verbose=None,
                temperature=temperatures,
                initial_prompt=job.prompt or None,
                word_timestamps=job.words,
                language=job.language,
                task=job.task,
                fp16=self._fp16,
            )
        return result

    def close(self) -> None:
        """Drop the model, from mlx-whisper's holder too, and end the worker thread."""
        self._thread.call(self._release)
        self._thread.end()

    def _release(self) -> None:
        from mlx_whisper.transcribe import ModelHolder

        with _DEVICE:
            if ModelHolder.model is self._model:
                ModelHolder.model, ModelHolder.model_path = None, None
        self._model = None


def _word(word: dict[str, Any]) -> Word:
    return Word(
        float(word["start"]), float(word["end"]), str(word["word"]), float(word["probability"])
    )
