"""Image admission: one batch at a time, a full queue and a long wait -> 503 server_busy, and
a client that goes away cancels its batch between steps and frees the pipeline."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from mlxcel.engine.image_types import partial_steps
from mlxcel.protocol.images import MAX_STEPS
from mlxcel.serving.image_files import ImageFiles
from tests.conftest import BUSY_IMAGE_MODEL, IMAGE_KEY
from tests.conftest import BUSY_QUEUE_TIMEOUT_S as QUEUE_TIMEOUT_S
from tests.server_process import ServerProcess

# The image tests share one server, whose start (torch, diffusers, two pipelines) is slow.
pytestmark = pytest.mark.slow


CANCELLED = "image batch cancelled"
# A batch long enough that it is still running whenever the test looks.
LONG = {"prompt": "a cat", "steps": MAX_STEPS, "model": BUSY_IMAGE_MODEL}
SHORT = {"prompt": "a cat", "steps": 2, "model": BUSY_IMAGE_MODEL}
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
        answers = list(pool.map(post, [images_server] * 2, [SHORT] * 2))
    errors = [answer.json()["error"] for answer in answers]
    assert [answer.status_code for answer in answers] == [503, 503]
    assert {error["code"] for error in errors} == {"server_busy"}
    messages = sorted(error["message"] for error in errors)
    assert "queue is full" in messages[1]
    assert f"waited more than {QUEUE_TIMEOUT_S}s" in messages[0]
    # The stream closed mid-batch: the batch stops at its next step and the pipeline is free.
    wait_for_log(images_server, CANCELLED, before + 1)
    assert post(images_server, SHORT).status_code == 200


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
