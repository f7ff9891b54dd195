"""A realtime session's audio: client chunks decoded (base64, pcm16 at 24 or 16 kHz, G.711) and
resampled to Whisper's 16 kHz as they come, the voice's pcm resampled to the client's 24 kHz,
and turns found in Silero's speech probabilities."""

from __future__ import annotations

import binascii
from dataclasses import dataclass
from typing import Any

import numpy as np
import pybase64

from mlxcel.backends.audio.voice_activity import VAD_RATE, WINDOW
from mlxcel.protocol.realtime import InputFormat, RealtimeError, TurnDetection

OUTPUT_RATE = 24_000
"""The rate of the audio a session sends (pcm16, as OpenAI's audio/pcm)."""


def _g711_tables() -> dict[str, np.ndarray]:
    """Every 8-bit G.711 code's 16-bit sample, for mu-law and A-law (ITU-T G.711)."""
    codes = np.arange(256, dtype=np.int32)
    u = ~codes & 0xFF
    magnitude = (((u & 0x0F) << 3) + 0x84) << ((u & 0x70) >> 4)
    ulaw = np.where(u & 0x80, 0x84 - magnitude, magnitude - 0x84)
    a = codes ^ 0x55
    exponent = (a & 0x70) >> 4
    mantissa = a & 0x0F
    value = np.where(
        exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << (exponent - 1)
    )
    alaw = np.where(a & 0x80, value, -value)
    return {"g711_ulaw": ulaw.astype(np.int16), "g711_alaw": alaw.astype(np.int16)}


_G711 = _g711_tables()


def decoded_chunk(data: str, fmt: InputFormat) -> np.ndarray:
    """One `input_audio_buffer.append`'s audio as int16 samples at the format's rate; an
    error event's reason when it is not base64 or not whole samples."""
    try:
        raw = pybase64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise RealtimeError(
            "'audio' is not valid base64", code="invalid_base64", param="audio"
        ) from None
    if fmt.encoding != "pcm16":
        return _G711[fmt.encoding][np.frombuffer(raw, np.uint8)]
    if len(raw) % 2:
        raise RealtimeError(
            f"'audio' holds {len(raw)} bytes, not whole 16-bit samples: pcm16 audio is 2 bytes "
            "a sample, little-endian",
            code="invalid_audio_format",
            param="audio",
        )
    return np.frombuffer(raw, "<i2")


class Resampler:
    """Mono int16 samples at one rate to float32 (or int16) at another, chunk by chunk
    (FFmpeg's resampler, through PyAV, which keeps its filter state between chunks)."""

    def __init__(self, source: int, target: int, out_format: str = "flt") -> None:
        import av

        self._av: Any = av
        self._source = source
        self._same = source == target and out_format == "flt"
        self._resampler = av.AudioResampler(format=out_format, layout="mono", rate=target)
        self._dtype = np.float32 if out_format == "flt" else np.int16

    def push(self, samples: np.ndarray) -> np.ndarray:
        """The output that `samples` (int16) make ready."""
        if self._same:
            return samples.astype(np.float32) / 32768.0
        if len(samples) == 0:
            return np.zeros(0, self._dtype)
        frame = self._av.AudioFrame.from_ndarray(
            np.ascontiguousarray(samples, np.int16).reshape(1, -1), format="s16", layout="mono"
        )
        frame.sample_rate = self._source
        return self._joined(self._resampler.resample(frame))

    def flush(self) -> np.ndarray:
        """What the resampler still holds."""
        if self._same:
            return np.zeros(0, np.float32)
        return self._joined(self._resampler.resample(None))

    def _joined(self, frames: list[Any]) -> np.ndarray:
        parts = [f.to_ndarray().reshape(-1) for f in frames]
        return np.concatenate(parts).astype(self._dtype) if parts else np.zeros(0, self._dtype)


def input_resampler(fmt: InputFormat) -> Resampler:
    """The client's audio to Whisper's and Silero's 16 kHz float samples."""
    return Resampler(fmt.rate, VAD_RATE)


def output_resampler(rate: int) -> Resampler:
    """The voice's pcm16 to the session's 24 kHz pcm16."""
    return Resampler(rate, OUTPUT_RATE, "s16")


def ms(samples: int) -> int:
    """16 kHz samples as milliseconds."""
    return samples * 1000 // VAD_RATE


@dataclass
class TurnChange:
    """What one window's probability changed: speech began or ended (sample positions in the
    session's 16 kHz input, from its start)."""

    started: int | None = None
    stopped: int | None = None
    paused: int | None = None
    """Speech fell silent here (not yet long enough to end the turn)."""


class TurnDetector:
    """OpenAI's server_vad on Silero's probabilities: speech starts at a window over the
    threshold, and ends after `silence_duration_ms` under the threshold less 0.15 (Silero's
    own hysteresis)."""

    def __init__(self, settings: TurnDetection) -> None:
        self.settings = settings
        self.speaking = False
        self._silent_since: int | None = None
        self.last_speech = 0
        """Where the last window with speech ended."""

    def reset(self) -> None:
        """The turn was committed by the client: the next speech starts a new one."""
        self.speaking = False
        self._silent_since = None

    def feed(self, probabilities: np.ndarray, first: int) -> list[TurnChange]:
        """The changes in windows starting at sample `first`, one after another."""
        changes: list[TurnChange] = []
        off = max(self.settings.threshold - 0.15, 0.01)
        silence = self.settings.silence_duration_ms * VAD_RATE // 1000
        for i, p in enumerate(probabilities.tolist()):
            start = first + i * WINDOW
            if p >= self.settings.threshold:
                self._silent_since = None
                self.last_speech = start + WINDOW
                if not self.speaking:
                    self.speaking = True
                    changes.append(TurnChange(started=start))
            elif self.speaking and p < off:
                if self._silent_since is None:
                    self._silent_since = start
                    changes.append(TurnChange(paused=start))
                elif start + WINDOW - self._silent_since >= silence:
                    self.speaking = False
                    self._silent_since = None
                    changes.append(TurnChange(stopped=start + WINDOW))
        return changes
