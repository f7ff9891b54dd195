"""The multilingual Whisper base (joined from its two packages on first load): Spanish spoken by
espeak-ng is transcribed in Spanish and translated to English."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from mlxcel.backends.audio.defaults import BASE_SHA256
from tests.audio_util import espeak, words
from tests.conftest import start
from tests.server_process import ServerProcess

SPANISH = "El gato duerme en la casa todos los días."


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The server's cache folder, where it joins the model."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def base_server(tmp_path_factory: pytest.TempPathFactory, cache: Path) -> Iterator[ServerProcess]:
    """A server with whisper-base as its transcription model."""
    proc = start(
        tmp_path_factory.mktemp("base"),
        "--transcription-model",
        "whisper-base",
        env={"XDG_CACHE_HOME": str(cache)},
    )
    yield proc
    proc.stop()


@pytest.mark.slow
def test_spanish_transcribed_and_translated(
    base_server: ServerProcess, cache: Path, tmp_path: Path
) -> None:
    client: openai.OpenAI = base_server.openai()
    audio = espeak(SPANISH, "es", tmp_path)
    joined = cache / "mlxcel" / "whisper-base-ct2"
    assert (joined / "model.bin.sha256").read_text().strip() == BASE_SHA256
    verbose = client.audio.transcriptions.create(
        model="whisper-base", file=("es.wav", audio), response_format="verbose_json"
    )
    assert verbose.language == "spanish"
    spanish = client.audio.transcriptions.create(
        model="whisper-base", file=("es.wav", audio), language="es"
    )
    assert {"gato", "casa"} <= set(words(spanish.text)), spanish.text
    english = client.audio.translations.create(model="whisper-base", file=("es.wav", audio))
    heard = set(words(english.text))
    assert "house" in heard and not {"gato", "casa"} & heard, english.text
