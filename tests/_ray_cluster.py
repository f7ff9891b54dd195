"""A two-node Ray cluster for tests/test_ray.py: the head on this machine, on one end of a veth
pair, and a second node inside a network namespace the test creates, one CPU each, no
dashboard, no usage stats. Its head and node can be stopped (every process killed, as a
machine lost) and started again at the same address; `end` removes every process, the
namespace and the temp dir, whatever happened."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from tests.server_process import MLXCEL, free_port

RAY = Path(MLXCEL).with_name("ray")
# The head node's address (here, on the veth) and the second node's (in the namespace).
HEAD, NODE = "10.213.42.1", "10.213.42.2"


def _session(pid: int) -> list[int]:
    """The processes of the session that `pid` leads (a node and what it started)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = (entry / "stat").read_text().rpartition(")")[2].split()
                if int(fields[3]) == pid:
                    found.append(int(entry.name))
    return found


def _naming(text: str) -> list[int]:
    """The processes whose command line names `text` (the head's temp dir)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


def _kill(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


class Cluster:
    """The test's cluster: `start()` both nodes, `stop()` them, `end()` it all."""

    def __init__(self) -> None:
        self.temp_dir = tempfile.mkdtemp(prefix="mlxc42-", dir="/tmp")
        self.netns = f"mlxc42-{os.getpid()}"
        self.port = free_port()
        self.address = f"{HEAD}:{self.port}"
        self._head: subprocess.Popen[bytes] | None = None
        self._node: subprocess.Popen[bytes] | None = None
        self._netted = False

    def _network(self) -> None:
        """A namespace joined to this one by a veth pair: HEAD here, NODE there."""
        self._netted = True
        veth = f"m42r{os.getpid() % 100000}"
        for command in (
            f"ip netns add {self.netns}",
            f"ip link add {veth}h type veth peer name {veth}n",
            f"ip link set {veth}n netns {self.netns}",
            f"ip addr add {HEAD}/24 dev {veth}h",
            f"ip link set {veth}h up",
            f"ip -n {self.netns} addr add {NODE}/24 dev {veth}n",
            f"ip -n {self.netns} link set {veth}n up",
            f"ip -n {self.netns} link set lo up",
        ):
            subprocess.run(command.split(), check=True, capture_output=True)

    def start(self) -> None:
        """Start the head, then the second node, and wait until both are in the cluster
        (the first time, make their network)."""
        if not self._netted:
            self._network()
        self._head = _ray_node(
            "--head",
            f"--node-ip-address={HEAD}",
            f"--port={self.port}",
            f"--temp-dir={self.temp_dir}",
            "--include-dashboard=false",
            "--num-cpus=1",
        )
        self._wait_for_nodes(1)
        self._node = _ray_node(
            f"--address={self.address}",
            f"--node-ip-address={NODE}",
            "--num-cpus=1",
            prefix=("ip", "netns", "exec", self.netns),
        )
        self._wait_for_nodes(2)

    def _pids(self) -> list[int]:
        """Every process of the cluster: the head's session, those naming its temp dir, and
        those in the namespace (the second node's)."""
        netns = subprocess.run(
            ["ip", "netns", "pids", self.netns], capture_output=True, text=True
        ).stdout
        found = [int(pid) for pid in netns.split()] + _naming(self.temp_dir)
        for node in (self._head, self._node):
            if node is not None:
                found += _session(node.pid)
        return [pid for pid in dict.fromkeys(found) if pid != os.getpid()]

    def stop(self) -> None:
        """Kill every process of both nodes at once (the machines lost)."""
        for _ in range(3):
            _kill(self._pids(), signal.SIGKILL)
            time.sleep(0.5)
        for node in (self._head, self._node):
            if node is not None:
                node.wait(10)
        self._head = self._node = None

    def end(self) -> None:
        """End every process of the cluster, then its namespace and temp dir."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            _kill(self._pids(), sig)
            time.sleep(2 if sig == signal.SIGTERM else 0.5)
        with contextlib.suppress(Exception):
            self.stop()
        subprocess.run(["ip", "netns", "del", self.netns], check=False)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def _wait_for_nodes(self, count: int) -> None:
        deadline = time.monotonic() + 90
        while True:
            status = subprocess.run(
                [str(RAY), "status", f"--address={self.address}"], capture_output=True, text=True
            )
            if status.returncode == 0 and status.stdout.count(" node_") >= count:
                return
            nodes = [n for n in (self._head, self._node) if n is not None]
            assert all(node.poll() is None for node in nodes), "a Ray node failed to start"
            assert time.monotonic() < deadline, f"the Ray cluster has not {count} nodes"
            time.sleep(1)


def _ray_node(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [*prefix, str(RAY), "start", "--block", "--disable-usage-stats", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
        start_new_session=True,
    )
