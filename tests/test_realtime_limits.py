"""/v1/realtime's guards: the API key (header, or the subprotocol a browser sends), the origin
and Host policy of the HTTP routes, sessions per server, session length and idle timeout."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import Iterator

import pytest
import websockets
from websockets.asyncio.client import connect

from tests.conftest import start
from tests.realtime_util import async_client, events_until, raw_until
from tests.server_process import ServerProcess

pytestmark = pytest.mark.slow

KEY = "realtime-key"
SESSION_SECONDS = 4
IDLE_SECONDS = 1.5


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The chat model alone (no session here needs audio), a key, one session at a time."""
    proc = start(
        tmp_path_factory.mktemp("realtime-limits"),
        "--realtime-max-sessions",
        "1",
        "--realtime-max-session-seconds",
        str(SESSION_SECONDS),
        "--realtime-idle-timeout",
        str(IDLE_SECONDS),
        # Shorter than a session: the connection guard's timers must leave an upgraded socket
        # alone (its body timeout once wrote a 408 into a session's frames).
        "--body-timeout",
        "1",
        "--header-timeout",
        "1",
        env={"MLXCEL_API_KEY": KEY},
    )
    yield proc
    proc.stop()


def url(server: ServerProcess) -> str:
    return server.root.replace("http://", "ws://") + "/v1/realtime?model=default"


def refused(server: ServerProcess, **options: object) -> websockets.exceptions.InvalidStatus:
    async def attempt() -> None:
        async with connect(url(server), **options):  # type: ignore[arg-type]
            pass

    with pytest.raises(websockets.exceptions.InvalidStatus) as caught:
        asyncio.run(attempt())
    return caught.value


def test_the_key_is_required(guarded: ServerProcess) -> None:
    for key in (None, "wrong"):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        response = refused(guarded, additional_headers=headers).response
        assert response.status_code == 401
        assert json.loads(response.body)["error"]["code"] == "invalid_api_key"

    async def sdk() -> str:
        async with async_client(guarded.root, KEY).realtime.connect(model="default") as conn:
            return (await events_until(conn, "session.created"))[-1].session.type

    assert asyncio.run(sdk()) == "realtime"


def test_a_browser_sends_the_key_as_a_subprotocol(guarded: ServerProcess) -> None:
    async def browser_like() -> tuple[str | None, str]:
        protocols = ["realtime", f"openai-insecure-api-key.{KEY}"]
        origin = guarded.root  # the playground's own origin
        async with connect(url(guarded), subprotocols=protocols, origin=origin) as ws:  # type: ignore[arg-type]
            created = await raw_until(ws, "session.created")
            return ws.subprotocol, created[-1]["session"]["type"]

    assert asyncio.run(browser_like()) == ("realtime", "realtime")


def test_a_foreign_origin_and_host_are_refused(guarded: ServerProcess) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    response = refused(guarded, additional_headers=headers, origin="http://evil.example").response
    assert response.status_code == 403
    assert json.loads(response.body)["error"]["code"] == "cors_origin_not_allowed"
    # DNS rebinding: a page whose name resolves here sends its own Host (and Origin).
    with socket.create_connection(("127.0.0.1", guarded.port)) as sock:
        sock.sendall(
            b"GET /v1/realtime HTTP/1.1\r\nHost: evil.example\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13\r\nOrigin: http://evil.example\r\n\r\n"
        )
        head = sock.recv(4096).decode()
    assert head.startswith("HTTP/1.1 400") and "host_not_allowed" in head


def test_sessions_per_server_length_and_idle(guarded: ServerProcess) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}

    async def sessions() -> tuple[list[str], int | None, list[str], float, int | None, float]:
        async with connect(url(guarded), additional_headers=headers) as first:
            await raw_until(first, "session.created")
            async with connect(url(guarded), additional_headers=headers) as second:
                full = await raw_until(second, "error")
                await second.wait_closed()
                full_code = second.close_code
            # Events keep it from idling; its length ends it.
            began = time.monotonic()
            while True:
                # The session may end between two events: what it said before is still read.
                with contextlib.suppress(websockets.exceptions.ConnectionClosed):
                    await first.send(json.dumps({"type": "input_audio_buffer.clear"}))
                answer = await raw_until(first, "input_audio_buffer.cleared", "error")
                if answer[-1]["type"] == "error":
                    break
                await asyncio.sleep(0.4)
            length = time.monotonic() - began
            ended = [answer[-1]["error"]["code"]]
            await first.wait_closed()
            length_code = first.close_code
        async with connect(url(guarded), additional_headers=headers) as idle:
            await raw_until(idle, "session.created")
            began = time.monotonic()
            ended += [(await raw_until(idle, "error"))[-1]["error"]["code"]]
            waited = time.monotonic() - began
            await idle.wait_closed()
            return (
                [e["error"]["code"] for e in full[-1:]],
                full_code,
                ended,
                length,
                idle.close_code or length_code,
                waited,
            )

    full, full_code, ended, length, idle_code, waited = asyncio.run(sessions())
    assert full == ["too_many_sessions"] and full_code == 1013
    assert ended == ["session_expired", "idle_timeout"] and idle_code == 1000
    assert SESSION_SECONDS - 1 <= length <= SESSION_SECONDS + 3
    assert IDLE_SECONDS - 0.2 <= waited <= IDLE_SECONDS + 3
