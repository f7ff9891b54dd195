"""Whether a loaded model's worker process still answers.

A worker that dies is seen at once (its connection ends), but one that is stopped (SIGSTOP, a
debugger) or wedged (a thread holding the interpreter forever) keeps its connection open while
its requests hang. So the HTTP process pings each loaded worker every few seconds; the worker
answers from the thread that reads its connection, through its outbox (`worker/main.py`). A
worker with no answer for `timeout` seconds is killed: its connection ends, its requests fail
with 503 `model_unavailable` naming why, the model is `failed` and its next request starts it
again. A busy engine does not delay the answer: llama.cpp, MLX and the encoders run their
native work without holding the interpreter.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from mlxcel.wire.messages import Ping

logger = logging.getLogger(__name__)

# How often a worker is pinged, at most (a short timeout pings more often).
PING_EVERY_S = 2.0


class Heartbeat:
    """Pings one worker and says when it stopped answering."""

    def __init__(
        self,
        name: str,
        timeout: float,
        send: Callable[[object], None],
        unresponsive: Callable[[str], None],
    ) -> None:
        self._name = name
        self._timeout = timeout
        self._send = send
        self._unresponsive = unresponsive
        self._answered = time.monotonic()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=f"heartbeat-{name}", daemon=True)

    def start(self) -> None:
        """Start pinging (once the model has loaded: a worker loading its model does not
        read its connection)."""
        self._answered = time.monotonic()
        self._thread.start()

    def answered(self) -> None:
        """A `Pong` came (from the reader thread)."""
        self._answered = time.monotonic()

    def stop(self) -> None:
        """Stop pinging: the worker is stopping or gone."""
        self._stopped.set()

    def _watch(self) -> None:
        seq = 0
        every = min(PING_EVERY_S, self._timeout / 3)
        while not self._stopped.wait(every):
            silent = time.monotonic() - self._answered
            if silent > self._timeout:
                reason = (
                    f"the worker process of the model '{self._name}' stopped answering "
                    f"(no heartbeat for {silent:.0f}s; --worker-timeout {self._timeout:g})"
                )
                logger.error("%s: killing it", reason)
                self._unresponsive(reason)
                return
            seq += 1
            self._send(Ping(seq))
