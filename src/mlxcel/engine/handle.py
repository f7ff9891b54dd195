"""The asyncio side of one request, which the engine thread delivers its events to."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable

from mlxcel.engine.types import TokenEvent


class RequestHandle:
    """The asyncio side of one request: its events, and a way to cancel it.

    `on_cancel` runs (once, on the cancelling thread) when the request is cancelled: the
    scheduler uses it to take a waiting request out of its queue at once.
    """

    def __init__(
        self,
        request_id: str,
        loop: asyncio.AbstractEventLoop,
        on_cancel: Callable[[RequestHandle], None] | None = None,
    ) -> None:
        self.request_id = request_id
        self._loop = loop
        self._events: asyncio.Queue[TokenEvent] = asyncio.Queue()
        self._cancelled = threading.Event()
        self._on_cancel = on_cancel
        self._lock = threading.Lock()

    @property
    def cancelled(self) -> bool:
        """Whether the client went away or the server gave up on this request."""
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop generating for this request: out of the queue now, out of the batch at the
        next step."""
        with self._lock:
            if self._cancelled.is_set():
                return
            self._cancelled.set()
        if self._on_cancel is not None:
            self._on_cancel(self)

    def deliver(self, event: TokenEvent) -> None:
        """Called from the engine thread: hand an event to the event loop."""
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:
            self.cancel()

    async def events(self) -> AsyncIterator[TokenEvent]:
        """Events until the one that carries a finish reason or an error."""
        while True:
            event = await self._events.get()
            yield event
            if event.finish_reason is not None or event.error is not None:
                return
