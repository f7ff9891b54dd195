"""What a text-to-speech engine takes and gives: plain, picklable data, no engine objects."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

# OpenAI's built-in voice names: clients send one whatever the server, so each means the
# model's default voice here.
OPENAI_VOICES = frozenset(
    {
        "alloy",
        "ash",
        "ballad",
        "coral",
        "echo",
        "fable",
        "onyx",
        "nova",
        "sage",
        "shimmer",
        "verse",
        "marin",
        "cedar",
    }
)


@dataclass(frozen=True)
class Voice:
    """One voice a speech model knows, and whether its weights are here to use."""

    id: str
    name: str
    language: str
    gender: str
    present: bool


@dataclass(frozen=True)
class SpeechJob:
    """One synthesis: the text, a voice the model has, and a speed (1.0: as trained)."""

    text: str
    voice: str
    speed: float = 1.0


class Synthesizer(Protocol):
    """The speech capability: what a route may ask of a text-to-speech model."""

    @property
    def sample_rate(self) -> int:
        """Samples per second of what it makes."""
        ...

    @property
    def default_voice(self) -> str:
        """The voice OpenAI's voice names mean."""
        ...

    def voices(self) -> list[Voice]:
        """Every voice it knows, present or not."""
        ...

    def synthesize(self, job: SpeechJob) -> Iterator[np.ndarray]:
        """Mono float32 samples in [-1, 1], one array per sentence as each is ready
        (CPU-heavy: call on a thread)."""
        ...

    def close(self) -> None:
        """Free the weights."""
        ...
