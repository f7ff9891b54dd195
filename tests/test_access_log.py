"""One access line per request, whatever its status, and the request id on every line about it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
import uuid
from pathlib import Path

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from mlxcel.api.access_log import AccessLog
from tests.server_process import ServerProcess, feed_fifo_until_exit

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "hi"}]
ACCESS = "INFO mlxcel.access:"


def _request_id() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


def _lines_about(server: ServerProcess, request_id: str, wanted: str = ACCESS) -> list[str]:
    """The log lines tagged with `request_id`, once one of them contains `wanted` (the access
    line is written just after the answer's last byte, so the client may read it first)."""
    deadline = time.monotonic() + 10
    while True:
        lines = [line for line in server.log().splitlines() if f"[{request_id}]" in line]
        if any(wanted in line for line in lines) or time.monotonic() > deadline:
            return lines
        time.sleep(0.05)


def _access(server: ServerProcess, request_id: str) -> str:
    lines = [line for line in _lines_about(server, request_id) if ACCESS in line]
    assert len(lines) == 1, server.log()[-3000:]
    return lines[0]


def _fields(line: str) -> dict[str, str]:
    return dict(re.findall(r" ([a-z_]+)=(\S+)", line))


def test_a_chat_is_one_access_line_and_its_id_is_on_the_engine_line(server: ServerProcess) -> None:
    request_id = _request_id()
    with server.http() as http:
        response = http.post(
            "/v1/chat/completions",
            json={"messages": HI, "max_tokens": 4},
            headers={"X-Request-Id": request_id},
        )
    assert response.status_code == 200
    assert response.headers["x-request-id"] == request_id
    line = _access(server, request_id)
    assert "POST /v1/chat/completions 200 " in line
    usage = response.json()["usage"]
    fields = _fields(line)
    assert fields["model"] == response.json()["model"]
    assert int(fields["prompt_tokens"]) == usage["prompt_tokens"]
    assert int(fields["completion_tokens"]) == usage["completion_tokens"]
    assert int(fields["cached_tokens"]) == usage["prompt_tokens_details"]["cached_tokens"]
    assert float(fields["ttft_s"]) <= float(fields["duration_s"])
    engine = [line for line in _lines_about(server, request_id) if "mlxcel.engine." in line]
    assert engine and f"{usage['prompt_tokens']} prompt tokens" in engine[0]


def test_a_stream_logs_its_access_line_when_it_ends(server: ServerProcess) -> None:
    request_id = _request_id()
    stream = server.openai().chat.completions.create(
        model="default",
        messages=HI,  # type: ignore[arg-type]
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"X-Request-Id": request_id},
    )
    usage = list(stream)[-1].usage
    assert usage is not None
    fields = _fields(_access(server, request_id))
    assert int(fields["completion_tokens"]) == usage.completion_tokens
    assert int(fields["prompt_tokens"]) == usage.prompt_tokens
    assert "ttft_s" in fields


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "model"),
    [
        ("POST", "/v1/chat/completions", {"messages": HI, "max_tokens": "many"}, 400, None),
        ("GET", "/v1/models/nope", None, 404, None),
        ("GET", "/v1/no-such-route", None, 404, None),
    ],
)
def test_errors_have_access_lines_too(
    server: ServerProcess,
    method: str,
    path: str,
    body: dict[str, object] | None,
    status: int,
    model: str | None,
) -> None:
    with server.http() as http:
        response = http.request(method, path, json=body)
    assert response.status_code == status
    request_id = response.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{16}", request_id)
    line = _access(server, request_id)
    assert f"{method} {path} {status} " in line
    assert _fields(line).get("model") == model


def test_a_forged_request_id_is_replaced(server: ServerProcess) -> None:
    with server.http() as http:
        response = http.get("/v1/models", headers={"X-Request-Id": "two words"})
    assert response.headers["x-request-id"] != "two words"
    assert "GET /v1/models 200" in _access(server, response.headers["x-request-id"])


def test_prompt_text_is_not_logged_at_info(server: ServerProcess) -> None:
    marker = f"zebra{uuid.uuid4().hex[:8]}"
    with server.http() as http:
        response = http.post(
            "/v1/completions", json={"prompt": f"The {marker} said", "max_tokens": 2}
        )
    _access(server, response.headers["x-request-id"])
    assert marker not in server.log()


def test_503_while_loading_in_json_lines(tmp_path: Path) -> None:
    fifo = tmp_path / "slow.gguf"
    os.mkfifo(fifo)
    proc = ServerProcess(
        "-m", str(fifo), "--no-warmup", "--log-format", "json", log_path=tmp_path / "log"
    )
    request_id = _request_id()
    try:
        response = _post_until_answered(proc, request_id)
        assert response.status_code == 503
        assert response.headers["x-request-id"] == request_id
        entries = _json_lines(proc, request_id)
        feed_fifo_until_exit(proc.process, fifo, b"not a gguf file")
    finally:
        proc.stop()
    access = [e for e in entries if e["logger"] == "mlxcel.access"]
    assert len(access) == 1
    assert access[0]["status"] == 503 and access[0]["method"] == "POST"
    assert access[0]["path"] == "/v1/chat/completions" and access[0]["level"] == "INFO"
    assert access[0]["model"] == "default" and access[0]["duration_s"] >= 0
    every = [json.loads(line) for line in proc.log().splitlines()]
    assert every[-1]["level"] == "ERROR" and "could not load" in every[-1]["message"]


def _post_until_answered(proc: ServerProcess, request_id: str) -> httpx.Response:
    deadline = time.monotonic() + 60
    while True:
        try:
            with proc.http() as http:
                return http.post(
                    "/v1/chat/completions",
                    json={"messages": HI},
                    headers={"X-Request-Id": request_id},
                )
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _json_lines(proc: ServerProcess, request_id: str) -> list[dict[str, object]]:
    deadline = time.monotonic() + 10
    while True:
        entries = [json.loads(line) for line in proc.log().splitlines()]
        mine = [e for e in entries if e.get("request_id") == request_id]
        if mine or time.monotonic() > deadline:
            return mine
        time.sleep(0.05)


@pytest.mark.parametrize("field", ["user", "safety_identifier"])
def test_a_newline_in_a_logged_field_forges_no_line(server: ServerProcess, field: str) -> None:
    request_id = _request_id()
    forged = f"x\n2026-01-01 00:00:00,000 INFO mlxcel.forged: [{request_id}] admin logged in\x1b[2J"
    with server.http() as http:
        response = http.post(
            "/v1/chat/completions",
            json={"messages": HI, "max_tokens": 1, field: forged},
            headers={"X-Request-Id": request_id},
        )
    assert response.status_code == 200
    lines = _lines_about(server, request_id)
    assert not any("mlxcel.forged" in line.split(": ")[0] for line in lines)
    user_line = next(line for line in lines if "user=" in line)
    assert "user=x\\n2026-01-01" in user_line and "\\x1b[2J" in user_line
    assert "\x1b" not in server.log()


def test_an_unhandled_error_is_a_500_in_the_envelope_with_the_request_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug in a route answers the envelope and X-Request-Id, and logs its traceback once under
    that id (a route whose answer has begun has its connection dropped instead)."""

    async def broken(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("a bug")

    async def call(path: str) -> httpx.Response:
        app = AccessLog(broken, envelope=lambda p, e: b'{"type": "error"}' if p == "/a" else None)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
            return await http.post(path, headers={"X-Request-Id": "bug-1"})

    response = asyncio.run(call("/v1/chat/completions"))
    assert response.status_code == 500
    assert response.headers["x-request-id"] == "bug-1"
    error = response.json()["error"]
    assert error["type"] == "server_error" and "bug-1" in error["message"]
    assert asyncio.run(call("/a")).json() == {"type": "error"}
    tracebacks = [r for r in caplog.records if r.exc_info and "a bug" in str(r.exc_info[1])]
    assert len(tracebacks) == 2
