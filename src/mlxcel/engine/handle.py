"""Where the engine thread delivers one request's events: the request's `EventSink`.

In the HTTP process that is a `RequestHandle` (its asyncio side); in a model's worker process
it is the sink that sends the events to the HTTP process.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from mlxcel.engine.types import TokenEvent


class EventSink(Protocol):
    """What the scheduler needs of a request: its id, its cancellation, and where its events
    go (called from the engine thread)."""

    @property
    def request_id(self) -> str:
        """The id the engine's log lines about the request carry."""
        ...

    @property
    def cancelled(self) -> bool:
        """Whether the client went away or the server gave up on this request."""
        ...

    def when_cancelled(self, callback: Callable[[], None]) -> None:
        """Run `callback` (once, on the cancelling thread) when the request is cancelled."""
        ...

    def deliver(self, event: TokenEvent) -> None:
        """Called from the engine thread: one event for the request."""
        ...


class TurnBatch(Protocol):
    """Where an engine thread's deliveries and metric calls go between two turns of its loop:
    held from `hold` on, and sent together at each `release` (a worker's step of eight
    streams is one message, written by the engine thread itself)."""

    def hold(self) -> None:
        """From now on, hold what this thread sends until `release`."""
        ...

    def release(self) -> None:
        """Send what this thread has held since the last release."""
        ...


class Unbatched:
    """A `TurnBatch` for an engine whose deliveries go out as they are made."""

    def hold(self) -> None:
        pass

    def release(self) -> None:
        pass


_handing = threading.local()
_Calls = list[tuple[Callable[[Any], None], Any]]


def call_on_loop(
    loop: asyncio.AbstractEventLoop, callback: Callable[[Any], None], arg: Any
) -> None:
    """`callback(arg)` on `loop`, soon (from any thread; RuntimeError if the loop is closed).
    Within `handing_over` on this thread, gathered with the others for the same loop and made
    at its end."""
    pending: dict[asyncio.AbstractEventLoop, _Calls] | None = getattr(_handing, "pending", None)
    if pending is None:
        loop.call_soon_threadsafe(callback, arg)
    else:
        pending.setdefault(loop, []).append((callback, arg))


@contextmanager
def handing_over() -> Iterator[None]:
    """Gather this thread's `call_on_loop` calls, then hand each loop its own in one
    `call_soon_threadsafe`, in order: the loop wakes once for what came together (a worker's
    message of a step's eight tokens, or a sentence's audio with its stream's end) and sees
    all of it in the same turn. Each wake-up is a write to the loop's socket, during which
    the loop could run the first item alone. A closed loop's calls are dropped: nobody is
    left to read them."""
    _handing.pending = {}
    try:
        yield
    finally:
        pending: dict[asyncio.AbstractEventLoop, _Calls] = _handing.pending
        _handing.pending = None
        for loop, calls in pending.items():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_call_each, calls)


def _call_each(calls: _Calls) -> None:
    for callback, arg in calls:
        callback(arg)


def ends(event: TokenEvent) -> bool:
    """Whether `event` is a request's last: it carries a finish reason or an error."""
    return event.finish_reason is not None or event.error is not None


class Cancellable:
    """A request's id and its cancellation, which any thread may set and the engine reads.

    The callback given to `when_cancelled` runs once, on the cancelling thread: the scheduler
    uses it to take a waiting request out of its queue at once.
    """

    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self._cancelled = threading.Event()
        self._on_cancel: Callable[[], None] | None = None
        self._lock = threading.Lock()

    @property
    def cancelled(self) -> bool:
        """Whether the client went away or the server gave up on this request."""
        return self._cancelled.is_set()

    def when_cancelled(self, callback: Callable[[], None]) -> None:
        """Run `callback` when the request is cancelled (at once if it already is)."""
        with self._lock:
            self._on_cancel = callback
            already = self._cancelled.is_set()
        if already:
            callback()

    def cancel(self) -> None:
        """Stop generating for this request: out of the queue now, out of the batch at the
        next step."""
        with self._lock:
            if self._cancelled.is_set():
                return
            self._cancelled.set()
            callback = self._on_cancel
        if callback is not None:
            callback()


class RequestHandle(Cancellable):
    """The asyncio side of one request: its events, and a way to cancel it."""

    def __init__(self, request_id: str, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(request_id)
        self._loop = loop
        self._events: asyncio.Queue[TokenEvent] = asyncio.Queue()

    def deliver(self, event: TokenEvent) -> None:
        """Called from another thread: hand an event to the event loop."""
        try:
            call_on_loop(self._loop, self.receive, event)
        except RuntimeError:
            self.cancel()

    def receive(self, event: TokenEvent) -> None:
        """On the event loop: queue an event for `events`."""
        self._events.put_nowait(event)

    async def events(self) -> AsyncIterator[TokenEvent]:
        """Events until the one that carries a finish reason or an error."""
        while True:
            event = await self._events.get()
            yield event
            if ends(event):
                return
