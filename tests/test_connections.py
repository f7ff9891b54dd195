"""Connection hygiene: slow and silent clients are timed out, open connections are capped, and
normal requests are answered meanwhile (api/connections.py)."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import serving
from tests.server_process import ServerProcess

CHAT = {"messages": [{"role": "user", "content": "Count"}], "max_tokens": 200, "ignore_eos": True}
CAP = 2
BODY_DEADLINE = 3


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Short timeouts and a cap of two connections, with two slots so two streams run."""
    yield from serving(
        tmp_path_factory,
        "strict",
        "--ctx-size",
        "1024",
        "-np",
        "2",
        "--header-timeout",
        "1",
        "--body-timeout",
        "1",
        "--body-deadline",
        str(BODY_DEADLINE),
        "--keep-alive-timeout",
        "1",
        "--max-connections",
        str(CAP),
    )


def _connect(server: ServerProcess, data: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port))
    # A bound on a hung test, not a timing check: the server's timeouts are 1 s.
    sock.settimeout(60)
    if data:
        sock.sendall(data)
    return sock


def _until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection."""
    received = b""
    with sock, contextlib.suppress(ConnectionResetError):
        while chunk := sock.recv(65536):
            received += chunk
    return received


def _error(response: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    return status, json.loads(body)["error"]


def test_a_silent_connection_gets_408_and_is_closed(strict: ServerProcess) -> None:
    status, error = _error(_until_closed(_connect(strict)))
    assert status == 408 and error["code"] == "request_timeout"
    assert "headers" in str(error["message"])


def test_a_half_sent_request_head_times_out(strict: ServerProcess) -> None:
    sock = _connect(strict, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A")
    status, error = _error(_until_closed(sock))
    assert status == 408 and error["code"] == "request_timeout"


def test_a_body_shorter_than_its_length_times_out(strict: ServerProcess) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n"
    )
    status, error = _error(_until_closed(_connect(strict, head + b'{"messages"')))
    assert status == 408 and "body" in str(error["message"])


def test_a_body_trickled_under_the_stall_timeout_ends_at_the_deadline(
    strict: ServerProcess,
) -> None:
    """A byte every half second never stalls 1 s, and kept the connection open for as long as
    the client liked: the whole body must arrive within --body-deadline."""
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    )
    sock = _connect(strict, head)
    started = time.monotonic()
    with contextlib.suppress(OSError):
        while time.monotonic() - started < 20:
            sock.sendall(b" ")
            time.sleep(0.5)
    took = time.monotonic() - started
    status, error = _error(_until_closed(sock))
    assert (status, error["code"]) == (408, "request_timeout")
    assert f"did not arrive whole within {BODY_DEADLINE} s" in str(error["message"])
    assert BODY_DEADLINE - 0.5 < took < BODY_DEADLINE + 3


def test_a_request_head_past_16_kib_is_a_400_even_in_one_read(strict: ServerProcess) -> None:
    """h11 bounds only a head still incomplete: 126 KB of headers arriving in one read were
    taken. A head past 16 KiB is a 400 however it comes; one just under it is served."""
    for size, status in ((126_000, 400), (20_000, 400), (15_000, 200)):
        head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + b"a" * size
        response = _until_closed(_connect(strict, head + b"\r\nConnection: close\r\n\r\n"))
        assert response.startswith(f"HTTP/1.1 {status}".encode()), (size, response[:200])
        if status == 400:
            assert _error(response)[1]["code"] == "invalid_http"
            assert "larger than 16 KiB" in str(_error(response)[1]["message"])
    # A small head whose CRLFCRLF straddles two reads, and a body after it, are served.
    sock = _connect(strict, b"POST /tokenize HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n")
    sock.sendall(b"Content-Length: 19\r\n\r")
    time.sleep(0.2)
    sock.sendall(b'\n{"content": "hi!!"}')
    assert _until_closed(sock).startswith(b"HTTP/1.1 200")


def test_an_idle_kept_alive_connection_is_closed(strict: ServerProcess) -> None:
    sock = _connect(strict, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    response = _until_closed(sock)
    # One answer, then the server closed the connection it kept alive (no second response).
    assert response.startswith(b"HTTP/1.1 200") and response.count(b"HTTP/1.1") == 1


def test_a_malformed_request_line_is_a_400_in_the_envelope(strict: ServerProcess) -> None:
    status, error = _error(_until_closed(_connect(strict, b"NOT HTTP AT ALL\r\n\r\n")))
    assert status == 400 and error["code"] == "invalid_http"


def test_normal_requests_answer_while_slow_connections_exceed_the_cap(
    strict: ServerProcess,
) -> None:
    slow = [
        _connect(strict, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n") for _ in range(CAP * 3)
    ]
    try:
        for _ in range(3):
            with strict.http() as http:
                assert http.get("/health").status_code == 200
                chat = http.post("/v1/chat/completions", json={**CHAT, "max_tokens": 2})
            assert chat.status_code == 200, chat.text
        # The longest-waiting half-open ones were closed to make room.
        assert any(_until_closed(sock) == b"" for sock in slow)
    finally:
        for sock in slow:
            sock.close()


def test_past_the_cap_with_every_connection_busy_is_503(strict: ServerProcess) -> None:
    with contextlib.ExitStack() as stack:
        responses = []
        for _ in range(CAP):
            http = stack.enter_context(strict.http())
            body = {**CHAT, "stream": True}
            responses.append(
                stack.enter_context(http.stream("POST", "/v1/chat/completions", json=body))
            )
        assert all(r.status_code == 200 for r in responses)
        extra = _connect(strict, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        status, error = _error(_until_closed(extra))
        assert status == 503 and error["code"] == "too_many_connections"
        # The requests already running are untouched: each streams to its end.
        for response in responses:
            lines = [line for line in response.iter_lines() if line]
            assert lines[-1] == "data: [DONE]"
    with strict.http() as http:
        assert http.get("/health").status_code == 200


def test_connection_flags_are_checked() -> None:
    proc = ServerProcess("--header-timeout", "0")
    proc.process.wait(timeout=60)
    assert proc.process.returncode == 2
    with pytest.raises(httpx.TransportError), httpx.Client() as http:
        http.get(f"http://127.0.0.1:{proc.port}/health")
