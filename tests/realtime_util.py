"""Helpers for the Realtime API tests: spoken clips as pcm16, chunked appends, and reading a
session's events up to one of a type."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import wave
from pathlib import Path
from typing import Any

import av
import numpy as np
import openai

from tests.audio_util import espeak, samples_of

EVENT_TIMEOUT = 120.0


def spoken_pcm(
    text: str, tmp: Path, rate: int = 24_000, pad_s: tuple[float, float] = (0.3, 1.0)
) -> np.ndarray:
    """`text` as espeak-ng says it, int16 at `rate`, with silence before and after."""
    samples = samples_of(espeak(text, "en-us", tmp), rate)
    speech = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    before, after = (np.zeros(int(s * rate), "<i2") for s in pad_s)
    return np.concatenate([before, speech, after])


def wav_bytes(samples: np.ndarray, rate: int) -> bytes:
    """int16 samples as a wav file."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(samples.astype("<i2").tobytes())
    return buffer.getvalue()


def mulaw(samples: np.ndarray, rate: int) -> bytes:
    """int16 samples as 8 kHz G.711 mu-law bytes (FFmpeg's encoder)."""
    data = wav_bytes(samples, rate)
    out = io.BytesIO()
    with av.open(io.BytesIO(data)) as source, av.open(out, "w", format="mulaw") as sink:
        stream = sink.add_stream("pcm_mulaw", rate=8000, layout="mono")
        resampler = av.AudioResampler(format="s16", layout="mono", rate=8000)
        for frame in source.decode(audio=0):
            for piece in resampler.resample(frame):
                for packet in stream.encode(piece):
                    sink.mux(packet)
        for packet in stream.encode(None):
            sink.mux(packet)
    return out.getvalue()


def b64(data: bytes | np.ndarray) -> str:
    raw = data.astype("<i2").tobytes() if isinstance(data, np.ndarray) else data
    return base64.b64encode(raw).decode()


def async_client(root: str, key: str = "x") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=root + "/v1", api_key=key, max_retries=0)


async def feed(
    conn: Any, samples: np.ndarray, rate: int = 24_000, chunk_ms: int = 100, pace: float = 1.0
) -> None:
    """Append `samples` in chunks of `chunk_ms`, each after the time it lasts (times `pace`;
    0: as fast as it goes)."""
    step = rate * chunk_ms // 1000
    for i in range(0, len(samples), step):
        await conn.input_audio_buffer.append(audio=b64(samples[i : i + step]))
        if pace:
            await asyncio.sleep(chunk_ms / 1000 * pace)


async def events_until(conn: Any, *types: str, timeout: float = EVENT_TIMEOUT) -> list[Any]:
    """The events up to and including the first of one of `types`."""
    seen: list[Any] = []

    async def read() -> None:
        async for event in conn:
            seen.append(event)
            if event.type in types:
                return
        raise AssertionError(f"the session closed before {types}: {[e.type for e in seen]}")

    await asyncio.wait_for(read(), timeout)
    return seen


async def raw_until(ws: Any, *types: str, timeout: float = EVENT_TIMEOUT) -> list[dict[str, Any]]:
    """Like events_until, on a bare websockets connection (JSON dicts)."""
    seen: list[dict[str, Any]] = []
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), timeout))
        seen.append(event)
        if event["type"] in types:
            return seen


def of_type(events: list[Any], kind: str) -> list[Any]:
    return [e for e in events if e.type == kind]


async def answers_to(root: str, events: list[dict[str, Any] | str]) -> list[Any]:
    """Send each event (a dict, or raw text) in a transcription session without VAD and read
    what answers it; the session must still answer one last session.update."""
    transcription = {"type": "transcription"}
    async with async_client(root).realtime.connect(extra_query={"intent": "transcription"}) as conn:
        await events_until(conn, "session.created")
        manual = {"input": {"turn_detection": None}}
        await conn.session.update(session={**transcription, "audio": manual})
        await events_until(conn, "session.updated")
        answers = []
        for event in events:
            await conn.send_raw(event if isinstance(event, str) else json.dumps(event))
            answers.append((await events_until(conn, "error", "session.updated"))[-1])
        await conn.session.update(session=transcription)
        assert (await events_until(conn, "session.updated"))[-1].type == "session.updated"
        return answers
