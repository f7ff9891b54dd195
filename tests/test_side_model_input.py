"""Inputs to the side models' routes (speech, transcription, embeddings) that once cost a 500:
each now has a clear answer, over HTTP on one server holding a model of each kind."""

from __future__ import annotations

import struct
import time
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


def test_a_huge_embd_normalize_is_a_400_and_a_large_one_the_max_norm(
    server: ServerProcess,
) -> None:
    """`embd_normalize` of 2**64 was a 500 (numpy cannot raise to it): past llama-server's C int
    it is a 400 naming the field; a p-norm up to it is the p-norm, not the zeros that
    |x|**p underflowing to 0 made past p ~ 100."""
    for path, field in (("/v1/embeddings", "input"), ("/embedding", "content")):
        for norm in (2**64, 2**31, -2):
            status, answer = _post(server, path, json={field: "hello", "embd_normalize": norm})
            assert (status, answer["error"]["param"]) == (400, "embd_normalize"), (path, norm)
    for norm in (200, 2**31 - 1):
        status, answer = _post(
            server, "/v1/embeddings", json={"input": "hello", "embd_normalize": norm}
        )
        assert status == 200
        assert max(abs(x) for x in answer["data"][0]["embedding"]) == pytest.approx(1.0), norm


def _wav(bits: int, tag: int = 1) -> bytes:
    """A mono 16 kHz WAV of silence whose header says `bits` per sample and format `tag`."""
    fmt = struct.pack("<HHIIHH", tag, 1, 16_000, 32_000, 2, bits)
    data = bytes(3200)
    body = b"WAVEfmt " + struct.pack("<I", len(fmt)) + fmt + b"data"
    body += struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_a_wav_in_no_known_encoding_is_a_400_naming_file(server: ServerProcess) -> None:
    """A WAV whose header gives 0 bits per sample (or a format tag FFmpeg does not know) was a
    500: FFmpeg opens it with no codec, which the decoder read the name of."""
    assert _post(server, "/v1/audio/transcriptions", files={"file": ("a.wav", _wav(16))})[0] == 200
    for bits, tag in ((0, 1), (0, 3), (65535, 1), (16, 0), (16, 0xFFFE)):
        status, answer = _post(
            server, "/v1/audio/transcriptions", files={"file": ("a.wav", _wav(bits, tag))}
        )
        error = answer["error"]
        assert (status, error["param"], error["code"]) == (400, "file", "invalid_audio"), bits
        assert "unknown or invalid encoding" in error["message"]


def test_an_embedding_input_too_large_for_the_model_is_refused_before_tokenizing(
    server: ServerProcess,
) -> None:
    """A 30 MB input took 19-40 s of tokenizing before its 400: its size alone refuses it now
    (MiniLM: 256 tokens of at most 18 bytes), or cuts it with truncate: true; inputs together
    too large for --embedding-max-tokens are a 413, also before tokenizing."""
    huge = "word " * 6_000_000
    many = ["word " * 2_400] * 2_000  # each within MiniLM's size, 24 MB together
    for body, status, code in (
        ({"input": huge}, 400, "input_too_long"),
        ({"input": ["fine", huge]}, 400, "input_too_long"),
        ({"input": many}, 413, "request_too_large"),
        ({"input": [101, huge, 102]}, 400, "input_too_long"),  # a text among token ids
    ):
        started = time.monotonic()
        got, answer = _post(server, "/v1/embeddings", json=body)
        assert (got, answer["error"]["code"], answer["error"]["param"]) == (status, code, "input")
        assert time.monotonic() - started < 5
    assert (
        "input 1 is 30000000 bytes"
        in _post(server, "/embedding", json={"content": ["a", huge]})[1]["error"]["message"]
    )
    started = time.monotonic()
    cut = _post(server, "/v1/embeddings", json={"input": huge, "truncate": True})
    assert time.monotonic() - started < 5
    # Cut by its size, then by its tokens: the same vector as any text of the same 256 tokens.
    same = _post(server, "/v1/embeddings", json={"input": "word " * 600, "truncate": True})
    assert (cut[0], same[0]) == (200, 200)
    assert cut[1]["data"][0]["embedding"] == pytest.approx(
        same[1]["data"][0]["embedding"], abs=1e-6
    )
