"""Synthesised audio out as mp3, opus, aac, flac, wav or raw pcm (PyAV), whole or as it comes."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

SpeechFormat = Literal["mp3", "opus", "aac", "flac", "wav", "pcm"]
SPEECH_FORMATS: tuple[SpeechFormat, ...] = ("mp3", "opus", "aac", "flac", "wav", "pcm")


@dataclass(frozen=True)
class _Muxing:
    container: str
    codec: str
    sample_format: str
    rate: int | None
    """The codec's own rate when it has one (opus), else the engine's."""


_MUXING: dict[str, _Muxing] = {
    "mp3": _Muxing("mp3", "libmp3lame", "s16p", None),
    "opus": _Muxing("ogg", "libopus", "s16", 48_000),
    "aac": _Muxing("adts", "aac", "fltp", None),
    "flac": _Muxing("flac", "flac", "s16", None),
    "wav": _Muxing("wav", "pcm_s16le", "s16", None),
}

MEDIA_TYPES: dict[SpeechFormat, str] = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}


def pcm16(samples: np.ndarray) -> bytes:
    """Float samples in [-1, 1] as 16-bit little-endian PCM."""
    return _as_s16(samples).astype("<i2").tobytes()


class _Sink:
    """A write-only file for the muxer: without seek, it writes headers that stream."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out, self._parts = b"".join(self._parts), []
        return out


class AudioEncoder:
    """Encodes chunks of mono float samples into one file of `fmt`; each call returns the bytes
    that are ready, so a response can send them as they come."""

    def __init__(self, fmt: SpeechFormat, rate: int, *, streaming: bool) -> None:
        self.format = fmt
        self._rate = rate
        self._muxing = _MUXING.get(fmt)
        self._pts = 0
        self._sink: _Sink | io.BytesIO | None = None
        if self._muxing is not None:
            self._open(self._muxing, streaming)

    def _open(self, muxing: _Muxing, streaming: bool) -> None:
        import av

        self._sink = _Sink() if streaming else io.BytesIO()
        self._container: Any = av.open(self._sink, mode="w", format=muxing.container)
        rate = muxing.rate or self._rate
        self._stream: Any = self._container.add_stream(muxing.codec, rate=rate, layout="mono")
        self._resampler = av.AudioResampler(format=muxing.sample_format, layout="mono", rate=rate)

    def feed(self, samples: np.ndarray) -> bytes:
        """Encode more samples; the bytes the container has ready."""
        if self._muxing is None:
            return pcm16(samples)
        import av

        frame = av.AudioFrame.from_ndarray(_as_s16(samples), format="s16", layout="mono")
        frame.sample_rate = self._rate
        frame.pts = self._pts
        self._pts += samples.size
        self._mux(self._resampler.resample(frame))
        return self._ready()

    def finish(self) -> bytes:
        """Flush the encoder and close the container; the last bytes."""
        if self._muxing is None:
            return b""
        self._mux(self._resampler.resample(None))
        for packet in self._stream.encode(None):
            self._container.mux(packet)
        self._container.close()
        if isinstance(self._sink, io.BytesIO):
            return self._sink.getvalue()
        return self._ready()

    def _mux(self, frames: list[Any]) -> None:
        for frame in frames:
            for packet in self._stream.encode(frame):
                self._container.mux(packet)

    def _ready(self) -> bytes:
        return self._sink.take() if isinstance(self._sink, _Sink) else b""


def _as_s16(samples: np.ndarray) -> np.ndarray:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16).reshape(1, -1)


def encode_audio(samples: np.ndarray, rate: int, fmt: SpeechFormat) -> bytes:
    """One whole file."""
    encoder = AudioEncoder(fmt, rate, streaming=False)
    head = encoder.feed(samples)
    return head + encoder.finish()
