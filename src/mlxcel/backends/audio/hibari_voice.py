"""The Kokoro-distilled ONNX voices of the hibari-tts package (numpy and onnxruntime only)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from mlxcel.backends.audio.speech import SpeechJob, Voice

logger = logging.getLogger(__name__)

# The noise in hibari's vocoder is drawn from this seed, so the same request is the same audio.
NOISE_SEED = 0


def hibari_assets() -> Path:
    """The package's asset folder: the default voice's ONNX model and its G2P tables."""
    import hibari

    return Path(hibari.__file__).parent / "assets"


class HibariSynthesizer:
    """Every hibari voice already on this machine (the packaged one, and any in its cache);
    no voice is downloaded. One ONNX session per voice, shared by concurrent requests."""

    def __init__(self, threads: int = 1) -> None:
        from hibari import Hibari
        from hibari.voices import DEFAULT, VOICES, voice_path

        self._catalog: dict[str, dict[str, Any]] = VOICES
        self._default = DEFAULT
        self._voices: dict[str, Any] = {}
        shared_g2p: dict[bool, Any] = {}
        for name, info in VOICES.items():
            try:
                path = voice_path(name, download_missing=False)
            except FileNotFoundError:
                continue
            british = bool(info["british"])
            voice = Hibari(voice=name, model=path, threads=threads, g2p=shared_g2p.get(british))
            shared_g2p[british] = voice.g2p
            self._voices[name] = voice
        logger.info("hibari voices present: %s", ", ".join(self._voices))
        self._rate = int(self._voices[DEFAULT].sample_rate)

    @property
    def sample_rate(self) -> int:
        """24 kHz."""
        return self._rate

    @property
    def default_voice(self) -> str:
        """The packaged voice."""
        return self._default

    def voices(self) -> list[Voice]:
        """Every voice hibari knows; `present` for those that are here."""
        return [
            Voice(
                id=name,
                name=f"{info['accent']} {info['gender']} (Kokoro {info['kokoro']})",
                language=str(info["language"]),
                gender=str(info["gender"]),
                present=name in self._voices,
            )
            for name, info in self._catalog.items()
        ]

    def synthesize(self, job: SpeechJob) -> Iterator[np.ndarray]:
        """One array per sentence, in order."""
        voice = self._voices[job.voice]
        for chunk in voice.stream(job.text, speed=job.speed, seed=NOISE_SEED):
            if chunk.size:
                yield chunk.astype(np.float32, copy=False)

    def close(self) -> None:
        """Drop the sessions."""
        self._voices.clear()
