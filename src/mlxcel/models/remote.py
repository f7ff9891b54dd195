"""The HTTP process's side of a model's worker process: start it, call it, stream from it,
and learn when it dies.

A reader thread takes the worker's messages (`wire/messages.py`) off the connection: replies go
to the threads waiting on their calls, stream items to their receivers, metric calls into the
model's Prometheus series. When the connection ends the worker is gone: every call and stream
still open fails with `WorkerGone`, naming how the process ended, and `on_exit` tells the
registry (unless the registry stopped the worker itself).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from multiprocessing.connection import Connection
from typing import Any, Protocol

from mlxcel.config.settings import ModelConfig
from mlxcel.engine.handle import handing_over
from mlxcel.engine.metrics import RECORDED, RecordsMetrics
from mlxcel.engine.types import EngineError
from mlxcel.logs import current_request
from mlxcel.memory import resident_bytes
from mlxcel.models.heartbeat import Heartbeat
from mlxcel.models.rpc_hosts import rpc_hosts_note
from mlxcel.wire.messages import (
    Broken,
    Call,
    Cancel,
    LoadFailed,
    Pong,
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

# How long a stopped worker may take to exit before it is killed.
STOP_TIMEOUT_S = 10.0


class WorkerGone(Exception):
    """The model's worker process ended (a crash, a kill, or an unload under the request)."""


class LoadError(Exception):
    """The model could not load in its worker; the message is the worker's reason."""


class Receiver(Protocol):
    """Where one stream's items go (called from the reader thread)."""

    def deliver(self, item: Any) -> None:
        """One item of the stream."""
        ...

    def fail(self, error: BaseException) -> None:
        """The stream ends without its last item: it could not start, or the worker died."""
        ...


def how_it_ended(returncode: int | None) -> str:
    """A worker's exit status in words."""
    if returncode is None:
        return "closed its connection"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name}"
    return f"exited with status {returncode}"


class Worker:
    """One model's worker process, seen from the HTTP process."""

    def __init__(
        self,
        config: ModelConfig,
        process: subprocess.Popen[bytes],
        conn: Connection,
        metrics: RecordsMetrics,
        on_exit: Callable[[Worker, str], None],
        heartbeat_timeout: float,
    ) -> None:
        self.name = config.served_name
        self._config = config
        self._process = process
        self._conn = conn
        self._metrics = metrics
        self._on_exit = on_exit
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._calls: dict[int, Future[Any]] = {}
        self._streams: dict[int, Receiver] = {}
        self._ready: Future[Any] = Future()
        self._gone: str | None = None
        # What a worker that ends itself said first (a model over machines that lost a rank).
        self._broken: str | None = None
        # Set at shutdown (`abort`): what every call and stream fails with from then on.
        self._aborted: str | None = None
        self._stopping = False
        # Why the heartbeat killed the worker, when it did: the reason its requests fail with.
        self._unresponsive: str | None = None
        self._heartbeat = (
            Heartbeat(self.name, heartbeat_timeout, self._send, self._kill_unresponsive)
            if heartbeat_timeout > 0
            else None
        )
        self._reader = threading.Thread(target=self._read, name=f"worker-{self.name}", daemon=True)

    @classmethod
    def start(
        cls,
        config: ModelConfig,
        setup: Setup,
        metrics: RecordsMetrics,
        on_exit: Callable[[Worker, str], None],
        heartbeat_timeout: float = 0.0,
    ) -> tuple[Worker, Any]:
        """Start a worker, wait until its model has loaded, and return it with the model's
        facts; raises LoadError (or WorkerGone if the process died loading). With a
        `heartbeat_timeout` (seconds), a loaded worker that stops answering that long is
        killed (`models/heartbeat.py`)."""
        ours, theirs = socket.socketpair()
        for end in (ours, theirs):
            end.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
            end.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        with ours, theirs:
            process = subprocess.Popen(
                [sys.executable, "-m", "mlxcel.worker", str(theirs.fileno())],
                pass_fds=(theirs.fileno(),),
            )
            conn = Connection(ours.detach())
        worker = cls(config, process, conn, metrics, on_exit, heartbeat_timeout)
        worker._reader.start()
        worker._send(setup)
        try:
            facts = worker._ready.result()
        except BaseException:
            worker.stop()
            raise
        if worker._heartbeat is not None:
            worker._heartbeat.start()
        return worker, facts

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self._process.pid

    @property
    def gone(self) -> str | None:
        """How the worker process ended, once it has (None while it serves)."""
        return self._gone

    def resident_bytes(self) -> int | None:
        """The worker's resident memory now: the model's size, measured."""
        return resident_bytes(self._process.pid)

    def call(self, method: str, *args: Any) -> Any:
        """Call a method of the model and wait for its result (from any thread but the reader)."""
        future: Future[Any] = Future()
        with self._lock:
            self._check_open()
            call_id = next(self._ids)
            self._calls[call_id] = future
            self._send_locked(Call(call_id, method, args, _request_id()))
        return future.result()

    def stream(
        self, method: str, args: tuple[Any, ...], receivers: Sequence[Receiver]
    ) -> list[int]:
        """Start one stream per receiver, together, whose items go to their receivers; their
        ids (for `cancel`)."""
        with self._lock:
            self._check_open()
            ids = [next(self._ids) for _ in receivers]
            self._streams.update(zip(ids, receivers, strict=True))
            self._send_locked(Stream(tuple(ids), method, args, _request_id()))
        return ids

    def _check_open(self) -> None:
        if self._gone is not None:
            raise WorkerGone(self._gone)
        if self._aborted is not None:
            raise EngineError(self._aborted, "shutting_down")

    def abort(self, why: str) -> None:
        """End every call and stream in flight now, and any started later, with a
        `shutting_down` error: at the shutdown timeout a worker may be minutes into one
        transcription or embedding batch, which it cannot be asked to leave; `stop` then kills
        it if it does not answer."""
        with self._lock:
            self._aborted = why
            calls, self._calls = self._calls, {}
            streams, self._streams = self._streams, {}
        for future in calls.values():
            future.set_exception(EngineError(why, "shutting_down"))
        for receiver in streams.values():
            receiver.fail(EngineError(why, "shutting_down"))

    def cancel(self, stream_id: int) -> None:
        """Stop a stream (nothing happens if it ended or the worker is gone)."""
        with self._lock:
            if self._gone is None and stream_id in self._streams:
                self._send_locked(Cancel(stream_id))

    def stop(self) -> None:
        """End the worker: ask, then kill it if it lingers; its memory goes back to the system."""
        self._stopping = True
        if self._heartbeat is not None:
            self._heartbeat.stop()
        self._send(Stop())
        try:
            self._process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            logger.warning("the worker of '%s' did not stop in time: killing it", self.name)
            self._process.kill()
            self._process.wait()
        self._reader.join(timeout=STOP_TIMEOUT_S)

    def _send(self, message: object) -> None:
        with self._lock:
            self._send_locked(message)

    def _send_locked(self, message: object) -> None:
        if self._gone is not None:
            return
        # On a broken connection the reader sees its end and says what happened.
        with contextlib.suppress(OSError):
            self._conn.send(message)

    def _read(self) -> None:
        try:
            while True:
                messages = self._conn.recv()
                with handing_over():
                    for message in messages:
                        self._dispatch(message)
        except (EOFError, OSError):
            pass
        self._ended()

    def _dispatch(self, message: object) -> None:
        if isinstance(message, Streamed):
            receiver = self._streams.get(message.id)
            if receiver is not None:
                if message.last:
                    self._streams.pop(message.id, None)
                receiver.deliver(message.item)
        elif isinstance(message, Recorded):
            if message.method in RECORDED:
                getattr(self._metrics, message.method)(*message.args)
        elif isinstance(message, Reply):
            future = self._calls.pop(message.id, None)
            if future is not None:
                future.set_result(message.value)
        elif isinstance(message, Raised):
            self._raised(message)
        elif isinstance(message, Pong):
            if self._heartbeat is not None:
                self._heartbeat.answered()
        elif isinstance(message, Ready):
            self._ready.set_result(message.facts)
        elif isinstance(message, LoadFailed):
            self._ready.set_exception(LoadError(message.reason))
        elif isinstance(message, Broken):
            self._broken = f"the model '{self.name}' failed: {message.reason}"

    def _raised(self, message: Raised) -> None:
        future = self._calls.pop(message.id, None)
        if future is not None:
            future.set_exception(message.error)
            return
        receiver = self._streams.pop(message.id, None)
        if receiver is not None:
            receiver.fail(message.error)

    def _kill_unresponsive(self, reason: str) -> None:
        """The heartbeat found the worker silent: kill it (SIGKILL ends a stopped process
        too); the reader then sees the connection end and fails what is open with `reason`."""
        self._unresponsive = reason
        self._process.kill()

    def _ended(self) -> None:
        """The connection ended: the process is gone (or going); fail what is open."""
        if self._heartbeat is not None:
            self._heartbeat.stop()
        try:
            returncode = self._process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            returncode = self._process.wait()
        reason = (
            self._broken
            or self._unresponsive
            or f"the worker process of the model '{self.name}' {how_it_ended(returncode)}"
        )
        if returncode != 0 and not self._stopping and self._unresponsive is None:
            reason += rpc_hosts_note(self._config)
        with self._lock:
            self._gone = reason
            calls, self._calls = self._calls, {}
            streams, self._streams = self._streams, {}
        self._conn.close()
        gone = WorkerGone(reason)
        if not self._ready.done():
            self._ready.set_exception(gone)
        for future in calls.values():
            future.set_exception(gone)
        for receiver in streams.values():
            receiver.fail(gone)
        if not self._stopping:
            self._on_exit(self, reason)


def _request_id() -> str | None:
    record = current_request()
    return record.request_id if record is not None else None
