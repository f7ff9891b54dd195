"""Every request's id (`X-Request-Id`) and its access line, written when its answer ends."""

from __future__ import annotations

import logging
import re
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mlxcel.api.hosts import Envelope, json_error
from mlxcel.logs import RequestLog, request_scope
from mlxcel.protocol.errors import APIError

REQUEST_ID_HEADER = "x-request-id"
# A client's id is kept when it is printable and short; anything else could forge log lines.
_CLIENT_ID = re.compile(r"[\x21-\x7e]{1,128}")
# Clients poll /health while a server starts; a line per probe would drown everything else.
_PROBES = frozenset({"/health", "/v1/health"})

access_logger = logging.getLogger("mlxcel.access")
logger = logging.getLogger(__name__)


def request_id_for(scope: Scope) -> str:
    """The id the client sent in X-Request-Id, else a new one."""
    for name, value in scope["headers"]:
        if name == REQUEST_ID_HEADER.encode():
            given = value.decode("latin-1")
            if _CLIENT_ID.fullmatch(given):
                return given
    return uuid.uuid4().hex[:16]


class AccessLog:
    """ASGI middleware: tags the request with its id (every log line about it, and the
    response's X-Request-Id header) and writes one access line when the answer ends.

    An exception no handler took becomes a 500 in the route's envelope (`envelope`), with the
    request id in its message and header and the traceback logged once under that id."""

    def __init__(self, app: ASGIApp, envelope: Envelope) -> None:
        self.app = app
        self.envelope = envelope

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with request_scope(request_id_for(scope)) as record:
            await self._serve(record, scope, receive, send)

    async def _serve(self, record: RequestLog, scope: Scope, receive: Receive, send: Send) -> None:
        header = (REQUEST_ID_HEADER.encode(), record.request_id.encode())
        status = 500  # what the client gets when the app raises before it answers
        started = ended = False

        async def tagged_send(message: Message) -> None:
            nonlocal status, started, ended
            if message["type"] == "http.response.start":
                status, started = message["status"], True
                message = {**message, "headers": [*message.get("headers", []), header]}
            elif message["type"] == "http.response.body" and not message.get("more_body"):
                ended = True
            await send(message)

        try:
            await self.app(scope, receive, tagged_send)
        except Exception:
            logger.exception("unhandled error on %s %s", scope["method"], scope["path"])
            if started:
                raise  # the answer has begun: all that is left is to drop the connection
            error = APIError(500, f"internal server error (request id {record.request_id})")
            await json_error(tagged_send, error, self.envelope(scope["path"], error))
        finally:
            _log(scope, status, record, ended)


def _log(scope: Scope, status: int, record: RequestLog, ended: bool) -> None:
    path = scope["path"]
    level = logging.DEBUG if path in _PROBES else logging.INFO
    fields = record.fields()
    fields["duration_s"] = round(time.monotonic() - record.started, 4)
    if not ended:
        fields["ended"] = "client gone"
    http = {"method": scope["method"], "path": path, "status": status}
    access_logger.log(
        level, "%s %s %d", scope["method"], path, status, extra={"fields": fields, "http": http}
    )
