"""Audio in chat over HTTP: a tiny random-weight GGUF with a Voxtral-style audio projector
(libmtmd), built offline by bench/audio_models.py.

Random weights say nothing sensible, so the tests assert the path: audio tokens in usage (one
encoder window per started 30 s), determinism, different clips giving different
log-probabilities, streaming, and every refusal.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
from bench.audio_models import AudioShape
from bench.audio_models import build as build_projector
from bench.models import SHAPES, tiny

from tests.audio_util import written_as
from tests.conftest import serving
from tests.media_util import image_bytes
from tests.server_process import ServerProcess

PROJECTOR = AudioShape(tiny(SHAPES["smollm2-135m"]).hidden)
MAX_SECONDS, MAX_BYTES = 40, 2_000_000
RATE = 16_000


def tone(seconds: float, hz: float) -> np.ndarray:
    """A quiet sine wave at 16 kHz."""
    t = np.arange(int(seconds * RATE)) / RATE
    return (0.3 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


WAV = written_as(tone(1, 440), RATE, "wav")
OTHER_WAV = written_as(tone(1, 1200), RATE, "wav")
# 31 s: two 30 s windows of the encoder (libmtmd appends 30 s of silence, then drops the
# last incomplete window), where a 1 s clip is one.
LONG_MP3 = written_as(tone(31, 440), RATE, "mp3")


@pytest.fixture(scope="module")
def hears(tmp_path_factory: pytest.TempPathFactory, tiny_gguf: Path) -> Iterator[ServerProcess]:
    projector = build_projector(PROJECTOR, tmp_path_factory.mktemp("audio-model"))
    yield from serving(
        tmp_path_factory, "audio-input",
        "-m", str(tiny_gguf), "--mmproj", str(projector), "--ctx-size", "1024",
        "--max-audio-seconds", str(MAX_SECONDS), "--media-max-bytes", str(MAX_BYTES),
    )  # fmt: skip


def audio_part(data: bytes, fmt: str = "wav") -> dict[str, Any]:
    encoded = base64.b64encode(data).decode()
    return {"type": "input_audio", "input_audio": {"data": encoded, "format": fmt}}


def messages(*parts: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "text", "text": "Listen:"}, *parts]}]


def ask(client: openai.OpenAI, *parts: dict[str, Any], **extra: Any) -> Any:
    return client.chat.completions.create(
        model="m", messages=messages(*parts), max_tokens=3, temperature=0,
        logprobs=True, top_logprobs=3, **extra,
    )  # fmt: skip


def streams_as_whole(client: openai.OpenAI, whole: Any, *parts: dict[str, Any], steps: int) -> None:
    """The same request streamed says what `whole` said, with the same prompt tokens."""
    stream = client.chat.completions.create(
        model="m", messages=messages(*parts), max_tokens=steps, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def top(answer: Any) -> list[tuple[str, float]]:
    return [
        (t.token, round(t.logprob, 5)) for t in answer.choices[0].logprobs.content[0].top_logprobs
    ]


def refused(server: ServerProcess, *parts: dict[str, Any]) -> dict[str, Any]:
    with server.http() as http:
        response = http.post(
            "/v1/chat/completions", json={"messages": messages(*parts), "max_tokens": 1}
        )
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


def test_audio_tokens_count_in_usage_and_grow_with_length(hears: ServerProcess) -> None:
    client = hears.openai()
    none = ask(client).usage.prompt_tokens
    one = ask(client, audio_part(WAV)).usage.prompt_tokens
    longer = ask(client, audio_part(LONG_MP3, "mp3")).usage.prompt_tokens
    two = ask(client, audio_part(WAV), audio_part(OTHER_WAV)).usage.prompt_tokens
    # A window is `window_tokens` rows, with the projector's begin-audio text around it.
    assert one - none >= PROJECTOR.window_tokens
    assert longer - one == PROJECTOR.window_tokens
    assert two - one == one - none


def test_same_clip_same_answer_other_clip_other_logprobs(hears: ServerProcess) -> None:
    client = hears.openai()
    first = top(ask(client, audio_part(WAV)))
    assert top(ask(client, audio_part(WAV))) == first
    assert top(ask(client, audio_part(OTHER_WAV))) != first


def test_streaming_with_a_clip_counts_the_same(hears: ServerProcess) -> None:
    client = hears.openai()
    streams_as_whole(client, ask(client, audio_part(WAV)), audio_part(WAV), steps=3)


def test_the_projector_lists_audio(hears: ServerProcess) -> None:
    with hears.http() as http:
        (listed,) = http.get("/v1/models").json()["data"]
        props = http.get("/props").json()
    assert listed["input_modalities"] == ["text", "audio"]
    assert props["modalities"] == {"vision": False, "audio": True}


def test_limits(hears: ServerProcess) -> None:
    long_clip = audio_part(written_as(tone(MAX_SECONDS + 2, 300), RATE, "mp3"), "mp3")
    error = refused(hears, long_clip)
    assert error["code"] == "audio_too_long"
    assert error["param"] == "messages.0.content.1"
    assert "--max-audio-seconds" in error["message"]
    # Each clip is short enough; together they are not.
    error = refused(hears, audio_part(LONG_MP3, "mp3"), audio_part(LONG_MP3, "mp3"))
    assert (error["code"], error["param"]) == ("audio_too_long", "messages.0.content.2")
    error = refused(hears, audio_part(os.urandom(MAX_BYTES + 1000)))
    assert (error["code"], error["param"]) == ("media_too_large", "messages.0.content.1")
    assert "--media-max-bytes" in error["message"]


def test_what_is_not_audio_is_named(hears: ServerProcess) -> None:
    error = refused(hears, audio_part(image_bytes()))
    assert error["param"] == "messages.0.content.1"
    assert error["code"] == "invalid_audio"
    assert "found" in error["message"] and "png" in error["message"].lower()
    error = refused(hears, audio_part(b"just some words, not a recording"))
    assert "text starting with 'just some words" in error["message"]
    part = {"type": "input_audio", "input_audio": {"data": "not base64!", "format": "wav"}}
    error = refused(hears, part)
    assert error["message"] == "input_audio.data is not valid base64"
    part = {"type": "input_audio", "input_audio": {"format": "wav"}}
    assert refused(hears, part)["param"] == "messages.0.content.1.input_audio.data"


def test_an_image_is_refused_where_the_model_sees_none(hears: ServerProcess) -> None:
    url = "data:image/png;base64," + base64.b64encode(image_bytes()).decode()
    error = refused(hears, {"type": "image_url", "image_url": {"url": url}})
    assert error["message"] == "model does not support image input"
    assert error["param"] == "messages.0.content.1"


def test_responses_takes_no_audio_parts(hears: ServerProcess) -> None:
    # OpenAI's Responses API has no input_audio content part: a 400 naming it, not a guess.
    part = audio_part(WAV)
    item = {"role": "user", "content": [{"type": "input_text", "text": "Listen:"}, part]}
    with hears.http() as http:
        response = http.post("/v1/responses", json={"input": [item], "max_output_tokens": 1})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "input.0.message.content.1"
    assert "/v1/chat/completions" in error["message"]


def test_llama_servers_completion_hears_a_clip_in_multimodal_data(hears: ServerProcess) -> None:
    """A file of `multimodal_data` that is no image is a clip, for a model that hears."""

    def complete(*clips: bytes) -> Any:
        text = "Listen:" + " <__media__>" * len(clips)
        data = [base64.b64encode(clip).decode() for clip in clips]
        body = {"prompt": {"prompt_string": text, "multimodal_data": data}, "n_predict": 1}
        with hears.http() as http:
            return http.post("/completion", json=body)

    alone, heard = complete().json(), complete(WAV).json()
    assert heard["tokens_evaluated"] > alone["tokens_evaluated"]
    # What is neither an image nor audio is named by its place.
    response = complete(b"just some words, not a recording")
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("prompt.multimodal_data.0", "invalid_audio")
    # An image is told by its bytes, and this model sees none.
    response = complete(image_bytes())
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "model does not support image input"
