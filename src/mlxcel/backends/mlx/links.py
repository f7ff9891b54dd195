"""The command link from rank 0 to each other rank of a group: what crosses it and how.

Rank 0 sends `Join` once, then a `Command` before each call that touches the model (open a
slot, step, forget a slot), so every rank runs the same forward passes in the same order; a
rank answers `Joined` (or `Failed`) and then `Done` for each command. Messages are
length-prefixed pickles, and a rank unpickles only the types named here: the link is meant
for a private network (docs/distributed.md), and this keeps a stray peer from running code
through it.
"""

from __future__ import annotations

import io
import pickle
import socket
import struct
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxcel.backends.group import ParallelMode, RankAddress

_LENGTH = struct.Struct("!Q")
_MAX_MESSAGE = 64 << 20


@dataclass(frozen=True)
class Join:
    """Rank 0's first message: the group, the model and how to split it."""

    rank: int
    ranks: tuple[RankAddress, ...]
    model: Path
    ctx_size: int
    parallel: int
    batch_size: int
    mode: ParallelMode
    log_level: str


@dataclass(frozen=True)
class Joining:
    """A rank has started and is about to join the ring."""

    rank: int


@dataclass(frozen=True)
class Joined:
    """A rank joined the ring and holds its part of the model."""

    rank: int


@dataclass(frozen=True)
class Command:
    """Run a generator method with these arguments (`seq` counts commands from 1)."""

    seq: int
    method: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Done:
    """The rank ran command `seq`."""

    seq: int


@dataclass(frozen=True)
class Failed:
    """The rank could not join or run a command, and leaves the group."""

    reason: str


_ALLOWED = {
    ("builtins", name) for name in ("tuple", "list", "dict", "set", "frozenset", "int", "float")
} | {
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
    ("mlxcel.backends.group", "RankAddress"),
    ("mlxcel.engine.types", "Feed"),
    ("mlxcel.engine.types", "SamplingParams"),
    *((__name__, name) for name in ("Join", "Joining", "Joined", "Command", "Done", "Failed")),
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} may not cross a rank's link")
        return super().find_class(module, name)


def send(sock: socket.socket, message: object) -> None:
    """Write one message."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_LENGTH.pack(len(data)) + data)


def receive(sock: socket.socket) -> object:
    """Read one message; EOFError when the link ends."""
    (length,) = _LENGTH.unpack(_exactly(sock, _LENGTH.size))
    if length > _MAX_MESSAGE:
        raise EOFError(f"a message of {length} bytes is not one rank 0 sends")
    return _Unpickler(io.BytesIO(_exactly(sock, length))).load()


def _exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise EOFError("the link ended")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def connect(rank: RankAddress, timeout: float) -> socket.socket:
    """A link to a rank past 0, retried until `timeout` (its process may be starting)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            sock = socket.create_connection((rank.host, rank.control_port), timeout=max(left, 0.1))
        except OSError:
            if left <= 0:
                raise
            time.sleep(min(0.2, left))
            continue
        sock.settimeout(None)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock
