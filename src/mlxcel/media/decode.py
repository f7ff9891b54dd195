"""Uploaded audio in any container FFmpeg reads, decoded to mono float32 (PyAV): 16 kHz for
Whisper, or the rate an audio projector asks for."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from av.audio.stream import AudioStream
    from av.container import InputContainer

WHISPER_RATE = 16_000


class AudioError(ValueError):
    """The upload is not audio this server can decode, or breaks a limit (a 400)."""

    def __init__(self, message: str, code: str = "invalid_audio") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class DecodedAudio:
    """Mono samples at `rate`, and what the upload was."""

    samples: np.ndarray
    container: str
    codec: str
    rate: int = WHISPER_RATE

    @property
    def duration(self) -> float:
        """Seconds of audio."""
        return len(self.samples) / self.rate


def describe_bytes(data: bytes) -> str:
    """What a file that is not media looks like, for the error message."""
    head = data[:32]
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        return f"binary data starting with {head[:8].hex(' ')}"
    if text.isprintable() or all(c.isprintable() or c.isspace() for c in text):
        return f"text starting with {text[:24]!r}"
    return f"binary data starting with {head[:8].hex(' ')}"


def decode_audio(data: bytes, max_seconds: float, rate: int = WHISPER_RATE) -> DecodedAudio:
    """The upload's first audio stream as mono at `rate`; AudioError for anything else."""
    import av

    if not data:
        raise AudioError("the file is empty", code="empty_file")
    try:
        container = av.open(io.BytesIO(data), mode="r")
    except av.FFmpegError:
        raise AudioError(
            f"the file is not audio in a format this server reads: found {describe_bytes(data)}"
        ) from None
    with container:
        found = container.format.name
        if not container.streams.audio:
            kinds: list[str] = sorted({str(s.type) for s in container.streams}) or ["no streams"]
            raise AudioError(
                f"the file has no audio: found {found} ({container.format.long_name}) with "
                f"{', '.join(kinds)}"
            )
        stream = container.streams.audio[0]
        # FFmpeg opens a stream whose header names no codec it knows (a WAV with 0 bits per
        # sample, an unknown format tag) without a codec context: nothing can decode it.
        if stream.codec_context is None:
            raise AudioError(f"the audio ({found}) is in an unknown or invalid encoding")
        codec = stream.codec_context.name
        if container.duration is not None and container.duration / 1e6 > max_seconds + 1:
            raise _too_long(container.duration / 1e6, max_seconds)
        samples = _resampled(container, stream, max_seconds, found, rate)
    if samples.size == 0:
        raise AudioError(f"the file holds no audio samples ({found}, {codec})", code="empty_file")
    return DecodedAudio(samples, found, codec, rate)


def _resampled(
    container: InputContainer, stream: AudioStream, max_seconds: float, found: str, rate: int
) -> np.ndarray:
    import av

    resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
    limit = int((max_seconds + 1) * rate)
    parts: list[np.ndarray] = []
    total = 0
    try:
        for frame in container.decode(stream):
            for out in resampler.resample(frame):
                part = out.to_ndarray().reshape(-1)
                parts.append(part)
                total += part.size
            if total > limit:
                raise _too_long(total / rate, max_seconds)
        for out in resampler.resample(None):
            parts.append(out.to_ndarray().reshape(-1))
    except av.FFmpegError as exc:
        raise AudioError(f"the audio ({found}) could not be decoded: {exc}") from None
    samples = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    if samples.size > max_seconds * rate:
        raise _too_long(samples.size / rate, max_seconds)
    return samples.astype(np.float32, copy=False)


def _too_long(seconds: float, max_seconds: float) -> AudioError:
    return AudioError(
        f"the audio is longer than the {max_seconds:g} s this server takes "
        f"(--max-audio-seconds; at least {seconds:.0f} s)",
        code="audio_too_long",
    )
