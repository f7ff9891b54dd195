"""A worker process per text model: kill -9 of one model's worker fails its running and queued
requests with 503 (a stream with an error event, then [DONE]), the other model serves on, the
model is `failed` with the reason, and its next request starts it again; SIGTERM lets a stream
finish, then ends the workers (test_shutdown.py); a server killed with SIGKILL takes its
workers with it."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest

from tests._client_util import default_gguf
from tests.conftest import start
from tests.server_process import ServerProcess, alive

HELLO = [{"role": "user", "content": "Say hello."}]
# Long enough to still be running when the test acts on it.
LONG: dict[str, Any] = {"max_tokens": 300, "ignore_eos": True}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The default model served twice, as `a` and `b`, each in its own worker."""
    tmp = tmp_path_factory.mktemp("pair")
    config = tmp / "models.yaml"
    config.write_text(
        "models:\n"
        + "".join(
            f"  - model: {default_gguf()}\n    name: {name}\n    ctx_size: 512\n" for name in "ab"
        )
    )
    proc = start(tmp, "--config", str(config))
    yield proc
    proc.stop()


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


def test_each_text_model_runs_in_a_worker_of_its_own(pair: ServerProcess) -> None:
    listed = _listed(pair)
    pids = {listed[name]["meta"]["pid"] for name in "ab"}
    assert len(pids) == 2 and pids == set(pair.workers())
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

    # The next request starts a new worker for the model.
    reply = client.chat.completions.create(model="a", messages=HELLO, max_tokens=3)
    assert reply.model == "a" and reply.choices[0].finish_reason is not None
    listed = _listed(pair)
    assert listed["a"]["state"] == "loaded" and "reason" not in listed["a"]
    assert listed["a"]["meta"]["pid"] not in (victim, None)
    log = pair.log()
    assert log.count("loading model 'a'") == 2
    assert "model 'a' failed: the worker process of the model 'a' was killed by SIGKILL" in log


def test_the_workers_end_with_their_server(pair: ServerProcess) -> None:
    # SIGTERM drains, then stops the workers (test_shutdown.py); a server killed outright
    # cannot stop them, and each one sees its connection end and exits.
    workers = pair.workers()
    assert len(workers) == 2
    pair.process.kill()
    pair.process.wait()
    _wait_for(lambda: not any(alive(pid) for pid in workers), "ended with their server")
