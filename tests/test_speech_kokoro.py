"""Kokoro ONNX models over HTTP with the openai client: tiny random-weight graphs with the real
inputs and outputs (kokoro-onnx's `tokens` export and onnx-community's `input_ids` one), each
beside a voices file of two voices. Random weights say nothing: the tests assert structure,
lengths against the speed, formats, streaming and determinism."""

from __future__ import annotations

import base64
import io
import json
import subprocess
import wave
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from tests.audio_util import samples_of
from tests.conftest import start
from tests.kokoro_onnx_model import SAMPLES_PER_ID, VOICES, build_kokoro_onnx
from tests.server_process import MLXCEL, ServerProcess, free_port

TOKENS = "kokoro-v1"
INPUT_IDS = "kokoro-community"
SENTENCES = "Good morning to you. The train leaves at nine. We will be there on time."
RATE = 24_000


@pytest.fixture(scope="module")
def kokoro_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server with both exports of the tiny graph, and no chat model."""
    folder = tmp_path_factory.mktemp("kokoro")
    build_kokoro_onnx(folder / TOKENS, "tokens")
    build_kokoro_onnx(folder / INPUT_IDS, "input_ids")
    config = folder / "config.yaml"
    config.write_text(
        "models:\n"
        f"  - model: {TOKENS}\n    kind: speech\n    threads: 1\n"
        f"  - model: {INPUT_IDS}\n    kind: speech\n    threads: 1\n"
    )
    proc = start(folder, "--config", str(config))
    yield proc
    proc.stop_soon()


@pytest.fixture(scope="module")
def client(kokoro_server: ServerProcess) -> openai.OpenAI:
    """The openai client on that server."""
    return kokoro_server.openai()


def said(
    client: openai.OpenAI, text: str, fmt: str = "pcm", model: str = TOKENS, **kw: object
) -> bytes:
    return client.audio.speech.create(
        model=model,
        voice=kw.pop("voice", "af_heart"),  # type: ignore[arg-type]
        input=text,
        response_format=fmt,  # type: ignore[arg-type]
        **kw,  # type: ignore[arg-type]
    ).read()


def test_every_format_decodes_to_the_same_length(client: openai.OpenAI) -> None:
    pcm = said(client, SENTENCES)
    samples = len(pcm) // 2
    # Each sentence is SAMPLES_PER_ID per phoneme id (pads included) at speed 1.
    assert samples and samples % SAMPLES_PER_ID == 0
    for fmt in ("mp3", "opus", "aac", "flac", "wav"):
        seconds = len(samples_of(said(client, SENTENCES, fmt))) / 16_000
        assert seconds == pytest.approx(samples / RATE, abs=0.1), fmt
    with wave.open(io.BytesIO(said(client, SENTENCES, "wav"))) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (RATE, 1, 2)
        assert len(wav.readframes(-1)) == 2 * samples


def test_speed_sets_the_length_and_requests_repeat(client: openai.OpenAI) -> None:
    normal = said(client, SENTENCES)
    assert said(client, SENTENCES) == normal
    assert len(said(client, SENTENCES, speed=0.5)) == 2 * len(normal)
    assert 2 * len(said(client, SENTENCES, speed=2.0)) == len(normal)


def test_voices_differ_and_openai_names_mean_the_default(client: openai.OpenAI) -> None:
    heart, lewis = (said(client, "Hello.", voice=v) for v in VOICES)
    assert len(heart) == len(lewis) and heart != lewis
    assert said(client, "Hello.", voice="alloy") == heart
    assert said(client, "Hello.", voice={"id": "bm_lewis"}) == lewis


def test_both_exports_make_the_same_audio(client: openai.OpenAI) -> None:
    assert said(client, SENTENCES, model=INPUT_IDS) == said(client, SENTENCES)


def test_streams_sentence_by_sentence(kokoro_server: ServerProcess, client: openai.OpenAI) -> None:
    with client.audio.speech.with_streaming_response.create(
        model=TOKENS, voice="af_heart", input=SENTENCES, response_format="pcm"
    ) as response:
        assert response.headers["content-type"] == "audio/pcm"
        streamed = b"".join(response.iter_bytes(chunk_size=None))
    assert streamed == said(client, SENTENCES)
    body = {"model": TOKENS, "input": SENTENCES, "voice": "af_heart", "response_format": "pcm"}
    with kokoro_server.http() as http:
        response = http.post("/v1/audio/speech", json={**body, "stream_format": "sse"})
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line[:6] == "data: "]
    kinds = [e["type"] for e in events]
    assert kinds == ["speech.audio.delta"] * 3 + ["speech.audio.done"]
    assert b"".join(base64.b64decode(e["audio"]) for e in events[:-1]) == streamed


def test_voices_listed_and_unknown_voice_refused(kokoro_server: ServerProcess) -> None:
    with kokoro_server.http() as http:
        listed = http.get("/v1/audio/voices", params={"model": TOKENS}).json()
        response = http.post(
            "/v1/audio/speech", json={"model": TOKENS, "input": "Hi.", "voice": "af_nobody"}
        )
        models = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    assert listed["default"] == "af_heart"
    assert [(v["id"], v["language"], v["gender"], v["present"]) for v in listed["data"]] == [
        ("af_heart", "en-US", "female", True),
        ("bm_lewis", "en-GB", "male", True),
    ]
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "voice_not_found" and "af_heart, bm_lewis" in error["message"]
    assert models[TOKENS]["meta"]["backend"] == models[INPUT_IDS]["meta"]["backend"]
    assert models[TOKENS]["meta"]["backend"] == "kokoro-onnx"


def test_a_graph_without_its_voices_file_stops_the_start(tmp_path: Path) -> None:
    folder = build_kokoro_onnx(tmp_path / "no-voices", voices=False)
    for source in (folder, folder / "kokoro-v1.0.onnx"):
        result = subprocess.run(
            [MLXCEL, "serve", "--port", str(free_port()), "--speech-model", str(source)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        lines = (result.stdout + result.stderr).strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1, lines
        assert "no voices file" in lines[0] and "voices-v1.0.bin" in lines[0]
