"""The Realtime API over WebSocket with the openai SDK's realtime client: live transcription
(server VAD on Silero, partial transcripts, manual commits, every input format), conversations
joining the tiny chat model and the hibari voice (audio that decodes to speech, text, tools,
cancel and barge-in), and every bad event. Auth, origin and the session limits are in
test_realtime_limits.py."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.audio_util import word_error_rate, words
from tests.conftest import serving
from tests.realtime_util import (
    answers_to,
    async_client,
    b64,
    events_until,
    feed,
    mulaw,
    of_type,
    spoken_pcm,
    wav_bytes,
)
from tests.server_process import ServerProcess

pytestmark = pytest.mark.slow

SENTENCE = "Please send the report to the office by Friday morning. We will meet at noon."
# The live transcript against /v1/audio/transcriptions of the same clip: the same model on the
# same audio (resampled and cut by the VAD), so only a word or two may differ.
MAX_WER = 0.25
TURN_SECONDS = 12
SESSION_AUDIO_SECONDS = 40
MESSAGE_BYTES = 400_000
TRANSCRIPTION = {"type": "transcription"}


@pytest.fixture(scope="module")
def rt_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Whisper tiny.en, the hibari voice and the chat model, with small limits."""
    yield from serving(
        tmp_path_factory,
        "realtime",
        "--transcription-model",
        "default",
        "--speech-model",
        "default",
        "--max-audio-seconds",
        str(TURN_SECONDS),
        "--realtime-max-audio-seconds",
        str(SESSION_AUDIO_SECONDS),
        "--realtime-max-message-bytes",
        str(MESSAGE_BYTES),
    )


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """SENTENCE spoken, 24 kHz pcm16, with silence around it."""
    return spoken_pcm(SENTENCE, tmp_path_factory.mktemp("clip"))


@pytest.fixture(scope="module")
def heard(rt_server: ServerProcess, clip: np.ndarray) -> str:
    """What /v1/audio/transcriptions hears in the clip."""
    client = rt_server.openai()
    result = client.audio.transcriptions.create(
        model="whisper-1", file=("clip.wav", wav_bytes(clip, 24_000))
    )
    return result.text


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_server_vad_gives_deltas_before_the_end_of_speech(
    rt_server: ServerProcess, clip: np.ndarray, heard: str
) -> None:
    async def session() -> list[Any]:
        client = async_client(rt_server.root)
        async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
            created = await events_until(conn, "session.created")
            assert created[-1].session.type == "transcription"
            audio = {
                "input": {"turn_detection": {"type": "server_vad", "silence_duration_ms": 500}}
            }
            await conn.session.update(session={**TRANSCRIPTION, "audio": audio})
            updated = await events_until(conn, "session.updated")
            turn = updated[-1].session.audio.input.turn_detection
            assert turn.type == "server_vad" and turn.silence_duration_ms == 500
            feeding = asyncio.create_task(feed(conn, clip))
            events = await events_until(
                conn, "conversation.item.input_audio_transcription.completed"
            )
            await feeding
            return events

    events = run(session())
    kinds = [e.type for e in events]
    started = kinds.index("input_audio_buffer.speech_started")
    stopped = kinds.index("input_audio_buffer.speech_stopped")
    assert started < stopped < kinds.index("input_audio_buffer.committed")
    deltas = of_type(events, "conversation.item.input_audio_transcription.delta")
    assert deltas and kinds.index(deltas[0].type) < stopped, kinds
    item_id = events[started].item_id
    assert {d.item_id for d in deltas} == {item_id}
    assert events[stopped].audio_end_ms > events[started].audio_start_ms >= 200
    completed = events[-1]
    assert completed.item_id == item_id and completed.usage.type == "duration"
    assert word_error_rate(heard, completed.transcript) <= MAX_WER, (heard, completed.transcript)
    joined = "".join(d.delta for d in deltas)
    assert words(joined) == words(completed.transcript)[: len(words(joined))]


@pytest.mark.parametrize(
    ("session_fields", "encode", "rate"),
    [
        ({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}, "pcm", 16_000),
        ({"input_audio_format": "g711_ulaw"}, "mulaw", 8_000),
    ],
    ids=["pcm16-16khz", "beta-g711-ulaw"],
)
def test_manual_commit_without_vad(
    rt_server: ServerProcess,
    clip: np.ndarray,
    heard: str,
    tmp_path: Path,
    session_fields: dict[str, Any],
    encode: str,
    rate: int,
) -> None:
    beta = "input_audio_format" in session_fields
    audio, data = np.zeros(0, "<i2"), b""
    if encode == "pcm":
        audio = spoken_pcm(SENTENCE, tmp_path, rate=16_000)
        chunks = [b64(audio[i : i + 1600]) for i in range(0, len(audio), 1600)]
    else:
        data = mulaw(clip, 24_000)
        chunks = [b64(data[i : i + 800]) for i in range(0, len(data), 800)]

    async def session() -> list[Any]:
        client = async_client(rt_server.root)
        async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
            update: dict[str, Any] = {"turn_detection": None, **session_fields}
            if beta:
                await conn.send({"type": "transcription_session.update", "session": update})
            else:
                audio = {"input": {**session_fields["audio"]["input"], "turn_detection": None}}
                await conn.session.update(session={**TRANSCRIPTION, "audio": audio})
            updated = await events_until(conn, "session.updated")
            assert updated[-1].session.audio.input.turn_detection is None
            for chunk in chunks:
                await conn.input_audio_buffer.append(audio=chunk)
            await conn.input_audio_buffer.commit()
            return await events_until(conn, "conversation.item.input_audio_transcription.completed")

    events = run(session())
    kinds = [e.type for e in events]
    assert "input_audio_buffer.speech_started" not in kinds
    assert kinds.index("input_audio_buffer.committed") < len(kinds) - 1
    assert word_error_rate(heard, events[-1].transcript) <= MAX_WER, events[-1].transcript
    sent = len(audio) / rate if encode == "pcm" else len(data) / rate
    assert events[-1].usage.seconds == pytest.approx(sent, abs=0.1)


def _conversation_turn(events: list[Any]) -> tuple[bytes, str]:
    """The reply's pcm16 and its transcript, after checking the response's events."""
    kinds = [e.type for e in events]
    for kind in ("response.created", "response.output_item.added", "response.content_part.added"):
        assert kind in kinds
    audio = b"".join(
        base64.b64decode(e.delta) for e in of_type(events, "response.output_audio.delta")
    )
    deltas = of_type(events, "response.output_audio_transcript.delta")
    done = of_type(events, "response.output_audio_transcript.done")[0]
    assert "".join(d.delta for d in deltas) == done.transcript
    assert kinds.index("response.output_audio.done") < kinds.index("response.done")
    return audio, done.transcript


def test_a_spoken_conversation_answers_in_speech(
    rt_server: ServerProcess, clip: np.ndarray
) -> None:
    async def session() -> list[Any]:
        client = async_client(rt_server.root)
        async with client.realtime.connect(model="gpt-realtime") as conn:
            await events_until(conn, "session.created")
            await conn.session.update(
                session={
                    "type": "realtime",
                    "instructions": "Answer in one short sentence.",
                    "max_output_tokens": 30,
                }
            )
            await events_until(conn, "session.updated")
            await feed(conn, clip, pace=0)
            return await events_until(conn, "response.done")

    events = run(session())
    kinds = [e.type for e in events]
    assert kinds.index("conversation.item.input_audio_transcription.completed") < kinds.index(
        "response.created"
    )
    audio, transcript = _conversation_turn(events)
    done = events[-1].response
    assert done.status == "completed" and done.usage.output_tokens > 0
    assert done.output[0].content[0].transcript == transcript
    # The reply's audio is speech: Whisper hears in it most of the words of its transcript.
    client = rt_server.openai()
    said = client.audio.transcriptions.create(
        model="whisper-1", file=("reply.wav", wav_bytes(np.frombuffer(audio, "<i2"), 24_000))
    ).text
    assert len(audio) > 24_000 and word_error_rate(transcript, said) <= 0.6, (transcript, said)


def test_text_in_text_out_and_tools(rt_server: ServerProcess) -> None:
    tool = {
        "type": "function",
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    }

    async def session() -> tuple[list[Any], list[Any]]:
        client = async_client(rt_server.root)
        async with client.realtime.connect(model="default") as conn:
            await events_until(conn, "session.created")
            await conn.session.update(
                session={"type": "realtime", "output_modalities": ["text"], "tools": [tool]}
            )
            await events_until(conn, "session.updated")
            await conn.response.cancel()
            nothing = (await events_until(conn, "error"))[-1].error.code
            await conn.conversation.item.retrieve(item_id="item_missing")
            missing = (await events_until(conn, "error"))[-1].error.code
            assert (nothing, missing) == ("response_cancel_not_active", "item_not_found")
            await conn.conversation.item.create(
                item={
                    "type": "message",
                    "role": "user",
                    "content": [{"type": "input_text", "text": "What is the weather in Paris?"}],
                }
            )
            await conn.response.create(
                response={"tool_choice": {"type": "function", "name": "get_weather"}}
            )
            called = await events_until(conn, "response.done")
            call = of_type(called, "response.function_call_arguments.done")[0]
            await conn.conversation.item.create(
                item={"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
            )
            await conn.response.create(response={"max_output_tokens": 20})
            return called, await events_until(conn, "response.done")

    called, answered = run(session())
    call = of_type(called, "response.function_call_arguments.done")[0]
    assert call.name == "get_weather" and isinstance(json.loads(call.arguments)["city"], str)
    assert called[-1].response.output[-1].type == "function_call"
    texts = of_type(answered, "response.output_text.delta")
    assert texts and not of_type(answered, "response.output_audio.delta")
    done = of_type(answered, "response.output_text.done")[0]
    assert "".join(t.delta for t in texts) == done.text
    assert answered[-1].response.status == "completed"


def test_cancel_and_barge_in_stop_the_audio(rt_server: ServerProcess, clip: np.ndarray) -> None:
    ask = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "Tell me a long story about a dragon."}],
    }

    async def session() -> tuple[list[Any], list[Any]]:
        client = async_client(rt_server.root)
        async with client.realtime.connect(model="default") as conn:
            await events_until(conn, "session.created")
            await conn.conversation.item.create(item=ask)
            await conn.response.create(response={"max_output_tokens": 400})
            await events_until(conn, "response.output_audio.delta")
            await conn.response.cancel()
            cancelled = await events_until(conn, "response.done")
            # Barge-in: speech while the next reply plays stops it.
            await conn.response.create(response={"max_output_tokens": 400})
            await events_until(conn, "response.output_audio.delta")
            feeding = asyncio.create_task(feed(conn, clip, pace=0))
            interrupted = await events_until(conn, "response.done")
            await feeding
            return cancelled, interrupted

    cancelled, interrupted = run(session())
    first = cancelled[-1].response.id
    assert cancelled[-1].response.status == "cancelled"
    # Nothing of the cancelled response comes after its response.done.
    assert all(getattr(e, "response_id", None) != first for e in interrupted)
    assert cancelled[-1].response.status_details.reason == "client_cancelled"
    assert interrupted[-1].response.status == "cancelled"
    assert interrupted[-1].response.status_details.reason == "turn_detected"
    kinds = [e.type for e in interrupted]
    assert "input_audio_buffer.speech_started" in kinds


def test_bad_events_are_error_events_and_the_session_goes_on(rt_server: ServerProcess) -> None:
    odd = base64.b64encode(b"\x00\x01\x02").decode()
    bad: list[dict[str, Any] | str] = [
        {"type": "input_audio_buffer.append", "audio": "not base64!"},
        {"type": "input_audio_buffer.append", "audio": odd},
        {"type": "input_audio_buffer.dance", "event_id": "mine"},
        "{not json",
        "[1, 2]",
        json.dumps({"type": "input_audio_buffer.append", "audio": "A" * MESSAGE_BYTES}),
        {"type": "session.update", "session": {"type": "transcription", "colour": "red"}},
        {
            "type": "session.update",
            "session": {
                "type": "transcription",
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": 44100}}},
            },
        },
        {"type": "session.update", "session": {"type": "realtime"}},
        {"type": "input_audio_buffer.commit"},
        {"type": "response.create"},
    ]
    codes = [
        "invalid_base64",
        "invalid_audio_format",
        "unknown_event",
        "invalid_json",
        "invalid_event",
        "message_too_large",
        "unknown_parameter",
        "invalid_value",
        "invalid_value",
        "input_audio_buffer_commit_empty",
        "invalid_event",
    ]
    answers = asyncio.run(answers_to(rt_server.root, bad))
    assert [a.type for a in answers] == ["error"] * len(bad)
    assert [a.error.code for a in answers] == codes
    assert (
        answers[2].error.event_id == "mine"
        and "input_audio_buffer.dance" in answers[2].error.message
    )
    assert answers[6].error.param == "session.colour"
    assert answers[7].error.param == "session.audio.input.format.rate"


def test_the_turn_and_session_audio_limits(rt_server: ServerProcess) -> None:
    second = b64(np.zeros(24_000, "<i2"))

    async def session() -> tuple[str, list[str]]:
        client = async_client(rt_server.root)
        codes: list[str] = []
        async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
            await events_until(conn, "session.created")
            manual = {"input": {"turn_detection": None}}
            await conn.session.update(session={**TRANSCRIPTION, "audio": manual})
            await events_until(conn, "session.updated")
            for _ in range(TURN_SECONDS + 1):
                await conn.input_audio_buffer.append(audio=second)
            full = (await events_until(conn, "error"))[-1].error.code
            await conn.input_audio_buffer.clear()
            await events_until(conn, "input_audio_buffer.cleared")
            while not codes or codes[-1] == "input_audio_buffer.cleared":
                for _ in range(4):
                    await conn.input_audio_buffer.append(audio=second)
                await conn.input_audio_buffer.clear()
                answer = (await events_until(conn, "error", "input_audio_buffer.cleared"))[-1]
                codes.append(answer.error.code if answer.type == "error" else answer.type)
            return full, codes

    full, codes = run(session())
    assert full == "input_audio_buffer_full"
    # 12 s went into the full buffer: seven more turns of 4 s reach the session's 40 s.
    cycles = (SESSION_AUDIO_SECONDS - TURN_SECONDS) // 4
    assert codes == ["input_audio_buffer.cleared"] * cycles + ["session_audio_limit"]
