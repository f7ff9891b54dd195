"""A request's audio clips: base64 `input_audio` data decoded with PyAV (any container FFmpeg
reads) to mono float32 at the rate the model's audio projector takes, each limit checked."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mlxcel.media.decode import AudioError, decode_audio
from mlxcel.media.images import EncodedImage, Image
from mlxcel.media.policy import MediaError, MediaLimits
from mlxcel.media.sources import decode_base64


@dataclass(frozen=True)
class Audio:
    """A decoded clip: mono float32 samples at `rate`, and a digest that names it."""

    samples: bytes
    """float32, native byte order."""
    rate: int
    digest: str
    """sha256 of the rate and samples: the same sound in wav and mp3 is one clip only if it
    decodes to the same samples."""

    @property
    def seconds(self) -> float:
        """How long the clip lasts."""
        return len(self.samples) / 4 / self.rate


Media = Image | Audio
"""What a prompt's media marker stands for, as an engine reads it."""

SentMedia = EncodedImage | Audio
"""A request's media on their way to the model's worker: an image as it was sent (decoded in
the worker), a clip decoded at the projector's rate."""


def decoded(media: Sequence[SentMedia]) -> list[Media]:
    """Each medium as an engine reads it: an image decoded (once, for the same file sent
    again recently); a clip as it is."""
    return [medium.decoded() if isinstance(medium, EncodedImage) else medium for medium in media]


@dataclass(frozen=True)
class AudioRef:
    """An `input_audio` part: its base64 data, the format it claims, and where it sits."""

    data: str
    format: str
    param: str


def decode_clip(data: bytes, rate: int, max_seconds: float, param: str) -> Audio:
    """One clip decoded at `rate`; a MediaError naming `param` for anything but audio."""
    try:
        decoded = decode_audio(data, max_seconds, rate)
    except AudioError as exc:
        raise MediaError(str(exc), exc.code, param) from exc
    samples = np.ascontiguousarray(decoded.samples, dtype=np.float32).tobytes()
    digest = hashlib.sha256(f"{rate}:".encode() + samples).hexdigest()
    return Audio(samples, rate, digest)


async def load_audio(refs: Sequence[AudioRef], limits: MediaLimits, rate: int) -> list[Audio]:
    """Every clip of a request, in order, decoded off the event loop: their bytes together
    within --media-max-bytes, their durations together within --max-audio-seconds."""
    max_seconds = limits.max_audio_seconds
    clips: list[Audio] = []
    total_bytes, total_seconds = 0, 0.0
    for ref in refs:
        # base64 holds 3 bytes in 4 characters: a payload far over the limit is not decoded.
        if len(ref.data) // 4 * 3 > limits.max_total_bytes + 3:
            raise _too_large(limits, ref.param)
        try:
            data = decode_base64(ref.data)
        except MediaError:
            message = "input_audio.data is not valid base64"
            raise MediaError(message, "invalid_audio", ref.param) from None
        total_bytes += len(data)
        if total_bytes > limits.max_total_bytes:
            raise _too_large(limits, ref.param)
        clip = await asyncio.to_thread(decode_clip, data, rate, max_seconds, ref.param)
        total_seconds += clip.seconds
        if total_seconds > max_seconds:
            raise MediaError(
                f"the request's audio lasts more than the {max_seconds:g} s this server takes "
                f"(--max-audio-seconds; {total_seconds:.0f} s so far)",
                "audio_too_long",
                ref.param,
            )
        clips.append(clip)
    return clips


def _too_large(limits: MediaLimits, param: str) -> MediaError:
    return MediaError(
        f"the request's media come to more than the limit of {limits.max_total_bytes} bytes "
        "(--media-max-bytes)",
        "media_too_large",
        param,
    )
