"""Image admission: one batch at a time, a full queue and a long wait -> 503 server_busy, and
a client that goes away cancels its batch between steps and frees the pipeline; each image
model in a worker of its own, whose kill -9 fails its running and queued requests with 503 and
whose next request starts it again."""

from __future__ import annotations

import json
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from mlxcel.engine.image_types import partial_steps
from mlxcel.protocol.images import MAX_STEPS
from mlxcel.serving.image_files import ImageFiles
from tests.conftest import BUSY_IMAGE_MODEL, IMAGE_KEY, IMAGE_READY_S, start
from tests.conftest import BUSY_QUEUE_TIMEOUT_S as QUEUE_TIMEOUT_S
from tests.server_process import ServerProcess, alive
from tests.test_workers import _wait_for

# The image tests share one server, whose start (torch, diffusers, two pipelines) is slow.
pytestmark = pytest.mark.slow


MODEL = "tiny-sd"
CANCELLED = "image batch cancelled"
WITHDRAWN = "cancelled while waiting for the pipeline"
# A batch long enough that it is still running whenever the test looks.
LONG = {"prompt": "a cat", "steps": MAX_STEPS, "model": BUSY_IMAGE_MODEL}
SHORT = {"prompt": "a cat", "steps": 2, "model": BUSY_IMAGE_MODEL}
# Two images: a request's batch is admitted or refused whole.
PAIR = {**SHORT, "n": 2}
AUTH = {"Authorization": f"Bearer {IMAGE_KEY}"}


def wait_for_log(server: ServerProcess, text: str, count: int, timeout: float = 120) -> None:
    """Wait until the server's log holds `text` `count` times."""
    deadline = time.monotonic() + timeout
    while server.log().count(text) < count:
        assert time.monotonic() < deadline, f"no {count}x '{text}' in: {server.log()}"
        time.sleep(0.05)


def post(server: ServerProcess, body: dict[str, object]) -> httpx.Response:
    with server.http(headers=AUTH) as http:
        return http.post("/v1/images/generations", json=body)


def test_busy_queue_timeout_and_cancel(images_server: ServerProcess) -> None:
    before = images_server.log().count(CANCELLED)
    streamed = {**LONG, "stream": True}
    with (
        images_server.http(headers=AUTH) as http,
        ThreadPoolExecutor(2) as pool,
        http.stream("POST", "/v1/images/generations", json=streamed) as run,
    ):
        lines = run.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        assert json.loads(first[6:])["type"] == "image_generation.progress"
        # One of two more waits in the queue until it times out; the other finds it full.
        answers = list(pool.map(post, [images_server] * 2, [PAIR] * 2))
    errors = [answer.json()["error"] for answer in answers]
    assert [answer.status_code for answer in answers] == [503, 503]
    assert {error["code"] for error in errors} == {"server_busy"}
    messages = sorted(error["message"] for error in errors)
    assert "queue is full" in messages[1]
    assert f"waited more than {QUEUE_TIMEOUT_S}s" in messages[0]
    # The stream closed mid-batch: the batch stops at its next step and the pipeline is free.
    wait_for_log(images_server, CANCELLED, before + 1)
    assert len(post(images_server, PAIR).json()["data"]) == 2


def test_a_client_that_leaves_the_queue_frees_its_place(images_server: ServerProcess) -> None:
    before = images_server.log().count(WITHDRAWN)
    cancelled = images_server.log().count(CANCELLED)
    with (
        images_server.http(headers=AUTH) as http,
        http.stream("POST", "/v1/images/generations", json={**LONG, "stream": True}) as run,
    ):
        # (Held: a line iterator that is dropped closes the stream.)
        lines = run.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
        # The one place in the queue: taken, then given up by a client that stops waiting.
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/images/generations", json=SHORT, timeout=httpx.Timeout(60, read=0.5))
        wait_for_log(images_server, WITHDRAWN, before + 1)
        waited = post(images_server, SHORT)
    # The next request got the place (and waited there until the queue timeout).
    assert waited.status_code == 503
    assert f"waited more than {QUEUE_TIMEOUT_S}s" in waited.json()["error"]["message"]
    wait_for_log(images_server, CANCELLED, cancelled + 1)


def test_a_whole_answer_is_cancelled_when_the_client_leaves(images_server: ServerProcess) -> None:
    before = images_server.log().count(CANCELLED)
    with images_server.http(headers=AUTH) as http, pytest.raises(httpx.ReadTimeout):
        http.post("/v1/images/generations", json=LONG, timeout=httpx.Timeout(120, read=1.0))
    wait_for_log(images_server, CANCELLED, before + 1)
    assert post(images_server, SHORT).status_code == 200


def test_previews_are_spread_over_the_steps() -> None:
    assert partial_steps(4, 2) == [1, 3]
    assert partial_steps(10, 3) == [2, 5, 8]
    assert partial_steps(4, 0) == []
    assert partial_steps(1, 3) == []


def test_linked_files_expire_and_fit_their_budget() -> None:
    now = [0.0]
    files = ImageFiles(ttl=10, max_bytes=10, clock=lambda: now[0])
    first = files.put(b"12345", "image/png")
    second = files.put(b"67890", "image/png")
    assert files.get(first) is not None
    third = files.put(b"abc", "image/png")
    assert files.get(first) is None and files.get(second) is not None
    now[0] = 11
    assert files.get(second) is None and files.get(third) is None


def test_sigterm_ends_the_running_batch_and_the_waiting_one(
    tmp_path: Path, image_pipeline: Path
) -> None:
    """Past --shutdown-timeout, the batch running ends at its next step with a shutting_down
    error event, the one waiting with a 503; the server exits 0."""
    server = start(
        tmp_path,
        "--image-model",
        str(image_pipeline),
        "--shutdown-timeout",
        "1",
        ready_timeout=IMAGE_READY_S,
    )
    long = {"prompt": "a cat", "steps": MAX_STEPS, "stream": True}
    quick = {"prompt": "a cat", "steps": 2}
    try:
        with (
            server.http() as http,
            ThreadPoolExecutor(1) as pool,
            http.stream("POST", "/v1/images/generations", json=long) as run,
        ):
            lines = (line for line in run.iter_lines() if line.startswith("data: "))
            assert json.loads(next(lines)[6:])["type"] == "image_generation.progress"
            waiting = pool.submit(http.post, "/v1/images/generations", json=quick)
            wait_for_log(server, "image(s) of 64x64, 2 steps", 1)
            server.process.send_signal(signal.SIGTERM)
            events = [json.loads(line[6:]) for line in lines]
            answer = waiting.result()
        assert events[-1]["type"] == "error"
        assert events[-1]["error"]["code"] == "shutting_down"
        assert answer.status_code == 503
        assert answer.json()["error"]["code"] == "shutting_down"
        assert server.process.wait(timeout=60) == 0
    finally:
        server.stop()
    log = server.log()
    assert "image batch ended: the server is stopping" in log
    assert "Traceback" not in log


def listed(server: ServerProcess) -> dict[str, dict[str, object]]:
    with server.http(headers=AUTH) as http:
        return {m["id"]: m for m in http.get("/v1/models").json()["data"]}


def meta(server: ServerProcess, name: str) -> dict[str, object]:
    value: dict[str, object] = listed(server)[name]["meta"]  # type: ignore[assignment]
    return value


def test_each_image_model_runs_in_a_worker_of_its_own(images_server: ServerProcess) -> None:
    pids = {meta(images_server, name)["pid"] for name in (MODEL, BUSY_IMAGE_MODEL)}
    assert len(pids) == 2 and pids <= set(images_server.workers())
    assert images_server.process.pid not in pids
    # Its size is its worker's resident memory: torch and the pipeline, far above nothing.
    size = meta(images_server, MODEL)["memory_bytes"]
    assert isinstance(size, int) and size > 64 * 1024 * 1024


def test_killed_image_worker_fails_its_requests_and_restarts(
    images_server: ServerProcess,
) -> None:
    short, seeded = {**SHORT, "model": MODEL}, {**SHORT, "model": MODEL, "seed": 7}
    before = post(images_server, seeded).json()["data"][0]["b64_json"]
    victim = meta(images_server, MODEL)["pid"]
    assert isinstance(victim, int)
    with (
        images_server.http(headers=AUTH) as http,
        ThreadPoolExecutor(1) as pool,
        http.stream(
            "POST", "/v1/images/generations", json={**LONG, "model": MODEL, "stream": True}
        ) as run,
    ):
        lines = (line for line in run.iter_lines() if line.startswith("data: "))
        assert json.loads(next(lines)[6:])["type"] == "image_generation.progress"
        queued = pool.submit(post, images_server, short)
        _wait_for(lambda: meta(images_server, MODEL)["requests"] == 2, "queued")
        os.kill(victim, signal.SIGKILL)
        events = [json.loads(line[6:]) for line in lines]
        waited = queued.result()
    reason = f"the worker process of the model '{MODEL}' was killed by SIGKILL"
    # The stream ends with an error event, the queued request is a 503: both say why.
    assert events[-1]["type"] == "error"
    assert events[-1]["error"]["code"] == "model_unavailable"
    assert reason in events[-1]["error"]["message"]
    assert waited.status_code == 503, waited.text
    assert waited.json()["error"]["code"] == "model_unavailable"
    assert reason in waited.json()["error"]["message"]
    model = listed(images_server)[MODEL]
    assert model["state"] == "failed" and reason in str(model["reason"])
    # The other image model serves on.
    assert post(images_server, SHORT).status_code == 200

    # The next request starts a new worker, which draws the same image for the same seed.
    assert post(images_server, seeded).json()["data"][0]["b64_json"] == before
    assert listed(images_server)[MODEL]["state"] == "loaded"
    assert meta(images_server, MODEL)["pid"] not in (victim, None)


def test_unloading_ends_the_image_worker(images_server: ServerProcess) -> None:
    pid = meta(images_server, BUSY_IMAGE_MODEL)["pid"]
    assert isinstance(pid, int) and alive(pid)
    with images_server.http(headers=AUTH) as http:
        assert http.post("/models/unload", json={"model": BUSY_IMAGE_MODEL}).status_code == 200
    assert not alive(pid) and pid not in images_server.workers()
    assert meta(images_server, BUSY_IMAGE_MODEL)["pid"] is None
