"""Inputs to the side models' routes (speech, transcription, embeddings) that once cost a 500:
each now has a clear answer, over HTTP on one server holding a model of each kind."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.audio_util import spoken
from tests.conftest import serving
from tests.server_process import ServerProcess

# 40 digits: more than hibari's number reader names (it stops at decillions, 36 digits).
LONG = "1234567890" * 4


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The chat model with the packaged voice, Whisper tiny.en and MiniLM beside it."""
    yield from serving(
        tmp_path_factory,
        "side-input",
        "--speech-model",
        "default",
        "--transcription-model",
        "default",
        "--embedding-model",
        "default",
    )


def _post(server: ServerProcess, path: str, **kw: Any) -> tuple[int, dict[str, Any]]:
    with server.http() as http:
        response = http.post(path, **kw)
    return response.status_code, response.json() if response.content[:1] == b"{" else {}


def test_a_number_too_long_to_name_is_read_digit_by_digit(server: ServerProcess) -> None:
    """An integer of 37 digits or more was a 500 (an IndexError in the voice's number reader):
    it is read one digit at a time, whatever spells it, and the same as its digits apart."""
    client = server.openai()
    apart = " ".join(LONG)
    for text in (LONG, f"-{LONG}", f"${LONG}", f"{LONG}th", f"{LONG}.5", "1," + "000," * 13 + "0"):
        assert len(spoken(client, f"Call {text} now.", "pcm")) > 24_000, text
    assert spoken(client, f"Call {LONG} now.", "pcm") == spoken(client, f"Call {apart} now.", "pcm")
    # Digits of other scripts, and characters NFKC makes digits of, are read as the lexicon does.
    for text in ("\u0661" * 40, "\u2079" * 40, "\u2469" * 20):
        assert len(spoken(client, text, "pcm")) > 24_000, text
