"""Audio for the speech tests, made offline: the server's own voice, espeak-ng for other
languages, and PyAV to write every container the routes must read."""

from __future__ import annotations

import io
import re
import subprocess
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import openai

# The containers (and codecs) an upload may come in, as PyAV writes them.
CONTAINERS: dict[str, tuple[str, str, int]] = {
    "wav": ("wav", "pcm_s16le", 16_000),
    "flac": ("flac", "flac", 16_000),
    "mp3": ("mp3", "libmp3lame", 24_000),
    "ogg": ("ogg", "libopus", 48_000),
    "webm": ("webm", "libopus", 48_000),
    "m4a": ("ipod", "aac", 24_000),
}


def spoken(client: openai.OpenAI, text: str, response_format: str = "wav") -> bytes:
    """The text as the server's default voice says it."""
    response = client.audio.speech.create(
        model="default", voice="heart", input=text, response_format=response_format
    )
    return response.read()


def samples_of(data: bytes, rate: int = 16_000) -> np.ndarray:
    """Any audio file's first stream as mono float32 at `rate` (read back with PyAV)."""
    with av.open(io.BytesIO(data)) as container:
        resampler = av.AudioResampler(format="flt", layout="mono", rate=rate)
        parts = [
            out.to_ndarray().reshape(-1)
            for frame in container.decode(audio=0)
            for out in resampler.resample(frame)
        ]
    return np.concatenate(parts) if parts else np.zeros(0, np.float32)


def written_as(samples: np.ndarray, rate: int, container: str) -> bytes:
    """Mono samples written in one of CONTAINERS by PyAV."""
    fmt, codec, codec_rate = CONTAINERS[container]
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=fmt) as out:
        stream = out.add_stream(codec, rate=codec_rate, layout="mono")
        resampler = av.AudioResampler(
            format=stream.codec_context.codec.audio_formats[0].name, layout="mono", rate=codec_rate
        )
        frame = av.AudioFrame.from_ndarray(
            (np.clip(samples, -1, 1) * 32767).astype(np.int16).reshape(1, -1),
            format="s16",
            layout="mono",
        )
        frame.sample_rate = rate
        frame.pts = 0
        frame.time_base = Fraction(1, rate)
        for piece in [*resampler.resample(frame), *resampler.resample(None)]:
            for packet in stream.encode(piece):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buffer.getvalue()


def espeak(text: str, voice: str, tmp: Path) -> bytes:
    """The text spoken by espeak-ng (Debian's, installed by the Makefile) as a wav file."""
    path = tmp / f"espeak-{voice}.wav"
    subprocess.run(["espeak-ng", "-v", voice, "-w", str(path), text], check=True)
    return path.read_bytes()


def words(text: str) -> list[str]:
    """Lower-case words without punctuation."""
    return re.findall(r"[a-z0-9']+", text.lower())


def word_error_rate(reference: str, hypothesis: str) -> float:
    """Word-level edit distance over the reference's length."""
    ref, hyp = words(reference), words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, start=1):
        diagonal, row[0] = row[0], i
        for j, h in enumerate(hyp, start=1):
            diagonal, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, diagonal + (r != h))
    return row[-1] / max(1, len(ref))


def timestamps(text: str, separator: str) -> list[float]:
    """Every cue time in an srt (`,`) or vtt (`.`) file, in order, in seconds."""
    found = re.findall(rf"(\d\d):(\d\d):(\d\d){re.escape(separator)}(\d\d\d)", text)
    return [int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000 for h, m, s, ms in found]
