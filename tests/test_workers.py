"""A worker process per model, of every kind: kill -9 of one model's worker fails its running and
queued requests with 503 (a stream with an error event, then [DONE]), the other models serve on,
the model is `failed` with the reason, and its next request starts it again; unloading a model
ends its worker; SIGTERM lets a stream finish, then ends the workers (test_shutdown.py); a
server killed with SIGKILL takes its workers with it."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest

from mlxcel.config.settings import ModelConfig
from mlxcel.engine.types import EngineError, MediaSpan, SamplingParams, TokenEvent
from mlxcel.media.images import MEDIA_MARKER, Image
from mlxcel.wire.facts import MEDIA_PROMPT_REFUSED, MediaPrompt
from mlxcel.worker.text_service import TextService
from tests._client_util import default_gguf
from tests.audio_util import written_as
from tests.conftest import ok, start
from tests.encoder_models import minilm_gguf
from tests.server_process import ServerProcess, alive

HELLO = [{"role": "user", "content": "Say hello."}]
# Long enough to still be running when the test acts on it.
LONG: dict[str, Any] = {"max_tokens": 300, "ignore_eos": True}


# A second of a rising tone: audio to transcribe (what Whisper makes of it does not matter, only
# that the same server makes the same of it).
CLIP = written_as(0.3 * np.sin(np.linspace(0, 2000, 16_000) ** 1.2), 16_000, "wav")
MODELS = ("a", "b", "embed", "whisper")


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The default model served twice, as `a` and `b`, MiniLM as `embed` (a GGUF, on llama.cpp)
    and Whisper tiny.en as `whisper`, each in its own worker."""
    tmp = tmp_path_factory.mktemp("pair")
    embedder = minilm_gguf(tmp)
    config = tmp / "models.yaml"
    config.write_text(
        "models:\n"
        + "".join(
            f"  - model: {default_gguf()}\n    name: {name}\n    ctx_size: 512\n" for name in "ab"
        )
        + f"  - model: {embedder}\n    kind: embedding\n    name: embed\n"
        + "  - model: default\n    kind: transcription\n    name: whisper\n"
    )
    proc = start(tmp, "--config", str(config))
    yield proc
    proc.stop_soon()


def _listed(server: ServerProcess) -> dict[str, dict[str, Any]]:
    with server.http() as http:
        return {m["id"]: m for m in http.get("/v1/models").json()["data"]}


def _wait_for(condition: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"still not {what}"
        time.sleep(0.02)


def _stream_lines(server: ServerProcess, body: dict[str, Any]) -> Iterator[str]:
    """A streamed chat answer's `data:` payloads, as they come."""
    with server.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as sse:
        assert sse.status_code == 200
        for line in sse.iter_lines():
            if line.startswith("data: "):
                yield line.removeprefix("data: ")


def _transcribed(client: openai.OpenAI) -> str:
    return client.audio.transcriptions.create(model="whisper", file=("a.wav", CLIP)).text


def _embedded(client: openai.OpenAI) -> list[float]:
    return client.embeddings.create(model="embed", input="A man is eating food.").data[0].embedding


def test_each_model_runs_in_a_worker_of_its_own(pair: ServerProcess) -> None:
    listed = _listed(pair)
    pids = {listed[name]["meta"]["pid"] for name in MODELS}
    assert len(pids) == len(MODELS) and pids == set(pair.workers())
    assert pair.process.pid not in pids


def test_killed_worker_fails_its_requests_and_restarts_on_the_next(pair: ServerProcess) -> None:
    client = pair.openai()
    victim = _listed(pair)["a"]["meta"]["pid"]
    queued: list[BaseException] = []
    other: list[str | None] = []

    def wait_in_queue() -> None:
        try:
            client.chat.completions.create(model="a", messages=HELLO, max_tokens=5)
        except openai.APIStatusError as exc:
            queued.append(exc)

    def ask_the_other() -> None:
        reply = client.chat.completions.create(
            model="b", messages=HELLO, extra_body={"ignore_eos": True}, max_tokens=40
        )
        other.append(reply.choices[0].finish_reason)

    lines = _stream_lines(pair, {"model": "a", "messages": HELLO, "stream": True, **LONG})
    assert "choices" in json.loads(next(lines))
    waiter, bystander = (threading.Thread(target=t) for t in (wait_in_queue, ask_the_other))
    waiter.start()
    _wait_for(lambda: pair.metric("mlxcel_requests_waiting", model="a") == 1, "queued")
    bystander.start()
    os.kill(victim, signal.SIGKILL)
    rest = list(lines)
    waiter.join()
    bystander.join()

    # The stream ends with an error event, then [DONE].
    assert rest[-1] == "[DONE]"
    error = json.loads(rest[-2])["error"]
    assert error["code"] == "model_unavailable"
    assert "the worker process of the model 'a' was killed by SIGKILL" in error["message"]
    # The queued request is a 503 saying the same.
    assert len(queued) == 1 and isinstance(queued[0], openai.InternalServerError)
    assert queued[0].status_code == 503
    assert "was killed by SIGKILL" in str(queued[0].body)
    # The other model was not touched.
    assert other == ["length"]
    listed = _listed(pair)
    assert listed["a"]["state"] == "failed" and listed["a"]["meta"]["pid"] is None
    assert "killed by SIGKILL" in listed["a"]["reason"]
    assert listed["b"]["state"] == "loaded"
    # Nothing runs or waits on the dead worker: /metrics kept its last counts (1 and 1).
    assert pair.metric("mlxcel_requests_running", model="a") == 0
    assert pair.metric("mlxcel_requests_waiting", model="a") == 0

    # The next request starts a new worker for the model.
    reply = client.chat.completions.create(model="a", messages=HELLO, max_tokens=3)
    assert reply.model == "a" and reply.choices[0].finish_reason is not None
    listed = _listed(pair)
    assert listed["a"]["state"] == "loaded" and "reason" not in listed["a"]
    assert listed["a"]["meta"]["pid"] not in (victim, None)
    log = pair.log()
    assert log.count("loading model 'a'") == 2
    assert "model 'a' failed: the worker process of the model 'a' was killed by SIGKILL" in log


def test_killed_encoder_and_audio_workers_fail_their_requests(pair: ServerProcess) -> None:
    client = pair.openai()
    vector, text = _embedded(client), _transcribed(client)
    victims = {name: _listed(pair)[name]["meta"]["pid"] for name in ("embed", "whisper")}
    failed: dict[str, tuple[int, Any]] = {}

    def streamed() -> None:
        # A stream whose model dies before its first event still gets a status.
        body = {"model": "whisper", "stream": "true"}
        with pair.http() as http:
            answer = http.post("/v1/audio/transcriptions", data=body, files={"file": CLIP})
        failed["stream"] = answer.status_code, answer.json()["error"]

    def failing(name: str, call: Callable[[openai.OpenAI], object]) -> threading.Thread:
        def run() -> None:
            try:
                call(client)
            except openai.APIStatusError as exc:
                failed[name] = exc.status_code, exc.body

        return threading.Thread(target=run)

    # Stopped, a worker holds the requests sent to it until it is killed.
    for pid in victims.values():
        os.kill(pid, signal.SIGSTOP)
    threads = [
        failing("embed", _embedded),
        failing("whisper", _transcribed),
        threading.Thread(target=streamed),
    ]
    for thread in threads:
        thread.start()

    def held() -> bool:
        meta = {name: m["meta"] for name, m in _listed(pair).items()}
        return meta["embed"]["requests"] == 1 and meta["whisper"]["requests"] == 2

    _wait_for(held, "held by the stopped workers")
    # The other models serve meanwhile.
    reply = client.chat.completions.create(model="b", messages=HELLO, max_tokens=3)
    assert reply.choices[0].finish_reason is not None
    for pid in victims.values():
        os.kill(pid, signal.SIGKILL)
    for thread in threads:
        thread.join()

    owner = {"embed": "embed", "whisper": "whisper", "stream": "whisper"}
    assert set(failed) == set(owner)
    for request, (status, error) in failed.items():
        assert status == 503 and error["code"] == "model_unavailable", (request, error)
        reason = f"the worker process of the model '{owner[request]}' was killed by SIGKILL"
        assert reason in error["message"], (request, error)
    listed = _listed(pair)
    for name in victims:
        assert listed[name]["state"] == "failed" and listed[name]["meta"]["pid"] is None
        assert "killed by SIGKILL" in listed[name]["reason"]

    # The next request starts a new worker, which answers as the old one did.
    assert _embedded(client) == vector
    assert _transcribed(client) == text
    listed = _listed(pair)
    for name, pid in victims.items():
        assert listed[name]["state"] == "loaded"
        assert listed[name]["meta"]["pid"] not in (pid, None)
        assert listed[name]["meta"]["requests"] == 0


def test_past_its_restarts_a_model_says_when_it_may_restart(tmp_path: Path) -> None:
    """A model whose worker died three times within a minute is not restarted for the rest of
    that minute; its 503s said Retry-After: 1 all that time (~53 s measured), and now say
    how long is left."""
    server = start(tmp_path, "--threads", "1")
    try:
        with server.http() as http:
            for _ in range(3):
                (pid,) = server.workers()
                os.kill(pid, signal.SIGKILL)
                _wait_for(
                    lambda: all(m["state"] == "failed" for m in _listed(server).values()), "failed"
                )
                response = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1})
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "model_unavailable"
            assert 50 <= int(response.headers["retry-after"]) <= 60
            assert "it may restart in" in response.json()["error"]["message"]
    finally:
        server.stop()


def test_a_stopped_worker_is_found_failed_and_restarted(tmp_path: Path) -> None:
    """A worker that stops answering (SIGSTOP: its connection stays open) was never noticed:
    /health stayed 200, the model `loaded`, its requests hung. Its heartbeat goes silent, so
    after --worker-timeout it is killed: the stream in flight ends with a 503 error event
    naming why, /health says `degraded`, and the next request starts the model again."""
    server = start(tmp_path, "--threads", "1", "--worker-timeout", "2")
    try:
        (victim,) = server.workers()
        lines = _stream_lines(server, {"messages": HELLO, "stream": True, **LONG})
        assert "choices" in json.loads(next(lines))
        stopped = time.monotonic()
        os.kill(victim, signal.SIGSTOP)
        rest = list(lines)
        took = time.monotonic() - stopped
        assert rest[-1] == "[DONE]"
        error = json.loads(rest[-2])["error"]
        assert error["code"] == "model_unavailable"
        assert "stopped answering (no heartbeat for" in error["message"]
        # Silence counts from the last answer, up to one ping interval before the stop.
        assert 1 <= took < 10, took
        assert not alive(victim)
        with server.http() as http:
            health = http.get("/health")
            assert health.status_code == 200
            assert health.json() == {"status": "degraded", "failed_models": 1}
            (listed,) = _listed(server).values()
            assert listed["state"] == "failed" and "stopped answering" in listed["reason"]
            reply = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
            assert reply.status_code == 200, reply.text
            assert http.get("/health").json() == {"status": "ok"}
        assert victim not in server.workers()
    finally:
        server.stop()


def test_unloading_ends_the_worker(pair: ServerProcess) -> None:
    client = pair.openai()
    vector = _embedded(client)
    pid = _listed(pair)["embed"]["meta"]["pid"]
    with pair.http() as http:
        ok(http.post("/models/unload", json={"model": "embed"}))
    assert not alive(pid) and pid not in pair.workers()
    assert _listed(pair)["embed"]["meta"]["pid"] is None
    assert _embedded(client) == vector
    assert _listed(pair)["embed"]["meta"]["pid"] not in (pid, None)


def test_the_workers_end_with_their_server(pair: ServerProcess) -> None:
    # SIGTERM drains, then stops the workers (test_shutdown.py); a server killed outright
    # cannot stop them, and each one sees its connection end and exits.
    workers = pair.workers()
    assert len(workers) == len(MODELS)
    pair.process.kill()
    pair.process.wait()
    _wait_for(lambda: not any(alive(pid) for pid in workers), "ended with their server")


class _Projecting:
    """A generator with a projector, as the worker's TextService sees one: each image is two
    rows of its own (a "refuse" image is refused), and the scheduler records what it is given."""

    media_marker = MEDIA_MARKER
    audio_rate = None
    n_ctx_seq = 8

    def __init__(self) -> None:
        self.submitted: list[Any] = []
        self.scheduler = self
        self.generator = self

    def tokenize_with_media(
        self, text: str, media: list[Image]
    ) -> tuple[list[int], tuple[MediaSpan, ...]]:
        if any(image.digest == "refuse" for image in media):
            raise EngineError("the projector cannot take this image", "invalid_request")
        spans = tuple(
            MediaSpan(1 + 2 * i, np.full((2, 4), i + 1, np.float32), image.digest)
            for i, image in enumerate(media)
        )
        return [1] + [-1] * 2 * len(media), spans

    def submit(self, sequences: list[Any]) -> None:
        self.submitted.extend(sequences)


class _Sink:
    """A stream's sink in the worker, as the scheduler delivers to one."""

    request_id = "req"

    def __init__(self) -> None:
        self.events: list[TokenEvent] = []
        self.delivered = threading.Event()

    def deliver(self, event: TokenEvent) -> None:
        self.events.append(event)
        self.delivered.set()


def _image(digest: str) -> Image:
    return Image(1, 1, b"\0\0\0", digest)


def test_the_worker_lays_out_a_media_prompt_and_starts_its_generation() -> None:
    """A prompt with images goes to the worker as text and media: it is tokenized and embedded
    there and queued with its rows, each answer held to the room the prompt leaves; the HTTP
    process counts tokens with spans that carry no rows (590 KB for a 512x512 image). A prompt
    the projector refuses, or one the context cannot hold, is each sink's only event, coded
    for the HTTP process's 400."""
    engine = _Projecting()
    service = TextService(ModelConfig(model=default_gguf()), engine)  # type: ignore[arg-type]
    images = [_image("x"), _image("y")]
    tokens, spans = service.tokenize_with_media(f"a {MEDIA_MARKER} b {MEDIA_MARKER}", images)
    assert [span.embeddings.shape for span in spans] == [(2, 0), (2, 0)]
    assert [span.end for span in spans] == [3, 5]
    params = SamplingParams(max_tokens=100, temperature=0, top_p=1, top_k=0, min_p=0)
    short = replace(params, max_tokens=1)
    sinks = [_Sink(), _Sink()]
    prompt = MediaPrompt(f"a {MEDIA_MARKER} b {MEDIA_MARKER}", tuple(images))
    service.generate_with_media(sinks, prompt, [params, short])  # type: ignore[arg-type]
    _wait_for(lambda: len(engine.submitted) == 2, "queued")
    (one, given, held, rows), (two, _, kept, _) = engine.submitted
    assert (one, two, given) == (*sinks, tokens)
    assert (held.max_tokens, kept.max_tokens) == (3, 1)  # 8 - 5 prompt tokens, and 1
    assert [span.embeddings.tolist() for span in rows] == [[[1.0] * 4] * 2, [[2.0] * 4] * 2]
    for media, code in (
        ([_image("refuse")], MEDIA_PROMPT_REFUSED),
        (
            [_image(d) for d in "pqrs"],
            "context_length_exceeded",
        ),
    ):
        refused = [_Sink(), _Sink()]
        laid = MediaPrompt(MEDIA_MARKER * len(media), tuple(media))
        service.generate_with_media(refused, laid, [params] * 2)  # type: ignore[arg-type]
        for sink in refused:
            assert sink.delivered.wait(10)
            (event,) = sink.events
            assert event.error is not None and event.error.code == code
    assert len(engine.submitted) == 2
