"""Kokoro on MLX (mlx-audio): the engine for MLX Kokoro folders (mlx-community/Kokoro-82M-bf16's
layout: config.json with Kokoro's vocab, istftnet and plbert, safetensors weights, and
voices/<name>.safetensors, each a [510, 1, 256] `voice`), on Apple Silicon's GPU or MLX's CPU
backend elsewhere. mlx-audio's own pipeline phonemizes with misaki (espeak-ng behind it); this
one hands the model phonemes from kokoro_text instead."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from mlxcel.backends.audio.kokoro_text import KokoroVoices
from mlxcel.backends.audio.mlx_thread import MlxThread
from mlxcel.backends.audio.speech import SpeechJob

logger = logging.getLogger(__name__)

_KOKORO_FIELDS = ("istftnet", "plbert", "vocab")


def mlx_kokoro_voices(path: Path) -> list[Path] | None:
    """The voice files of an MLX Kokoro folder; None if the path is not one. One without
    voices raises ValueError saying so."""
    config = path / "config.json"
    if not path.is_dir() or not config.is_file() or not any(path.glob("*.safetensors")):
        return None
    try:
        fields = json.loads(config.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(fields, dict) or not all(name in fields for name in _KOKORO_FIELDS):
        return None
    voices = sorted((path / "voices").glob("*.safetensors"))
    if not voices:
        raise ValueError(f"{path} is an MLX Kokoro model without voices (voices/*.safetensors)")
    return voices


class MlxKokoroSynthesizer(KokoroVoices):
    """An MLX Kokoro model and its voices; one sentence at a time on the model's thread (MLX's
    device is one), so concurrent requests take turns sentence by sentence."""

    def __init__(self, path: Path) -> None:
        found = mlx_kokoro_voices(path)
        if found is None:
            raise ValueError(f"{path} is not an MLX Kokoro folder")
        voices: list[Path] = found
        self._path = path
        self._thread = MlxThread("mlx-kokoro")
        try:
            self._model, self._voices = self._thread.call(lambda: self._load(voices))
        except BaseException:
            self._thread.end()
            raise
        super().__init__(list(self._voices), int(self._model.sample_rate), dict(self._model.vocab))

    def _load(self, voices: list[Path]) -> tuple[Any, dict[str, Any]]:
        import mlx.core as mx
        from mlx_audio.tts.utils import load_model

        logger.info("loading %s with mlx-audio", self._path)
        model = load_model(self._path, model_type="kokoro")
        packs: dict[str, Any] = {}
        for file in voices:
            weights: Any = mx.load(str(file))
            packs[file.stem] = weights["voice"]
        return model, packs

    def synthesize(self, job: SpeechJob) -> Iterator[np.ndarray]:
        """One array per sentence (or per piece of a long one), in order."""
        pack = self._voices[job.voice]
        for phonemes in self._text.phonemes(job.text, job.voice):
            audio = self._thread.call(partial(self._speak, phonemes, pack, job.speed))
            if audio.size:
                yield audio

    def _speak(self, phonemes: str, pack: Any, speed: float) -> np.ndarray:
        style = pack[min(len(phonemes), pack.shape[0]) - 1]
        audio = self._model(phonemes, style, speed)
        return np.asarray(audio, np.float32).reshape(-1)

    def close(self) -> None:
        """Drop the model and end its thread."""
        self._thread.call(self._release)
        self._thread.end()

    def _release(self) -> None:
        self._model = None
        self._voices.clear()
