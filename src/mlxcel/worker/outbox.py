"""What a worker sends back to the HTTP process: a call's thread writes its reply itself, at
once; a text engine's thread holds what a turn of its loop delivers and writes it itself as one
message (`TurnBatch`: a step of eight streams is one write, with no thread to wake and no GIL
to hand over on every token); everything else (other models' stream items) goes through one
sender thread that writes whatever has piled up as one message (a sentence of audio goes with
its stream's end).
"""

from __future__ import annotations

import os
import pickle
import queue
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from mlxcel.engine.handle import Cancellable
from mlxcel.wire.messages import Recorded, Streamed

# Calls (tokenizing, /slots, an encoder's batches) that may run at once in one worker.
CALL_THREADS = 4


class Outbox:
    """Everything the worker sends, in batches: held by a thread that asked (`hold`, a
    `TurnBatch`), else written by the sender thread."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._held = threading.local()
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._writing = threading.Lock()
        self._thread = threading.Thread(target=self._send, name="outbox", daemon=True)
        self._thread.start()

    def put(self, message: object) -> None:
        """Send `message` soon, with whatever else is waiting (any thread): at this thread's
        next `release` if it holds, else by the sender thread."""
        held: list[object] | None = getattr(self._held, "messages", None)
        if held is not None:
            held.append(message)
        else:
            self._queue.put(message)

    def hold(self) -> None:
        """Hold what this thread puts until its `release` (the engine thread, for good)."""
        self._held.messages = []

    def release(self) -> None:
        """Write what this thread has held, from this thread. The socket's buffer (4 MiB)
        takes a turn's message without waiting while the HTTP process reads."""
        held: list[object] | None = getattr(self._held, "messages", None)
        if held:
            self._held.messages = []
            self._write(held)

    def send_now(self, message: object) -> None:
        """Send `message` from this thread, now: a call's reply, which a thread of the HTTP
        process waits for, goes without a wake-up of the sender thread first (0.1-0.15 ms
        sooner here). It may pass what `put` queued before it."""
        self._write([message])

    def close(self) -> None:
        """Send what this thread holds and what is queued, then stop."""
        self.release()
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

    def disk_loaded(self, seconds: float) -> None:
        self._record("disk_loaded", seconds)

    def disk_size(self, entries: int, total_bytes: int) -> None:
        self._record("disk_size", entries, total_bytes)

    def token(self, first: bool, seconds: float) -> None:
        self._record("token", first, seconds)

    def drafted(self, drafted: int, accepted: int) -> None:
        self._record("drafted", drafted, accepted)

    def stepped(self, sequences: int, tokens: int, prompt_tokens: int) -> None:
        self._record("stepped", sequences, tokens, prompt_tokens)

    def measured(self, tokens: int, prompt_seconds: float, generation_seconds: float) -> None:
        self._record("measured", tokens, prompt_seconds, generation_seconds)

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


def picklable(error: BaseException) -> BaseException:
    """The error itself when it can cross to the HTTP process, else one that says the same."""
    try:
        pickle.dumps(error)
    except Exception:
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error
