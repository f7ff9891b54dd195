"""Connection hygiene in front of the app: slow clients are timed out and open connections capped.

uvicorn's h11 protocol times out only a kept-alive connection between requests: a client that
connects and sends nothing, trickles its headers or stops mid-body holds its connection (and a
file descriptor) for ever. This protocol adds, per connection:

- a header timeout: the request line and headers must arrive in full within it, counted from
  the connection's start or from the first byte of a later request on it;
- a body timeout: a body that stops arriving for that long ends the request;
- a body deadline: a body must arrive whole within it, counted from when the request head
  was read, so one trickled a byte at a time under the body timeout still ends;
- a cap on open connections: past it, the connection that has waited longest without a whole
  request is closed to make room (an attacker's half-open ones go first); only when every
  connection holds a request in progress is the new one answered 503 and closed, so requests
  already running are never touched.

A timed-out or refused connection gets a 408 or 503 in the error envelope, then is closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from mlxcel.protocol.errors import APIError

logger = logging.getLogger(__name__)

# File descriptors kept for what is not a client connection: model files, logs, pipes.
RESERVED_FILES = 256
# Seconds between log lines about connections closed to make room (an attack makes thousands).
EVICTION_LOG_INTERVAL = 60.0
# The longest request head (line and headers), h11's default: h11 bounds only a head still
# incomplete, so a larger one that arrived whole in one read (126 KB here) was taken; the
# protocol below checks a whole head too, and uvicorn is given the same bound.
MAX_HEAD_BYTES = 16 * 1024


@dataclass(frozen=True)
class ConnectionLimits:
    """The limits one server applies to every connection (seconds, and a count)."""

    header_timeout: float
    body_timeout: float
    body_deadline: float
    max_connections: int


def raw_response(error: APIError) -> bytes:
    """A whole HTTP response carrying `error`, closing the connection: for moments where h11
    has no request to answer (nothing or half a request head arrived)."""
    body = json.dumps(error.body()).encode()
    head = [
        f"HTTP/1.1 {error.status} {_REASONS[error.status]}",
        "content-type: application/json",
        f"content-length: {len(body)}",
        "connection: close",
        *(f"{name}: {value}" for name, value in (error.headers or {}).items()),
    ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


_REASONS = {400: "Bad Request", 408: "Request Timeout", 503: "Service Unavailable"}


def file_limit_for(max_connections: int) -> int:
    """Raise this process's open-file limit to hold `max_connections` clients if it may, and
    return the connection cap that fits under the limit it has (at least 16)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + RESERVED_FILES
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return max_connections
    fitted = max(16, soft - RESERVED_FILES)
    logger.warning(
        "--max-connections %d lowered to %d: the open-file limit is %d (raise it with ulimit -n)",
        max_connections,
        fitted,
        soft,
    )
    return fitted


def guarded_protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """uvicorn's h11 protocol with `limits` applied; one class per server, sharing the list
    of connections that hold no request in progress, oldest first."""
    waiting: dict[GuardedProtocol, None] = {}

    class GuardedProtocol(H11Protocol):
        _timer: asyncio.TimerHandle | None = None
        _refused = False
        _upgraded = False
        # The request head read so far: its size, and its last bytes (a CRLFCRLF may straddle).
        _head_bytes = 0
        _head_tail = b""
        # When the body of the request being read must have arrived (loop time).
        _body_due: float | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            if len(self.connections) >= limits.max_connections and not _make_room():
                self._refused = True
                self.transport = transport
                error = APIError(
                    503,
                    f"too many open connections (the server takes {limits.max_connections}); "
                    "retry shortly",
                    type="server_busy",
                    code="too_many_connections",
                    headers={"Retry-After": "1"},
                )
                transport.write(raw_response(error))
                # Closed once the client has read it: closing with its request unread would
                # reset the connection and lose the answer.
                transport.write_eof()
                self._timer = self.loop.call_later(1.0, transport.close)
                return
            super().connection_made(transport)
            self._wait_for_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_timer()
            waiting.pop(self, None)
            if not self._refused:
                super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            if self.conn.their_state is h11.IDLE and self._head_too_large(data):
                self.send_400_response(
                    f"the request head is larger than {MAX_HEAD_BYTES // 1024} KiB"
                )
                return
            super().data_received(data)
            self._track()

        def _head_too_large(self, data: bytes) -> bool:
            """Whether the request head `data` continues (or ends) is past MAX_HEAD_BYTES."""
            joined = self._head_tail + data
            end = joined.find(b"\r\n\r\n")
            if end < 0:
                self._head_bytes += len(data)
                self._head_tail = joined[-3:]
                return self._head_bytes > MAX_HEAD_BYTES
            size = self._head_bytes - len(self._head_tail) + end + 4
            self._head_bytes, self._head_tail = 0, b""
            return size > MAX_HEAD_BYTES

        def handle_websocket_upgrade(self, event: h11.Request) -> None:
            # The socket is the WebSocket protocol's from here: no timer of ours may write an
            # HTTP answer into its frames (a /v1/realtime session outlives --body-timeout).
            self._upgraded = True
            self._cancel_timer()
            waiting.pop(self, None)
            super().handle_websocket_upgrade(event)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._track(after_response=True)

        def send_400_response(self, msg: str) -> None:
            self._cancel_timer()
            self.transport.write(raw_response(APIError(400, msg, code="invalid_http")))
            self.transport.close()

        def _track(self, after_response: bool = False) -> None:
            """Arm the timer the connection's state calls for."""
            if self._upgraded:
                return
            state = self.conn.their_state
            if state is h11.IDLE:
                # Between requests uvicorn's keep-alive timer runs; once a byte of the next
                # request head arrives, the header timeout does.
                if after_response:
                    self._cancel_timer()
                    waiting[self] = None
                elif self._timer is None:
                    self._wait_for_head()
            elif state is h11.SEND_BODY:
                waiting[self] = None
                if self._body_due is None:
                    self._body_due = self.loop.time() + limits.body_deadline
                self._arm_body_timer()
                return
            else:
                self._cancel_timer()
                waiting.pop(self, None)
            self._body_due = None

        def _arm_body_timer(self) -> None:
            """The body timeout from now, or the body's deadline if that comes first."""
            assert self._body_due is not None
            left = self._body_due - self.loop.time()
            self._arm(min(limits.body_timeout, max(left, 0.0)), self._body_late)

        def _wait_for_head(self) -> None:
            waiting[self] = None
            self._arm(limits.header_timeout, self._head_timed_out)

        def _arm(self, delay: float, callback: Callable[[], None]) -> None:
            self._cancel_timer()
            self._timer = self.loop.call_later(delay, callback)

        def _cancel_timer(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _head_timed_out(self) -> None:
            self._timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self._time_out(
                    f"the request headers did not arrive within {limits.header_timeout:g} s"
                )

        def _body_late(self) -> None:
            self._timer = None
            if self.flow.read_paused:
                # The app has not read what came: the client is not the one stalling.
                self._arm(limits.body_timeout, self._body_late)
                return
            if self._body_due is not None and self.loop.time() >= self._body_due:
                self._time_out(
                    f"the request body did not arrive whole within {limits.body_deadline:g} s"
                )
                return
            self._time_out(f"the request body stalled for {limits.body_timeout:g} s")

        def _time_out(self, why: str) -> None:
            cycle = self.cycle
            if cycle is None or cycle.response_complete or not cycle.response_started:
                self.transport.write(raw_response(APIError(408, why, code="request_timeout")))
            if cycle is not None and not cycle.response_complete:
                # The app reads a disconnect from here on and writes nothing more.
                cycle.disconnected = True
                cycle.message_event.set()
            self.close()

        def close(self) -> None:
            """Close the connection now (timed out, or evicted to make room)."""
            self._cancel_timer()
            waiting.pop(self, None)
            self.transport.close()

    evicted = [0, 0.0]  # closed since the last log line, and when that line was written

    def _make_room() -> bool:
        """Close the connection that has waited longest without a whole request, if any."""
        for oldest in waiting:
            oldest.close()
            evicted[0] += 1
            now = time.monotonic()
            if now - evicted[1] >= EVICTION_LOG_INTERVAL:
                logger.warning(
                    "%d open connections (--max-connections): closed %d that held no request",
                    limits.max_connections,
                    evicted[0],
                )
                evicted[:] = [0, now]
            return True
        return False

    return GuardedProtocol
