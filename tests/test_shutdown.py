"""Graceful shutdown on SIGTERM and SIGINT, and the --socket path rules."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import start
from tests.server_process import ServerProcess, alive

MESSAGES = [{"role": "user", "content": "Tell me a story."}]


class Stream(threading.Thread):
    """A streamed answer read on its own thread; `started` is set at its first event."""

    def __init__(self, server: ServerProcess, path: str, body: dict[str, Any]) -> None:
        super().__init__()
        self.server, self.path, self.body = server, path, body
        self.started = threading.Event()
        self.events: list[Any] = []

    def run(self) -> None:
        with (
            self.server.http() as http,
            http.stream("POST", self.path, json={**self.body, "stream": True}) as response,
        ):
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: "):
                    data = line.removeprefix("data: ")
                    self.events.append(data if data == "[DONE]" else json.loads(data))
                    self.started.set()


def _streams(server: ServerProcess, *bodies: tuple[str, dict[str, Any]]) -> list[Stream]:
    streams = [Stream(server, path, body) for path, body in bodies]
    for stream in streams:
        stream.start()
    for stream in streams:
        assert stream.started.wait(120)
    return streams


def _wait_for_log(server: ServerProcess, text: str) -> None:
    deadline = time.monotonic() + 60
    while text not in server.log():
        assert time.monotonic() < deadline, server.log()
        time.sleep(0.05)


def _after(log: str, marker: str) -> list[str]:
    """The log lines from the one containing `marker` on."""
    lines = log.splitlines()
    return lines[next(i for i, line in enumerate(lines) if marker in line) :]


@pytest.mark.slow
def test_sigterm_lets_the_streams_in_flight_finish_and_cleans_up(tmp_path: Path) -> None:
    sock = tmp_path / "mlxcel.sock"
    server = start(tmp_path, "-np", "2", "--shutdown-timeout", "300", socket_path=sock)
    try:
        # A second server on a socket a live server listens on refuses it, and leaves it be.
        second = ServerProcess(socket_path=sock, log_path=tmp_path / "second.log")
        try:
            assert second.process.wait(timeout=60) == 2
        finally:
            second.stop()
        assert "another server listens on it" in second.log()
        tokens = 48
        chat = {"messages": MESSAGES, "max_tokens": tokens, "ignore_eos": True}
        completion = {"prompt": "Once upon a time", "max_tokens": tokens, "ignore_eos": True}
        usage = {"stream_options": {"include_usage": True}}
        # The model runs in a worker process, which the drain leaves be until the end.
        (worker,) = server.workers()
        streams = _streams(
            server,
            ("/v1/chat/completions", {**chat, **usage}),
            ("/v1/completions", {**completion, **usage}),
        )
        # Opened just before the signal, so a busy machine cannot outlast its keep-alive.
        with server.http() as kept:
            assert kept.get("/health").status_code == 200
            server.process.send_signal(signal.SIGTERM)
            _wait_for_log(server, "SIGTERM: finishing 2 request(s) in flight")
            # A request on a connection already open is refused; new connections are not taken.
            refused = kept.get("/health")
            assert refused.status_code == 503
            assert refused.json()["error"]["type"] == "unavailable_error"
            assert refused.headers["connection"] == "close"
        with pytest.raises(httpx.ConnectError), server.http() as fresh:
            fresh.get("/health")
        for stream in streams:
            stream.join()
            assert stream.events[-1] == "[DONE]"
            assert stream.events[-2]["usage"]["completion_tokens"] == tokens
            assert all("error" not in event for event in stream.events[:-1])
        assert server.process.wait(timeout=60) == 0
        assert not alive(worker)
    finally:
        server.stop()
    log = server.log()
    assert "Traceback" not in log
    # One line says what happens; the rest are the two streams' access lines.
    after = _after(log, "SIGTERM:")[1:]
    assert len(after) == 2 and all("mlxcel.access" in line for line in after), after
    assert not sock.exists()


@pytest.mark.slow
def test_sigint_past_the_timeout_ends_each_answer_with_an_error(tmp_path: Path) -> None:
    server = start(tmp_path, "-np", "4", "--shutdown-timeout", "1")
    long = {"max_tokens": 1500, "ignore_eos": True}
    try:
        streams = _streams(
            server,
            ("/v1/chat/completions", {"messages": MESSAGES, **long}),
            ("/v1/completions", {"prompt": "Once upon a time", **long}),
            (
                "/v1/responses",
                {"input": "Tell me a story.", "max_output_tokens": 1500, "ignore_eos": True},
            ),
        )
        with server.http() as http:
            whole: list[httpx.Response] = []
            waiting = threading.Thread(
                target=lambda: whole.append(
                    http.post("/v1/completions", json={"prompt": "Once", **long})
                )
            )
            waiting.start()
            deadline = time.monotonic() + 60
            while server.metric("mlxcel_requests_running") < 4:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            (worker,) = server.workers()
            # Ctrl-C reaches every process of the server: the worker leaves it to the server.
            for pid in (server.process.pid, worker):
                os.kill(pid, signal.SIGINT)
            waiting.join()
        for stream in streams:
            stream.join()
        assert whole[0].status_code == 503
        assert whole[0].json()["error"]["code"] == "shutting_down"
        chat, completion, responses = (stream.events for stream in streams)
        for events in (chat, completion):
            assert events[-1] == "[DONE]"
            assert events[-2]["error"]["code"] == "shutting_down"
        assert responses[-1]["type"] == "response.failed"
        assert responses[-1]["response"]["error"]["message"] == "the server is shutting down"
        assert server.process.wait(timeout=60) == 0
        assert not alive(worker)
    finally:
        server.stop()
    log = server.log()
    assert "Traceback" not in log
    assert "SIGINT: finishing 4 request(s) in flight (at most 1s)" in log
    assert "ending 4 request(s) still in flight" in log


def test_socket_refuses_a_path_that_is_no_socket(tmp_path: Path) -> None:
    precious = tmp_path / "notes.txt"
    precious.write_text("keep me")
    server = ServerProcess(socket_path=precious, log_path=tmp_path / "log")
    try:
        assert server.process.wait(timeout=60) == 2
    finally:
        server.stop()
    assert precious.read_text() == "keep me"
    assert "it exists and is not a socket" in server.log()


def test_socket_takes_over_a_socket_file_nobody_listens_on(tmp_path: Path) -> None:
    path = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as stale:
        stale.bind(str(path))
    server = start(tmp_path, "--no-warmup", socket_path=path)
    try:
        with server.http() as http:
            assert http.get("/health").status_code == 200
    finally:
        server.stop()
    assert server.process.returncode == 0
    assert not path.exists()


@pytest.mark.slow
def test_sigterm_ends_an_embedding_batch_at_the_timeout(tmp_path: Path) -> None:
    """An embedding batch is one call into its worker that runs for a minute here: past
    --shutdown-timeout its client got a plain-text 500 and the server waited for the batch to
    end. Now the request gets 503 shutting_down in the envelope at the timeout, and the server
    exits within the timeout plus a few seconds (the busy worker is killed)."""
    server = start(tmp_path, "--embedding-model", "default", "--shutdown-timeout", "2")
    inputs = ["word " * 250] * 1000  # 250k tokens: about a minute of MiniLM on one thread
    try:
        with server.http() as http:
            answers: list[tuple[httpx.Response, float]] = []

            def ask() -> None:
                response = http.post("/v1/embeddings", json={"input": inputs}, timeout=300)
                answers.append((response, time.monotonic()))

            asking = threading.Thread(target=ask)
            asking.start()
            time.sleep(5)  # tokenized, and the batch running in the worker
            workers = server.workers()
            sent = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            asking.join()
        assert server.process.wait(timeout=120) == 0
        exited = time.monotonic() - sent
        ((response, answered),) = answers
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "shutting_down"
        assert answered - sent < 2 + 3
        assert exited < 2 + 15, exited
        assert not any(alive(pid) for pid in workers)
    finally:
        server.stop()
    assert "Traceback" not in server.log()


@pytest.mark.slow
def test_sigterm_ends_a_streamed_transcription_with_an_error_event(tmp_path: Path) -> None:
    """A streamed transcription was cut with no error event, and the server waited for its
    worker: at the timeout it ends with an `error` event naming shutting_down."""
    server = start(
        tmp_path,
        "--transcription-model", "default", "--speech-model", "default",
        "--shutdown-timeout", "2",
    )  # fmt: skip
    sentence = "Please send the report to the office by Friday morning. "
    try:
        with server.http() as http:
            speech = http.post(
                "/v1/audio/speech",
                json={"input": sentence * 60, "voice": "heart", "response_format": "wav"},
                timeout=300,
            ).content
            events: list[dict[str, Any]] = []
            started = threading.Event()

            def listen() -> None:
                with http.stream(
                    "POST",
                    "/v1/audio/transcriptions",
                    files={"file": ("a.wav", speech)},
                    data={"stream": "true"},
                    timeout=300,
                ) as response:
                    for line in response.iter_lines():
                        if line.startswith("data: "):
                            events.append(json.loads(line.removeprefix("data: ")))
                            started.set()

            listening = threading.Thread(target=listen)
            listening.start()
            assert started.wait(120)
            sent = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            listening.join()
        assert server.process.wait(timeout=120) == 0
        exited = time.monotonic() - sent
        assert events[-1]["type"] == "error", events[-1]
        assert events[-1]["error"]["code"] == "shutting_down"
        assert exited < 2 + 15, exited
    finally:
        server.stop()
    assert "Traceback" not in server.log()


@pytest.mark.slow
def test_sigterm_ends_speech_at_the_timeout(tmp_path: Path) -> None:
    """Speech drains as every model kind does: a long text being spoken gets until
    --shutdown-timeout, then its SSE stream ends with an `error` event naming shutting_down,
    and the audio file sent in chunks (its 200 and first sentences already out) ends without
    its last chunk, which HTTP clients report as an incomplete body, never as a whole file;
    the server exits within the timeout plus a few seconds."""
    server = start(tmp_path, "--speech-model", "default", "--shutdown-timeout", "1")
    text = "Please send the report to the office by Friday morning. " * 70
    try:
        with server.http() as http:
            cut: list[httpx.RemoteProtocolError] = []
            events: list[dict[str, Any]] = []
            started = threading.Event()

            audio = threading.Event()

            def whole() -> None:
                body = {"input": text[:4096], "voice": "heart", "response_format": "wav"}
                # At a quarter speed: ~5 s of work alone on a quiet machine, past the timeout.
                body["speed"] = 0.25
                with http.stream("POST", "/v1/audio/speech", json=body, timeout=300) as answer:
                    try:
                        for _ in answer.iter_bytes():
                            audio.set()
                    except httpx.RemoteProtocolError as exc:
                        cut.append(exc)

            def streamed() -> None:
                body = {"input": text[:4096], "voice": "heart", "stream_format": "sse"}
                body["speed"] = 0.25
                with http.stream("POST", "/v1/audio/speech", json=body, timeout=300) as response:
                    for line in response.iter_lines():
                        if line.startswith("data: "):
                            events.append(json.loads(line.removeprefix("data: ")))
                            started.set()

            threads = [threading.Thread(target=t) for t in (whole, streamed)]
            for thread in threads:
                thread.start()
            assert started.wait(120) and audio.wait(120)
            sent = time.monotonic()
            server.process.send_signal(signal.SIGTERM)
            for thread in threads:
                thread.join()
        assert server.process.wait(timeout=120) == 0
        exited = time.monotonic() - sent
        assert len(cut) == 1 and "incomplete chunked read" in str(cut[0])
        assert events[-1]["type"] == "error", events[-1]
        assert events[-1]["error"]["code"] == "shutting_down"
        assert exited < 1 + 15, exited
    finally:
        server.stop()
    assert "Traceback" not in server.log()
