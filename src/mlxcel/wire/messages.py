"""The protocol between the HTTP process and a model's worker process.

One connection (`multiprocessing.connection`, pickled messages) per worker. The HTTP process
sends `Setup` once, then `Call`, `Stream`, `Cancel` and `Stop`, one message at a time; the
worker answers with lists of messages (everything it had to say since its last send, so a step
of eight streams is one write): `Ready` or `LoadFailed` once, then `Reply` or `Raised` for each
call, `Streamed` items for each stream (the last one marked), `Raised` for a stream that could
not start, and `Recorded` metric calls. What a call or a stream may name is the model kind's
business (`worker/text_service.py` for text generation, `worker/services.py` for the other
kinds); the messages stay the same for every kind.
A worker's health is its connection: the end of it means the process is gone, and its exit
status says why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlxcel.config.settings import ModelConfig


@dataclass(frozen=True)
class Setup:
    """What a worker is started with: its model, and how to write its log lines."""

    config: ModelConfig
    log_level: str
    log_format: str


@dataclass(frozen=True)
class Call:
    """Call a named method of the model with picklable arguments; answered by `Reply`."""

    id: int
    method: str
    args: tuple[Any, ...]
    request_id: str | None = None
    """The HTTP request it is for, so the worker's log lines about it carry the id."""


@dataclass(frozen=True)
class Stream:
    """Start a named method that runs one result stream per id, together (the sequences of one
    request, admitted whole or not at all); each one's results come back as `Streamed` items
    with its id."""

    ids: tuple[int, ...]
    method: str
    args: tuple[Any, ...]
    request_id: str | None = None


@dataclass(frozen=True)
class Cancel:
    """The stream's client went away: stop it (it may still send what was under way)."""

    id: int


@dataclass(frozen=True)
class Stop:
    """End the worker: its engine stops and the process exits."""


@dataclass(frozen=True)
class Ping:
    """Are you there? The worker answers `Pong` with the same number from the thread that
    reads its connection, through its outbox: a stopped or wedged process does not."""

    seq: int


@dataclass(frozen=True)
class Pong:
    """The answer to `Ping`."""

    seq: int


@dataclass(frozen=True)
class Ready:
    """The model loaded; `facts` is what the HTTP process keeps of it (its kind says what)."""

    facts: Any


@dataclass(frozen=True)
class LoadFailed:
    """The model could not load; the worker exits after sending this."""

    reason: str


@dataclass(frozen=True)
class Broken:
    """The model cannot go on (a rank of its group is gone): every request on it fails with
    `reason`, and the worker exits after sending this."""

    reason: str


@dataclass(frozen=True)
class Reply:
    """A call's result."""

    id: int
    value: Any


@dataclass(frozen=True)
class Raised:
    """A call raised `error`, or a stream could not start (one for each of its ids)."""

    id: int
    error: BaseException


@dataclass(frozen=True)
class Streamed:
    """One result of a stream; `last` closes it."""

    id: int
    item: Any
    last: bool


@dataclass(frozen=True)
class Recorded:
    """A metric the model's engine recorded (a `RecordsMetrics` method and its arguments)."""

    method: str
    args: tuple[Any, ...]
