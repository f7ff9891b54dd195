"""Two network namespaces joined by a veth pair, and `mlxcel rpc-server` run in one: what
tests/test_rpc.py and bench/rpc.py put a model's two halves in. Needs root."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.server_process import MLXCEL


@dataclass(frozen=True)
class Pair:
    """The namespaces' names and their addresses on the link."""

    rpc_ns: str
    serve_ns: str
    rpc_addr: str
    serve_addr: str


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@contextmanager
def namespace_pair(prefix: str, tag: int, subnet: str) -> Iterator[Pair]:
    """`PREFIXr<tag>` (at SUBNET.1) and `PREFIXs<tag>` (at SUBNET.2) joined by a veth pair;
    both deleted on the way out, whatever happened."""
    pair = Pair(f"{prefix}r{tag}", f"{prefix}s{tag}", f"{subnet}.1", f"{subnet}.2")
    veth = (f"v{prefix[-2:]}r{tag}"[:15], f"v{prefix[-2:]}s{tag}"[:15])
    made: list[str] = []
    try:
        for ns in (pair.rpc_ns, pair.serve_ns):
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", veth[0], "type", "veth", "peer", "name", veth[1])
        ends = ((pair.rpc_ns, veth[0], pair.rpc_addr), (pair.serve_ns, veth[1], pair.serve_addr))
        for ns, dev, addr in ends:
            _ip("link", "set", dev, "netns", ns)
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        yield pair
    finally:
        subprocess.run(["ip", "link", "delete", veth[0]], capture_output=True, check=False)
        for ns in made:
            subprocess.run(["ip", "netns", "delete", ns], capture_output=True, check=False)


class RpcServer:
    """`mlxcel rpc-server ARGS` (in namespace `ns`, where given), started and ready."""

    def __init__(self, log_path: Path, ns: str | None, *args: str) -> None:
        self.log_path = log_path
        self.prefix = ["ip", "netns", "exec", ns] if ns else []
        self.args = args
        self.start()

    def start(self) -> None:
        """Start it (again) and wait for its `ready:` line."""
        ready = self.log().count("ready:") if self.log_path.exists() else 0
        command = [*self.prefix, MLXCEL, "rpc-server", "--threads", "1", *self.args]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=log)
        deadline = time.monotonic() + 60
        while self.log().count("ready:") <= ready:
            assert self.process.poll() is None, self.log()
            assert time.monotonic() < deadline, self.log()
            time.sleep(0.05)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def accepted(self) -> int:
        """Connections ggml's own server accepted (it prints a line for each)."""
        return self.log().count("Accepted client connection")

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=30)
