"""An MLX Kokoro folder served by mlx-audio over HTTP: a tiny random-weight model with the real
architecture (mlx-audio fixes the decoder's widths, which MLX's CPU convolutions make slow:
one short request here takes tens of seconds), so the test asserts structure only."""

from __future__ import annotations

import io
import wave
from collections.abc import Iterator

import pytest

from tests.conftest import start
from tests.mlx_kokoro_model import SAMPLES_PER_FRAME, VOICES, build_mlx_kokoro
from tests.server_process import ServerProcess

NAME = "tiny-mlx-kokoro"


@pytest.fixture(scope="module")
def mlx_kokoro_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with the tiny MLX Kokoro as its only model."""
    folder = tmp_path_factory.mktemp("mlx-kokoro")
    build_mlx_kokoro(folder / NAME)
    config = folder / "config.yaml"
    config.write_text(f"models:\n  - model: {NAME}\n    kind: speech\n")
    proc = start(folder, "--config", str(config))
    yield proc
    proc.stop_soon()


@pytest.mark.slow
def test_mlx_kokoro_speaks_and_lists_its_voices(mlx_kokoro_server: ServerProcess) -> None:
    client = mlx_kokoro_server.openai()
    audio = client.audio.speech.create(
        model=NAME, voice="am_adam", input="Hi.", response_format="wav"
    ).read()
    with wave.open(io.BytesIO(audio)) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (24_000, 1, 2)
        samples = len(wav.readframes(-1)) // 2
    # One frame per phoneme and pad (max_dur 1): a whole number of frames, at least the pads.
    assert samples >= 3 * SAMPLES_PER_FRAME and samples % SAMPLES_PER_FRAME == 0
    with mlx_kokoro_server.http() as http:
        listed = http.get("/v1/audio/voices", params={"model": NAME}).json()
        refused = http.post("/v1/audio/speech", json={"model": NAME, "input": "Hi.", "voice": "x"})
        models = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    assert listed["default"] == "af_heart"
    assert [v["id"] for v in listed["data"]] == sorted(VOICES)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "voice_not_found"
    assert models[NAME]["meta"]["backend"] == "mlx-audio"
