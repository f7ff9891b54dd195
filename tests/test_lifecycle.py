"""Starting, loading, listening on a Unix socket, early exits, client disconnects."""

from __future__ import annotations

import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.conftest import start
from tests.server_process import MLXCEL, ServerProcess, feed_fifo_until_exit

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def unix_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    tmp = tmp_path_factory.mktemp("uds")
    proc = start(tmp, socket_path=tmp / "mlxcel.sock")
    yield proc
    proc.stop_soon()


def test_unix_socket_is_private_and_serves_openai(unix_server: ServerProcess) -> None:
    assert unix_server.socket_path is not None
    mode = stat.S_IMODE(os.stat(unix_server.socket_path).st_mode)
    assert mode == 0o600
    http_client = openai.DefaultHttpxClient(transport=_uds_transport(str(unix_server.socket_path)))
    client = openai.OpenAI(
        base_url=unix_server.base_url, api_key="x", http_client=http_client, max_retries=0
    )
    response = client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert response.choices[0].message.content is not None


def _uds_transport(path: str) -> object:
    """A transport of whichever HTTP library this openai release is built on."""
    import importlib

    library = importlib.import_module(openai.DefaultHttpxClient.__mro__[1].__module__.split(".")[0])
    return library.HTTPTransport(uds=path)


def test_health_is_503_while_loading_then_load_failure_exits(tmp_path: Path) -> None:
    fifo = tmp_path / "slow.gguf"
    os.mkfifo(fifo)
    proc = ServerProcess("-m", str(fifo), "--no-warmup", log_path=tmp_path / "log")
    try:
        deadline = time.monotonic() + 60
        response = None
        while time.monotonic() < deadline:
            try:
                with proc.http() as http:
                    response = http.get("/health")
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        assert response is not None
        assert response.status_code == 503
        assert response.json()["error"]["type"] == "unavailable_error"
        with proc.http() as http:
            assert http.get("/v1/models").status_code == 503
        feed_fifo_until_exit(proc.process, fifo, b"not a gguf file")
        assert proc.process.returncode != 0
    finally:
        proc.stop()
    assert "could not load" in proc.log()


def test_missing_model_exits_with_a_message(tmp_path: Path) -> None:
    proc = ServerProcess("-m", str(tmp_path / "nope.gguf"), log_path=tmp_path / "log")
    assert proc.process.wait(timeout=60) == 2
    proc.stop()
    assert "model not found" in proc.log()


def test_the_server_runs_on_uvloop(server: ServerProcess) -> None:
    # The HTTP process's event loop is libuv's (the server extra installs uvloop): its
    # extension is mapped into the process, and the server answers on it.
    maps = Path(f"/proc/{server.process.pid}/maps").read_text()
    assert "/uvloop/loop." in maps
    assert server.http().get("/health").status_code == 200


def test_disconnect_mid_stream_frees_the_engine(server: ServerProcess) -> None:
    client = server.openai()
    tokens, cancelled = server.generation_counts()
    stream = client.completions.create(
        model="default",
        prompt="Once upon a time",
        max_tokens=1500,
        temperature=1.5,
        stream=True,
        seed=3,
        extra_body={"ignore_eos": True},
    )
    for received, _ in enumerate(stream, start=1):
        if received == 3:
            break
    stream.close()
    server.assert_cancelled_early(tokens, cancelled, max_tokens=1500)
    response = client.completions.create(
        model="default", prompt="Hello", max_tokens=4, temperature=0
    )
    assert response.choices[0].text is not None


def test_disconnect_during_non_streaming_request(server: ServerProcess) -> None:
    tokens, cancelled = server.generation_counts()

    def abandon() -> None:
        with (
            httpx.Client(base_url=server.root, timeout=0.5) as http,
            pytest.raises(httpx.ReadTimeout),
        ):
            http.post(
                "/v1/completions",
                json={
                    "prompt": "Once",
                    "max_tokens": 1500,
                    "temperature": 1.5,
                    "seed": 5,
                    "ignore_eos": True,
                },
            )

    thread = threading.Thread(target=abandon)
    thread.start()
    thread.join()
    server.assert_cancelled_early(tokens, cancelled, max_tokens=1500)
    with server.http() as http:
        response = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 4})
    assert response.status_code == 200


def test_help_shows_every_default() -> None:
    import subprocess

    help_text = subprocess.run(
        [MLXCEL, "serve", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for flag in (
        "--host",
        "--port",
        "--ctx-size",
        "--n-predict",
        "--threads",
        "--parallel",
        "--log-level",
        "--socket",
        "--api-key",
        "--alias",
        "--no-warmup",
    ):
        assert flag in help_text
    assert "(default: 127.0.0.1)" in help_text
    assert "(default: 8080)" in help_text
