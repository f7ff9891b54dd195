"""Graceful shutdown: on SIGTERM or SIGINT (or when the managed client's pipe closes) stop
taking requests, let the ones in flight finish within the shutdown timeout, end the rest with
an error, then let uvicorn exit, so that cleanup runs and the process exits 0.

uvicorn's own handling re-raises the signal once it has stopped, which kills the process
before the socket file is removed (SIGTERM) or prints tracebacks (SIGINT); and past its
timeout it cancels the streams in flight, cutting them with no error event and no [DONE].
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Iterator

import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from mlxcel.api.errors import error_response
from mlxcel.protocol.errors import APIError

logger = logging.getLogger(__name__)

# After the in-flight generations were ended with an error: time for those answers to go out.
ABORT_GRACE_S = 5
_POLL_S = 0.05


class Drain:
    """How many requests are in flight, and whether the server still takes new ones."""

    def __init__(self) -> None:
        self.draining = False
        self.active = 0


class RefuseWhileDraining:
    """ASGI middleware: counts the requests in flight, and once shutdown has begun answers a
    new request on a connection still open with 503 and closes the connection."""

    def __init__(self, app: ASGIApp, drain: Drain) -> None:
        self.app = app
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self.drain.draining:
            error = APIError(
                503,
                "the server is shutting down",
                code="shutting_down",
                headers={"Connection": "close"},
            )
            await error_response(error)(scope, receive, send)
            return
        self.drain.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.drain.active -= 1


class DrainingServer(uvicorn.Server):
    """uvicorn's server, shut down gracefully by the signals it would handle.

    `abort` ends every generation in flight with an error (it blocks: it runs on a thread).
    """

    def __init__(
        self,
        config: uvicorn.Config,
        drain: Drain,
        *,
        timeout: float,
        abort: Callable[[], None],
    ) -> None:
        super().__init__(config)
        self._drain = drain
        self._timeout = timeout
        self._abort = abort
        self._hurry = False
        self._task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """SIGTERM and SIGINT begin the drain; a second one ends what still runs at once."""
        loop = asyncio.get_running_loop()
        signals = (signal.SIGTERM, signal.SIGINT)
        for sig in signals:
            loop.add_signal_handler(sig, self.begin_drain, sig.name)
        try:
            yield
        finally:
            for sig in signals:
                loop.remove_signal_handler(sig)

    def watch_pipe(self, fd: int) -> None:
        """Drain when `fd` reaches end of file: the managed client's end of the pipe closed
        because that process exited."""
        loop = asyncio.get_running_loop()

        def readable() -> None:
            if not os.read(fd, 4096):
                loop.remove_reader(fd)
                self.begin_drain("the parent process exited")

        loop.add_reader(fd, readable)

    def begin_drain(self, why: str) -> None:
        """Stop taking requests and finish the ones in flight (a second call: end them now)."""
        if self._task is not None:
            self._hurry = True
            return
        self._drain.draining = True
        logger.info(
            "%s: finishing %d request(s) in flight (at most %gs), then exiting",
            why,
            self._drain.active,
            self._timeout,
        )
        self._task = asyncio.ensure_future(self._finish())

    async def _finish(self) -> None:
        loop = asyncio.get_running_loop()
        # Stop listening now; uvicorn closes the idle connections once should_exit is set.
        for listener in getattr(self, "servers", []):
            listener.close()
        deadline = loop.time() + self._timeout
        while self._drain.active and not self._hurry and loop.time() < deadline:
            await asyncio.sleep(_POLL_S)
        if self._drain.active:
            logger.warning("ending %d request(s) still in flight", self._drain.active)
            await asyncio.to_thread(self._abort)
            grace = loop.time() + ABORT_GRACE_S
            while self._drain.active and loop.time() < grace:
                await asyncio.sleep(_POLL_S)
        self.should_exit = True
