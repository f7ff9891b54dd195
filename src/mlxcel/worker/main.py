"""A model's worker process: `python -m mlxcel.worker FD`.

It reads its `Setup` from the connection on file descriptor FD, loads the model there (its
engine thread runs in this process), answers `Ready` with what the HTTP process keeps of it,
then serves calls, streams and cancellations (`wire/messages.py`) until `Stop`, or until the
HTTP process goes away. Calls run on a few threads of their own, so a slow one never holds up a
stream's start or a cancellation; what the worker sends back goes through its outbox
(`worker/outbox.py`).
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from multiprocessing.connection import Connection
from typing import Any, Protocol

from mlxcel.config.settings import ModelConfig
from mlxcel.logs import configure, request_scope
from mlxcel.memory import keep_freed_memory
from mlxcel.wire.messages import (
    Broken,
    Call,
    Cancel,
    LoadFailed,
    Ping,
    Pong,
    Raised,
    Ready,
    Reply,
    Setup,
    Stop,
    Stream,
)
from mlxcel.worker.outbox import CALL_THREADS, ForwardedMetrics, Outbox, StreamSink, picklable


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
        from mlxcel.worker.text_service import TextService

        return TextService.open(
            config, ForwardedMetrics(outbox), partial(_broken, outbox), batch=outbox
        )
    from mlxcel.worker.services import open_model_service

    return open_model_service(config)


def _broken(outbox: Outbox, reason: str) -> None:
    """The model's group lost a rank (any thread): say why, then end; the HTTP process fails
    what is in flight with the reason and reloads the model on a later request."""
    outbox.put(Broken(reason))
    outbox.close()
    os._exit(3)


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
            elif isinstance(message, Ping):
                self._outbox.put(Pong(message.seq))

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
