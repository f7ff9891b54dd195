"""Speech both ways over HTTP with the openai client: the default voice speaks, the default
Whisper (tiny.en) transcribes; every format, stream, container and bad upload."""

from __future__ import annotations

import base64
import io
import json
import os
import time
import wave
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import av
import httpx
import numpy as np
import openai
import pytest

from tests.audio_util import (
    CONTAINERS,
    samples_of,
    spoken,
    timestamps,
    word_error_rate,
    words,
    written_as,
)
from tests.conftest import serving
from tests.openapi_check import check_operations
from tests.server_process import ServerProcess

SENTENCE = "Please send the report to the office by Friday morning."
# One sentence per container an upload may come in (wav is how the server speaks).
SENTENCES = (
    "The quick brown fox jumps over the lazy dog.",
    "We will meet at the station at noon tomorrow.",
    "Bright sunlight fell across the quiet garden path.",
    "My sister bought fresh bread at the market.",
    SENTENCE,
)
# Measured here: 0 word errors on each of SENTENCES; the bound leaves room for other CPUs.
MAX_WER = 0.25
# Longer than every clip here, so the limit's 400 needs only a short upload.
MAX_SECONDS = 8


@pytest.fixture(scope="module")
def audio_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with the packaged Whisper tiny.en and hibari voice beside the chat model."""
    yield from serving(
        tmp_path_factory,
        "audio",
        "--transcription-model",
        "default",
        "--speech-model",
        "default",
        "--max-audio-seconds",
        str(MAX_SECONDS),
    )


@pytest.fixture(scope="module")
def client(audio_server: ServerProcess) -> openai.OpenAI:
    """The openai client on the audio server."""
    return audio_server.openai()


@pytest.fixture(scope="module")
def speech(client: openai.OpenAI) -> bytes:
    """SENTENCE as the server says it, in wav."""
    return spoken(client, SENTENCE)


@pytest.fixture(scope="module")
def heard(client: openai.OpenAI, speech: bytes) -> openai.types.audio.Transcription:
    """The json transcript of `speech`: what every other format of the same request must say."""
    return client.audio.transcriptions.create(model="whisper-1", file=("a.wav", speech))


def transcribe(client: openai.OpenAI, data: bytes, name: str = "speech.wav", **kw: object) -> str:
    result = client.audio.transcriptions.create(
        model="whisper-1",
        file=(name, data),
        **kw,  # type: ignore[call-overload]
    )
    return result if isinstance(result, str) else result.text


def test_json_text_srt_and_vtt_say_the_same(
    client: openai.OpenAI, speech: bytes, heard: openai.types.audio.Transcription
) -> None:
    usage = heard.model_dump()["usage"]
    assert usage["type"] == "duration" and usage["seconds"] >= 1
    assert word_error_rate(SENTENCE, heard.text) <= MAX_WER, heard.text
    assert transcribe(client, speech, response_format="text") == heard.text + "\n"
    srt = transcribe(client, speech, response_format="srt")
    vtt = transcribe(client, speech, response_format="vtt")
    assert srt.startswith("1\n") and vtt.startswith("WEBVTT\n")
    for cues, separator in ((srt, ","), (vtt, ".")):
        times = timestamps(cues, separator)
        assert times and times == sorted(times)
        said = [line for line in cues.splitlines()[1:] if "-->" not in line and not line.isdigit()]
        assert words(" ".join(said)) == words(heard.text), cues


def test_verbose_json_segments_cover_the_audio_and_words(
    client: openai.OpenAI, speech: bytes, heard: openai.types.audio.Transcription
) -> None:
    duration = len(samples_of(speech)) / 16_000
    verbose = client.audio.transcriptions.create(
        model="whisper-1",
        file=("a.wav", speech),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
    )
    assert verbose.language == "english" and verbose.duration == pytest.approx(duration, abs=0.05)
    segments = verbose.segments or []
    assert segments and segments[0].start <= 1.0 and segments[-1].end >= duration - 1.0
    ends = [s.end for s in segments]
    assert ends == sorted(ends) and all(s.start <= s.end for s in segments)
    found = verbose.words or []
    assert [w.word.lower().strip(".,") for w in found] == words(verbose.text) == words(heard.text)
    starts = [w.start for w in found]
    assert starts == sorted(starts)
    only_words = client.audio.transcriptions.create(
        model="whisper-1",
        file=("a.wav", speech),
        response_format="verbose_json",
        timestamp_granularities=["word"],
    )
    assert only_words.segments is None and only_words.words


def test_stream_deltas_join_to_the_final_text(
    client: openai.OpenAI, speech: bytes, heard: openai.types.audio.Transcription
) -> None:
    stream = client.audio.transcriptions.create(
        model="whisper-1", file=("a.wav", speech), stream=True
    )
    events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and set(kinds[:-1]) == {"transcript.text.delta"}
    assert len(kinds) >= 2
    done = events[-1]
    assert "".join(e.delta for e in events[:-1]) == done.text == heard.text  # type: ignore[union-attr]


def test_logprobs_per_word(client: openai.OpenAI, speech: bytes) -> None:
    result = client.audio.transcriptions.create(
        model="whisper-1", file=("a.wav", speech), include=["logprobs"]
    )
    logprobs = result.logprobs or []
    assert [p.token.strip().lower().strip(".,") for p in logprobs] == words(result.text)
    assert all(p.logprob is not None and p.logprob <= 0 for p in logprobs)


@pytest.mark.slow
def test_every_container_concurrently_within_word_error_bound(client: openai.OpenAI) -> None:
    """Each container holds its own sentence, all sent at once: each answer is its own."""
    containers = sorted(set(CONTAINERS) - {"wav"})
    uploads = [
        (
            f"speech.{container}",
            written_as(samples_of(spoken(client, s), 24_000), 24_000, container),
        )
        for container, s in zip(containers, SENTENCES, strict=True)
    ]
    with ThreadPoolExecutor(len(uploads)) as pool:
        texts = list(pool.map(lambda upload: transcribe(client, upload[1], upload[0]), uploads))
    for sentence, text in zip(SENTENCES, texts, strict=True):
        assert word_error_rate(sentence, text) <= MAX_WER, (sentence, text)


def _error(http: httpx.Client, path: str, **kw: object) -> tuple[int, dict[str, object]]:
    response = http.post(path, **kw)  # type: ignore[arg-type]
    return response.status_code, response.json()["error"]


def _long_mp3(seconds: int) -> bytes:
    """Silence that lasts `seconds`: ten seconds of 8 kbps mp3, its frames repeated."""
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format="mp3") as out:
        stream = out.add_stream("libmp3lame", rate=16_000, layout="mono")
        stream.bit_rate = 8_000
        frame = av.AudioFrame.from_ndarray(
            np.zeros((1, 160_000), np.int16), format="s16p", layout="mono"
        )
        frame.sample_rate, frame.pts = 16_000, 0
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            out.mux(packet)
    return buffer.getvalue() * (seconds // 10 + 1)


def test_bad_uploads(audio_server: ServerProcess, speech: bytes, tmp_path: Path) -> None:
    url = "/v1/audio/transcriptions"
    with audio_server.http() as http:
        status, error = _error(http, url, files={"file": ("a.wav", b"")})
        assert (status, error["code"]) == (400, "empty_file")
        status, error = _error(http, url, files={"file": ("a.wav", b"hello, not audio")})
        assert status == 400 and "text starting with 'hello, not audio'" in str(error["message"])
        png = b"\x89PNG\r\n\x1a\n" + bytes(200)
        status, error = _error(http, url, files={"file": ("a.png", png)})
        assert status == 400 and error["code"] == "invalid_audio"
        big = speech + bytes(25 * 1024 * 1024)
        status, error = _error(http, url, files={"file": ("a.wav", big)})
        assert (status, error["code"]) == (413, "file_too_large")
        status, error = _error(http, url, files={"file": ("a.mp3", _long_mp3(MAX_SECONDS + 2))})
        assert (status, error["code"]) == (400, "audio_too_long")
        assert f"longer than the {MAX_SECONDS} s" in str(error["message"])
        status, error = _error(http, url, data={"model": "whisper-1"})
        assert (status, error["param"]) == (400, "file")
        for field, value in (("response_format", "xml"), ("temperature", "2"), ("language", "zz")):
            status, error = _error(
                http, url, files={"file": ("a.wav", speech)}, data={field: value}
            )
            assert (status, error["param"]) == (400, field)
        status, error = _error(http, url, files={"file": ("a.wav", speech)}, data={"seed": "1"})
        assert (status, error["code"]) == (400, "unsupported_field")
        status, error = _error(
            http, url, files={"file": ("a.wav", speech)}, data={"model": "hibari"}
        )
        assert (status, error["code"]) == (400, "model_not_supported")
        status, error = _error(http, "/v1/audio/translations", files={"file": ("a.wav", speech)})
        assert status == 400 and "English-only" in str(error["message"])


def test_the_audio_routes_answer_as_documented(audio_server: ServerProcess) -> None:
    """schemathesis over the audio operations of /openapi.json on a server with Whisper and a
    voice: the transcription and translation forms (`file` required), speech and its voices;
    every answer is in a status, type and schema the document gives, never a 5xx."""
    assert check_operations(audio_server.root, {}, 4, "/v1/audio") == 4
    with audio_server.http() as http:
        schemas = http.get("/openapi.json").json()["components"]["schemas"]
    assert schemas["TranscriptionForm"]["required"] == ["file"]
    assert schemas["TranslationForm"]["required"] == ["file"]
    assert "language" not in schemas["TranslationForm"]["properties"]


def test_speech_every_format_decodes(client: openai.OpenAI) -> None:
    lengths = []
    for fmt in ("mp3", "opus", "aac", "flac", "wav"):
        data = spoken(client, SENTENCE, response_format=fmt)
        lengths.append(len(samples_of(data)) / 16_000)
    pcm = spoken(client, SENTENCE, response_format="pcm")
    lengths.append(len(pcm) / 2 / 24_000)
    assert min(lengths) > 1.5 and max(lengths) - min(lengths) < 0.2, lengths
    with wave.open(io.BytesIO(spoken(client, SENTENCE))) as wav:
        assert (wav.getframerate(), wav.getnchannels(), wav.getsampwidth()) == (24_000, 1, 2)


def test_speech_is_deterministic_and_speed_changes_length(client: openai.OpenAI) -> None:
    assert spoken(client, SENTENCE, "pcm") == spoken(client, SENTENCE, "pcm")
    slow = client.audio.speech.create(
        model="tts-1", voice="alloy", input=SENTENCE, response_format="pcm", speed=0.5
    ).read()
    fast = client.audio.speech.create(
        model="tts-1", voice="alloy", input=SENTENCE, response_format="pcm", speed=2.0
    ).read()
    assert len(slow) > 1.5 * len(spoken(client, SENTENCE, "pcm")) > 2.0 * len(fast)


def test_speech_streams_sentence_by_sentence(client: openai.OpenAI) -> None:
    text = " ".join(SENTENCES)
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice={"id": "heart"}, input=text, response_format="pcm"
    ) as response:
        assert response.headers["content-type"] == "audio/pcm"
        assert response.headers["transfer-encoding"] == "chunked"
        pieces = list(response.iter_bytes(chunk_size=None))
    assert b"".join(pieces) == spoken(client, text, "pcm")


def test_one_sentence_is_answered_whole(client: openai.OpenAI) -> None:
    """A text of one sentence is one piece, which the worker sends with its stream's end: the
    file goes whole, with its length (a longer text's is chunked, above)."""
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="heart", input=SENTENCES[0], response_format="pcm"
    ) as response:
        assert "transfer-encoding" not in response.headers
        whole = response.read()
    assert int(response.headers["content-length"]) == len(whole) > 24_000
    assert whole == spoken(client, SENTENCES[0], "pcm")


def test_speech_is_hibaris_own_sentence_for_sentence(client: openai.OpenAI) -> None:
    """The server makes each sentence's network output ahead of its vocoder: the samples are
    still those of hibari's own stream, in order, the noise drawn in the same order."""
    from hibari import Hibari
    from hibari.voices import DEFAULT, voice_path

    from mlxcel.backends.audio.encode import AudioEncoder
    from mlxcel.backends.audio.hibari_voice import NOISE_SEED

    voice = Hibari(voice=DEFAULT, model=voice_path(DEFAULT, download_missing=False))
    text = " ".join(SENTENCES) + " !!! " + SENTENCE
    encoder = AudioEncoder("pcm", voice.sample_rate, streaming=True)
    own = b"".join(encoder.feed(chunk) for chunk in voice.stream(text, seed=NOISE_SEED))
    assert spoken(client, text, "pcm") == own + encoder.finish()


def test_speech_sse_events(audio_server: ServerProcess, client: openai.OpenAI) -> None:
    body = {"input": " ".join(SENTENCES), "voice": "heart", "response_format": "mp3"}
    with audio_server.http() as http:
        response = http.post("/v1/audio/speech", json={**body, "stream_format": "sse"})
    assert response.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(line[6:]) for line in response.text.splitlines() if line[:6] == "data: "]
    assert [e["type"] for e in events] == ["speech.audio.delta"] * (len(events) - 1) + [
        "speech.audio.done"
    ]
    assert events[-1]["usage"]["input_tokens"] == len(body["input"])
    # mp3 is encoded 0.2 s at a time, each piece sent as it is ready: many a sentence.
    assert len(events) - 1 > 5 * len(SENTENCES), len(events)
    audio = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    assert (
        abs(len(samples_of(audio)) - len(samples_of(spoken(client, body["input"], "mp3")))) < 2000
    )


def test_speech_errors_and_voices(audio_server: ServerProcess) -> None:
    url = "/v1/audio/speech"
    with audio_server.http() as http:
        status, error = _error(http, url, json={"input": "x" * 4097, "voice": "heart"})
        assert (status, error["param"]) == (400, "input")
        status, error = _error(http, url, json={"input": "  ", "voice": "heart"})
        assert (status, error["param"]) == (400, "input")
        status, error = _error(http, url, json={"input": "Hi.", "voice": "nobody"})
        assert (status, error["code"]) == (400, "voice_not_found")
        assert "voices present: heart" in str(error["message"])
        status, error = _error(http, url, json={"input": "Hi.", "voice": {"id": 5}})
        assert (status, error["param"]) == (400, "voice.id")
        status, error = _error(http, url, json={"input": "Hi.", "voice": 5})
        assert (status, error["param"]) == (400, "voice")
        status, error = _error(http, url, json={"input": "Hi.", "voice": "heart", "speed": 5})
        assert (status, error["param"]) == (400, "speed")
        status, error = _error(
            http, url, json={"input": "Hi.", "voice": "heart", "model": "whisper-1"}
        )
        assert (status, error["code"]) == (400, "model_not_supported")
        voices = http.get("/v1/audio/voices").json()
    assert voices["default"] == "heart"
    assert [v["id"] for v in voices["data"] if v["present"]] == ["heart"]
    assert {"emma", "fenrir"} <= {v["id"] for v in voices["data"]}


def test_a_text_the_voice_cannot_say_is_a_400_in_every_format(
    audio_server: ServerProcess, client: openai.OpenAI
) -> None:
    """Emoji and symbols alone are no words the voice reads: the same 400 as an empty input,
    not a 200 with an empty file (mp3) or a header of no sound (wav)."""
    url = "/v1/audio/speech"
    with audio_server.http() as http:
        for text in ("\U0001f600\U0001f600", "-----"):
            for fmt in ("mp3", "wav", "pcm"):
                body = {"input": text, "voice": "heart", "response_format": fmt}
                status, error = _error(http, url, json=body)
                assert (status, error["param"]) == (400, "input"), (text, fmt)
                assert "nothing the voice can say" in str(error["message"])
            sse = {"input": text, "voice": "heart", "stream_format": "sse"}
            status, error = _error(http, url, json=sse)
            assert (status, error["param"]) == (400, "input")
    # The voice still says a text with a word among the symbols, and the server serves on.
    assert len(spoken(client, "\U0001f600 Hello! -----", "pcm")) > 0


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command's name."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _cpu_seconds(pid: int) -> float:
    """A process's user and system CPU time so far."""
    fields = _stat(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _worker_pid(server: ServerProcess, alias: str) -> int:
    """The worker process of the model known as `alias`."""
    with server.http() as http:
        listed = http.get("/v1/models").json()["data"]
    (pid,) = [m["meta"]["pid"] for m in listed if alias in [m["id"], *m.get("aliases", [])]]
    return int(pid)


def test_a_transcription_reuses_the_memory_of_the_last(
    audio_server: ServerProcess, client: openai.OpenAI, speech: bytes
) -> None:
    pid = _worker_pid(audio_server, "whisper-1")
    transcribe(client, speech)
    before = int(_stat(pid)[7])
    transcribe(client, speech)
    # Whisper's encoder allocates a 54 MB attention matrix per layer: were each one mapped
    # afresh (glibc's default past 32 MiB), this clip would fault in some 52,000 pages.
    assert int(_stat(pid)[7]) - before < 5000


def test_a_client_leaving_a_speech_stream_stops_its_synthesis(
    audio_server: ServerProcess, client: openai.OpenAI
) -> None:
    pid = _worker_pid(audio_server, "tts-1")
    # Some 60 sentences: seconds of synthesis on this CPU, were the stream left running.
    text = " ".join(SENTENCES * 12)
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=text, response_format="pcm"
    ) as response:
        next(response.iter_bytes(chunk_size=None))
    time.sleep(0.5)  # the sentence being synthesised when the client left finishes
    before = _cpu_seconds(pid)
    time.sleep(1.5)
    assert _cpu_seconds(pid) - before < 0.3
    # The voice serves the next request whole.
    assert len(spoken(client, SENTENCE, "pcm")) > 0
