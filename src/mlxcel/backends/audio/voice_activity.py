"""Voice activity: Silero's model, as faster-whisper ships it (ONNX Runtime, one thread), giving
the probability of speech in each 32 ms window of 16 kHz audio."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

VAD_RATE = 16_000
WINDOW = 512
"""Samples per window the model scores (32 ms at 16 kHz)."""


@functools.lru_cache(maxsize=1)
def _model() -> Any:
    try:
        from faster_whisper.vad import get_vad_model
    except ImportError as exc:  # the mlx-whisper extra alone
        raise RuntimeError(
            "voice activity needs faster-whisper's Silero model: install mlxcel[audio]"
        ) from exc
    return get_vad_model()


def speech_probabilities(samples: np.ndarray, context: np.ndarray | None = None) -> np.ndarray:
    """The probability of speech in each whole window of `samples` (16 kHz mono float32; a
    partial window at the end is not scored), `context` being the window before them, if any
    (the model reads the end of the previous window with each one)."""
    count = len(samples) // WINDOW
    if count == 0:
        return np.zeros(0, np.float32)
    audio = np.asarray(samples[: count * WINDOW], np.float32)
    if context is not None and len(context) == WINDOW:
        scored = _model()(np.concatenate([np.asarray(context, np.float32), audio]))
        return np.asarray(scored, np.float32).reshape(-1)[1:]
    return np.asarray(_model()(audio), np.float32).reshape(-1)
