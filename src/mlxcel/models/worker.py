"""A model's worker process: `python -m mlxcel.models.worker FD`.

It reads its `Setup` from the connection on file descriptor FD, loads the model there (its
engine thread runs in this process), answers `Ready` with what the HTTP process keeps of it,
then serves calls, streams and cancellations (`models/wire.py`) until `Stop`, or until the HTTP
process goes away. Calls run on a few threads of their own, so a slow one never holds up a
stream's start or a cancellation. A call's thread writes its reply itself, at once; everything
else the worker sends (stream items, metric calls) goes through one sender thread that writes
whatever has piled up as one message (a text model's step of eight streams is one write, and
a sentence of audio goes with its stream's end).
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any, Protocol

from mlxcel.config import ModelConfig
from mlxcel.engine.handle import Cancellable
from mlxcel.logs import configure, request_scope
from mlxcel.models.memory import keep_freed_memory
from mlxcel.models.wire import (
    Call,
    Cancel,
    LoadFailed,
    Raised,
    Ready,
    Recorded,
    Reply,
    Setup,
    Stop,
    Stream,
    Streamed,
)

logger = logging.getLogger(__name__)

# Calls (tokenizing, /slots, an encoder's batches) that may run at once in one worker.
CALL_THREADS = 4


class Outbox:
    """Everything the worker sends, written by one thread in batches."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._writing = threading.Lock()
        self._thread = threading.Thread(target=self._send, name="outbox", daemon=True)
        self._thread.start()

    def put(self, message: object) -> None:
        """Send `message` soon, with whatever else is waiting (any thread)."""
        self._queue.put(message)

    def send_now(self, message: object) -> None:
        """Send `message` from this thread, now: a call's reply, which a thread of the HTTP
        process waits for, goes without a wake-up of the sender thread first (0.1-0.15 ms
        sooner here). It may pass what `put` queued before it."""
        self._write([message])

    def close(self) -> None:
        """Send what is queued, then stop."""
        self._queue.put(self._closed)
        self._thread.join(timeout=10)

    def _send(self) -> None:
        while True:
            batch = [self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get_nowait())
            closing = self._closed in batch
            if closing:
                batch.remove(self._closed)
            if batch:
                self._write(batch)
            if closing:
                return

    def _write(self, messages: list[object]) -> None:
        with self._writing:
            try:
                self._conn.send(messages)
            except OSError:
                # The HTTP process is gone: nobody is left to serve.
                os._exit(0)


class ForwardedMetrics:
    """`RecordsMetrics` for an engine in a worker: each call goes to the HTTP process, which
    records it in the model's Prometheus series."""

    def __init__(self, outbox: Outbox) -> None:
        self._outbox = outbox
        self._load: tuple[int, int] | None = None

    def _record(self, method: str, *args: Any) -> None:
        self._outbox.put(Recorded(method, args))

    def admitted(self, prompt_tokens: int, cached_tokens: int) -> None:
        self._record("admitted", prompt_tokens, cached_tokens)

    def cache_loaded(self) -> None:
        self._record("cache_loaded")

    def cache_size(self, total_bytes: int) -> None:
        self._record("cache_size", total_bytes)

    def token(self, first: bool, seconds: float) -> None:
        self._record("token", first, seconds)

    def drafted(self, drafted: int, accepted: int) -> None:
        self._record("drafted", drafted, accepted)

    def stepped(self, sequences: int, tokens: int, prompt_tokens: int) -> None:
        self._record("stepped", sequences, tokens, prompt_tokens)

    def load(self, running: int, waiting: int) -> None:
        # The scheduler sets the gauges on every turn of its loop; only a change travels.
        if (running, waiting) != self._load:
            self._load = (running, waiting)
            self._record("load", running, waiting)

    def rejected(self, reason: str) -> None:
        self._record("rejected", reason)

    def finished(self, reason: str) -> None:
        self._record("finished", reason)


class StreamSink(Cancellable):
    """Where one stream's results go: to the HTTP process, tagged with the stream's id."""

    def __init__(
        self,
        stream_id: int,
        request_id: str,
        outbox: Outbox,
        is_last: Callable[[Any], bool],
        done: Callable[[int], None],
    ) -> None:
        super().__init__(request_id)
        self.stream_id = stream_id
        self._outbox = outbox
        self._is_last = is_last
        self._done = done

    def deliver(self, item: Any) -> None:
        """One result (any thread); the last one closes the stream."""
        last = self._is_last(item)
        self._outbox.put(Streamed(self.stream_id, item, last))
        if last:
            self._done(self.stream_id)


class Service(Protocol):
    """A model as its worker serves it: what it tells the HTTP process once, what it answers
    to calls and streams, and how it stops."""

    calls: frozenset[str]
    """Methods a `Call` may name: each takes the call's arguments and returns the reply."""
    streams: frozenset[str]
    """Methods a `Stream` may name: each takes the stream's sinks (one per id) first, then the
    arguments."""

    def facts(self) -> Any:
        """What the HTTP process keeps of the model (sent in `Ready`)."""
        ...

    def is_last(self, item: Any) -> bool:
        """Whether a stream's item is its last."""
        ...

    def close(self) -> None:
        """Stop the engine (the process ends next, which frees the weights)."""
        ...


def open_service(config: ModelConfig, outbox: Outbox) -> Service:
    """Load the model the config names and serve it as its kind does."""
    if config.kind in ("text", "vision"):
        from mlxcel.models.text_service import TextService

        return TextService.open(config, ForwardedMetrics(outbox))
    from mlxcel.models.services import open_model_service

    return open_model_service(config)


def picklable(error: BaseException) -> BaseException:
    """The error itself when it can cross to the HTTP process, else one that says the same."""
    try:
        pickle.dumps(error)
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


class Dispatcher:
    """Runs what the HTTP process asks of the model."""

    def __init__(self, service: Service, outbox: Outbox) -> None:
        self._service = service
        self._outbox = outbox
        self._sinks: dict[int, StreamSink] = {}
        self._calls = ThreadPoolExecutor(CALL_THREADS, thread_name_prefix="call")

    def serve(self, conn: Connection) -> bool:
        """Handle messages until `Stop` (True) or the end of the connection (False: the HTTP
        process is gone)."""
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                return False
            if isinstance(message, Stop):
                return True
            if isinstance(message, Stream):
                self._start(message)
            elif isinstance(message, Cancel):
                sink = self._sinks.get(message.id)
                if sink is not None:
                    sink.cancel()
            elif isinstance(message, Call):
                self._calls.submit(self._call, message)

    def _call(self, call: Call) -> None:
        with request_scope(call.request_id or ""):
            try:
                if call.method not in self._service.calls:
                    raise AttributeError(f"no call named '{call.method}'")
                value = getattr(self._service, call.method)(*call.args)
            except Exception as exc:
                self._outbox.send_now(Raised(call.id, picklable(exc)))
                return
        self._outbox.send_now(Reply(call.id, value))

    def _start(self, stream: Stream) -> None:
        sinks = [
            StreamSink(
                stream_id,
                stream.request_id or str(stream_id),
                self._outbox,
                self._service.is_last,
                self._finished,
            )
            for stream_id in stream.ids
        ]
        self._sinks.update((sink.stream_id, sink) for sink in sinks)
        try:
            if stream.method not in self._service.streams:
                raise AttributeError(f"no stream named '{stream.method}'")
            getattr(self._service, stream.method)(sinks, *stream.args)
        except Exception as exc:
            error = picklable(exc)
            for stream_id in stream.ids:
                self._sinks.pop(stream_id, None)
                self._outbox.put(Raised(stream_id, error))

    def _finished(self, stream_id: int) -> None:
        self._sinks.pop(stream_id, None)


def main(argv: list[str]) -> None:
    """The worker's life: set up, load, serve, exit."""
    # Ctrl-C on a terminal, and a service manager's SIGTERM, may reach every process of the
    # server: the HTTP process drains its requests first, then decides when its workers stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    conn = Connection(int(argv[1]))
    setup: Setup = conn.recv()
    configure(setup.log_level, setup.log_format)
    keep_freed_memory()
    outbox = Outbox(conn)
    try:
        service = open_service(setup.config, outbox)
    except Exception as exc:
        outbox.put(LoadFailed(str(exc) or type(exc).__name__))
        outbox.close()
        os._exit(1)
    outbox.put(Ready(service.facts()))
    if Dispatcher(service, outbox).serve(conn):
        service.close()
        outbox.close()
    # Daemon threads (the engine's, the calls') end with the process; with the HTTP process
    # gone nobody is left to serve, so the worker ends at once, its model with it.
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv)
