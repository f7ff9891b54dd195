"""Two network namespaces joined by a veth pair, for a model's ranks (tests and bench/).

`ranks_apart(prefix)` makes `PREFIX-a` and `PREFIX-b`, links them (the ring's pair,
10.213.44.1 and .2), links the first to the caller's namespace (10.213.46.1 here, .2 there) so
rank 0's HTTP can be reached, and removes all of it on exit, whatever happened. Needs root.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

RING = ("10.213.44.1", "10.213.44.2")
HTTP = ("10.213.46.1", "10.213.46.2")


@dataclass(frozen=True)
class Namespaces:
    """Rank 0's namespace and rank 1's."""

    first: str
    second: str

    def run(self, rank: int, command: list[str]) -> list[str]:
        """`command` as run inside rank `rank`'s namespace."""
        return ["ip", "netns", "exec", (self.first, self.second)[rank], *command]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _veth(
    ends: tuple[str, str], spaces: tuple[str | None, str], addresses: tuple[str, str], bits: int
) -> None:
    _ip("link", "add", ends[0], "type", "veth", "peer", "name", ends[1])
    for name, space, address in zip(ends, spaces, addresses, strict=True):
        where = ["-n", space] if space else []
        if space:
            _ip("link", "set", name, "netns", space)
        _ip(*where, "addr", "add", f"{address}/{bits}", "dev", name)
        _ip(*where, "link", "set", name, "up")


@contextlib.contextmanager
def ranks_apart(prefix: str) -> Iterator[Namespaces]:
    """The two namespaces, linked, for the `with` block; gone after it."""
    if os.geteuid() != 0:
        raise PermissionError("network namespaces need root")
    spaces = Namespaces(f"{prefix}-a", f"{prefix}-b")
    tag = prefix.replace("-", "")[:10]
    try:
        for space in (spaces.first, spaces.second):
            _ip("netns", "add", space)
            _ip("-n", space, "link", "set", "lo", "up")
        _veth((f"{tag}ra", f"{tag}rb"), (spaces.first, spaces.second), RING, 24)
        _veth((f"{tag}h", f"{tag}ha"), (None, spaces.first), HTTP, 30)
        yield spaces
    finally:
        for space in (spaces.first, spaces.second):
            subprocess.run(["ip", "netns", "del", space], capture_output=True)
        subprocess.run(["ip", "link", "del", f"{tag}h"], capture_output=True)


def write_hostfile(path: Path) -> Path:
    """mlx.launch's hostfile for the two ranks (the ring's ports from 32323)."""
    hosts = [{"ssh": name, "ips": [ip]} for name, ip in zip("ab", RING, strict=True)]
    path.write_text(json.dumps({"hosts": hosts}))
    return path


def children(pid: int) -> list[int]:
    """The pids whose parent is `pid`."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError):
            if int(stat.read_text().rpartition(")")[2].split()[1]) == pid:
                pids.append(int(stat.parent.name))
    return pids
