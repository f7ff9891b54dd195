"""A worker process per model: kill -9 of one model's worker fails its running and queued
requests with 503 (a stream with an error event, then [DONE]), the other model serves on,
the model is `failed` with the reason, and its next request starts it again."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import openai
import pytest

from tests._client_util import default_gguf
from tests.conftest import start
from tests.server_process import ServerProcess

pytestmark = pytest.mark.slow

HELLO = [{"role": "user", "content": "Say hello."}]
# Long enough to still be running when the test kills the worker.
LONG: dict[str, Any] = {"max_tokens": 300, "ignore_eos": True}


def _listed(server: ServerProcess) -> dict[str, dict[str, Any]]:
    with server.http() as http:
        return {m["id"]: m for m in http.get("/v1/models").json()["data"]}


def _wait_for(condition: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"still not {what}"
        time.sleep(0.02)


def test_killed_worker_fails_its_requests_and_restarts_on_the_next(tmp_path: Path) -> None:
    gguf = default_gguf()
    config = tmp_path / "models.yaml"
    config.write_text(
        "models:\n"
        + "".join(f"  - model: {gguf}\n    name: {name}\n    ctx_size: 512\n" for name in "ab")
    )
    proc = start(tmp_path, "--config", str(config))
    try:
        client = proc.openai()
        victim = _listed(proc)["a"]["meta"]["pid"]
        assert victim in proc.workers() and _listed(proc)["b"]["meta"]["pid"] != victim
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

        body = {"model": "a", "messages": HELLO, "stream": True, **LONG}
        with proc.http() as http, http.stream("POST", "/v1/chat/completions", json=body) as sse:
            assert sse.status_code == 200
            lines = (line for line in sse.iter_lines() if line.startswith("data: "))
            assert "choices" in json.loads(next(lines).removeprefix("data: "))
            waiter, bystander = (threading.Thread(target=t) for t in (wait_in_queue, ask_the_other))
            waiter.start()
            _wait_for(lambda: proc.metric("mlxcel_requests_waiting", model="a") == 1, "queued")
            bystander.start()
            os.kill(victim, signal.SIGKILL)
            rest = [line.removeprefix("data: ") for line in lines]
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
        listed = _listed(proc)
        assert listed["a"]["state"] == "failed"
        assert "killed by SIGKILL" in listed["a"]["reason"]
        assert listed["b"]["state"] == "loaded"

        # The next request starts a new worker for the model.
        reply = client.chat.completions.create(model="a", messages=HELLO, max_tokens=3)
        assert reply.model == "a" and reply.choices[0].finish_reason is not None
        listed = _listed(proc)
        assert listed["a"]["state"] == "loaded" and "reason" not in listed["a"]
        assert listed["a"]["meta"]["pid"] not in (victim, None)
        assert proc.log().count("loading model 'a'") == 2
        assert "model 'a' failed: the worker process of the model 'a' was killed by SIGKILL" in (
            proc.log()
        )
    finally:
        proc.stop()
    # Stopping the server ends its workers.
    assert proc.workers() == []
