"""Live transcription and a spoken conversation through /v1/realtime, against
/v1/audio/transcriptions of the same clip on the same server, in one run.

    python bench/realtime.py [--clips N]

Each clip is an espeak-ng sentence at 24 kHz after 0.3 s of silence, sent in 100 ms appends
paced in real time to a transcription session with server VAD:

- end of speech to transcript: the seconds from the last append (the commit follows it at once)
  to `conversation.item.input_audio_transcription.completed`, against a
  /v1/audio/transcriptions call of the same clip (wav) sent at that moment instead: the live
  session has decoded most of the turn already (target: at most 0.5x);
- the first partial: from the append that carries the start of speech to the first delta;
- the turn's own end: the clip followed by 0.8 s of silence, from `speech_stopped` (which
  waits the VAD's 500 ms of silence) to `completed`;
- the partial cadence: one decode of the whole turn (what each partial costs) against the
  cadence of partials (`PARTIAL_EVERY_S` in serving/realtime_transcribe.py);
- in a conversation session on the chat model and the hibari voice, from the last append of
  speech (0.8 s of silence follows) and from `speech_stopped` to the first audio delta of the
  reply.

Medians over the clips. On a shared machine the figures move with the load; the ratio is
measured in the same run, clip by clip.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path
from typing import Any

import av
import numpy as np
import openai

sys.path.insert(0, str(Path(__file__).resolve().parent))
from servers import _free_port, _start

MLXCEL = str(Path(sys.executable).parent / "mlxcel")
RATE = 24_000
CHUNK = RATE // 10
LEAD_S = 0.3
SENTENCES = (
    "Please send the report to the office by Friday morning.",
    "We will meet at the station at noon tomorrow.",
    "Bright sunlight fell across the quiet garden path.",
    "My sister bought fresh bread at the market.",
    "The quick brown fox jumps over the lazy dog.",
)


def clip(text: str, folder: Path) -> np.ndarray:
    """`text` as espeak-ng says it, 24 kHz int16."""
    path = folder / "clip.wav"
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True)
    with av.open(str(path)) as source:
        resampler = av.AudioResampler(format="s16", layout="mono", rate=RATE)
        parts = [
            o.to_ndarray().reshape(-1)
            for f in source.decode(audio=0)
            for o in resampler.resample(f)
        ]
    return np.concatenate(parts).astype("<i2")


def wav(samples: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes(samples.tobytes())
    return buffer.getvalue()


async def send_paced(conn: Any, audio: np.ndarray) -> list[float]:
    """Append `audio` in 100 ms chunks in real time; when each went."""
    sent = []
    began = time.perf_counter()
    for n, i in enumerate(range(0, len(audio), CHUNK)):
        await asyncio.sleep(max(0.0, began + n * 0.1 - time.perf_counter()))
        await conn.input_audio_buffer.append(
            audio=base64.b64encode(audio[i : i + CHUNK].tobytes()).decode()
        )
        sent.append(time.perf_counter())
    return sent


async def until(conn: Any, *types: str) -> tuple[list[tuple[float, Any]], Any]:
    """Events with their arrival time, up to one of `types`."""
    seen = []
    async for event in conn:
        seen.append((time.perf_counter(), event))
        if event.type in types:
            return seen, event
    raise RuntimeError("the session closed")


def first(seen: list[tuple[float, Any]], kind: str) -> float | None:
    return next((t for t, e in seen if e.type == kind), None)


async def live(client: openai.AsyncOpenAI, speech: np.ndarray) -> dict[str, float]:
    """A transcription session: the clip, a commit after its last append."""
    audio = np.concatenate([np.zeros(int(LEAD_S * RATE), "<i2"), speech])
    async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        await until(conn, "session.created")
        reader = asyncio.ensure_future(
            until(conn, "conversation.item.input_audio_transcription.completed")
        )
        sent = await send_paced(conn, audio)
        await conn.input_audio_buffer.commit()
        seen, done = await reader
    partial = first(seen, "conversation.item.input_audio_transcription.delta")
    start = sent[int(LEAD_S * 10)]
    return {
        "end_to_transcript": seen[-1][0] - sent[-1],
        "first_partial": (partial - start) if partial else float("nan"),
        "text": done.transcript,
    }


async def turn_end(client: openai.AsyncOpenAI, speech: np.ndarray) -> float:
    """From speech_stopped to completed, the clip followed by 0.8 s of silence."""
    audio = np.concatenate(
        [np.zeros(int(LEAD_S * RATE), "<i2"), speech, np.zeros(int(0.8 * RATE), "<i2")]
    )
    async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
        await until(conn, "session.created")
        reader = asyncio.ensure_future(
            until(conn, "conversation.item.input_audio_transcription.completed")
        )
        await send_paced(conn, audio)
        seen, _ = await reader
    stopped = first(seen, "input_audio_buffer.speech_stopped")
    assert stopped is not None
    return seen[-1][0] - stopped


async def conversation(client: openai.AsyncOpenAI, speech: np.ndarray) -> tuple[float, float]:
    """From the last append of speech, and from speech_stopped, to the reply's first audio."""
    audio = np.concatenate(
        [np.zeros(int(LEAD_S * RATE), "<i2"), speech, np.zeros(int(0.8 * RATE), "<i2")]
    )
    async with client.realtime.connect(model="default") as conn:
        await until(conn, "session.created")
        await conn.session.update(
            session={
                "type": "realtime",
                "instructions": "Answer in one short sentence.",
                "max_output_tokens": 40,
            }
        )
        reader = asyncio.ensure_future(until(conn, "response.output_audio.delta", "response.done"))
        sent = await send_paced(conn, audio)
        seen, _ = await reader
        await until(conn, "response.done")
    audio_at = first(seen, "response.output_audio.delta")
    stopped = first(seen, "input_audio_buffer.speech_stopped")
    assert audio_at is not None and stopped is not None
    last_speech = sent[int((LEAD_S + len(speech) / RATE) * 10)]
    return audio_at - last_speech, audio_at - stopped


def file_transcription(client: openai.OpenAI, speech: np.ndarray) -> float:
    data = wav(np.concatenate([np.zeros(int(LEAD_S * RATE), "<i2"), speech]))
    began = time.perf_counter()
    client.audio.transcriptions.create(model="whisper-1", file=("clip.wav", data))
    return time.perf_counter() - began


def median(values: list[float]) -> float:
    return statistics.median(values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", type=int, default=len(SENTENCES))
    args = parser.parse_args()
    port = _free_port()
    command = [MLXCEL, "serve", "--port", str(port), "--transcription-model", "default"]
    server = _start([*command, "--speech-model", "default"], port, "/health")
    try:
        with tempfile.TemporaryDirectory() as folder:
            clips = [clip(text, Path(folder)) for text in SENTENCES[: args.clips]]
        root = f"http://127.0.0.1:{port}/v1"
        sync = openai.OpenAI(base_url=root, api_key="x", max_retries=0)
        aclient = openai.AsyncOpenAI(base_url=root, api_key="x", max_retries=0)
        file_transcription(sync, clips[0])  # warm-up
        lives, files, ends, replies, replies_vad = [], [], [], [], []
        for speech in clips:
            lives.append(asyncio.run(live(aclient, speech)))
            files.append(file_transcription(sync, speech))
            ends.append(asyncio.run(turn_end(aclient, speech)))
            after_speech, after_stop = asyncio.run(conversation(aclient, speech))
            replies.append(after_speech)
            replies_vad.append(after_stop)
    finally:
        server.terminate()
        server.wait()
    to_text = median([x["end_to_transcript"] for x in lives])
    ratios = [x["end_to_transcript"] / f for x, f in zip(lives, files, strict=True)]
    lengths = ", ".join(f"{len(c) / RATE:.1f}" for c in clips)
    print(f"clips: {len(clips)} ({lengths} s of speech)")
    print(
        f"end of speech to transcript: live {to_text:.3f} s, /v1/audio/transcriptions "
        f"{median(files):.3f} s, ratio {to_text / median(files):.2f}x (target <= 0.5x); "
        f"per clip: {', '.join(f'{r:.2f}' for r in ratios)}"
    )
    partial = median([x["first_partial"] for x in lives])
    print(f"first partial after the start of speech: {partial:.3f} s")
    print(f"speech_stopped to transcript (after the VAD's 500 ms of silence): {median(ends):.3f} s")
    print(
        f"partial cadence: a partial every 1.0 s of new audio; one whole-clip decode takes "
        f"{median(files):.3f} s, so at most one decode is in flight"
    )
    print(
        f"conversation, end of speech to the reply's first audio: {median(replies):.3f} s "
        f"(from speech_stopped: {median(replies_vad):.3f} s)"
    )
    for x in lives:
        print(f"  heard: {x['text']}")


if __name__ == "__main__":
    main()
