"""Start the real `mlxcel serve` in a child process and wait until /health says ok."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import anthropic
import httpx
import openai

MLXCEL = str(Path(sys.executable).parent / "mlxcel")
# free_port() gives the port up before the child binds it; another process may take it between.
PORT_RETRIES = 3


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alive(pid: int) -> bool:
    """Whether a process runs (a zombie nobody has reaped yet counts as ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of a sample in a /metrics page over the series whose labels include `labels`."""
    wanted = {f'{key}="{value}"' for key, value in labels.items()}
    total = 0.0
    for line in text.splitlines():
        sample, _, value = line.rpartition(" ")
        series, _, label_text = sample.partition("{")
        if series == name and wanted <= set(label_text.rstrip("}").split(",")):
            total += float(value)
    return total


class ServerProcess:
    """One `mlxcel serve` child on a free port or a Unix socket."""

    def __init__(
        self,
        *args: str,
        socket_path: Path | None = None,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        command: str = "serve",
        prefix: tuple[str, ...] = (),
    ) -> None:
        self.subcommand = command
        self.prefix = prefix
        """What runs the command (`ip netns exec NS`: it execs it, so the pid stays its)."""
        self.socket_path = socket_path
        self.args = args
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path
        self._spawn()

    def _spawn(self) -> None:
        self.port = free_port()
        where = (
            ["--socket", str(self.socket_path)] if self.socket_path else ["--port", str(self.port)]
        )
        threads = ["--threads", "1"] if self.subcommand == "serve" else []
        self.command = [*self.prefix, MLXCEL, self.subcommand, *where, *threads, *self.args]
        self._log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            self.command, stdout=self._log, stderr=subprocess.STDOUT, env=self.env
        )

    @property
    def root(self) -> str:
        """Base URL without /v1."""
        return "http://localhost" if self.socket_path else f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """Base URL for the OpenAI client."""
        return self.root + "/v1"

    def http(self, **kwargs: object) -> httpx.Client:
        """An httpx client that reaches this server (over its socket if it has one)."""
        transport = httpx.HTTPTransport(uds=str(self.socket_path)) if self.socket_path else None
        return httpx.Client(base_url=self.root, transport=transport, timeout=120, **kwargs)  # type: ignore[arg-type]

    def openai(self) -> openai.OpenAI:
        """The official OpenAI client pointed at this server (TCP), without retries."""
        return openai.OpenAI(base_url=self.base_url, api_key="x", max_retries=0)

    def anthropic(self, api_key: str = "x") -> anthropic.Anthropic:
        """The official Anthropic client pointed at this server (TCP), without retries."""
        return anthropic.Anthropic(base_url=self.root, api_key=api_key, max_retries=0)

    def wait_ready(self, timeout: float = 120) -> None:
        """Poll /health until 200; fail with the log if the child dies first."""
        deadline = time.monotonic() + timeout
        retries = PORT_RETRIES
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                if retries and self._lost_port_race():
                    retries -= 1
                    self._close_log()
                    self._spawn()
                    continue
                raise RuntimeError(f"server exited with {self.process.returncode}: {self.log()}")
            try:
                with self.http() as client:
                    if client.get("/health").status_code == 200:
                        return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready after {timeout}s: {self.log()}")

    def metric(self, name: str, **labels: str) -> float:
        """The sum of a /metrics sample over the series whose labels include `labels`."""
        with self.http() as client:
            return metric_sum(client.get("/metrics").text, name, **labels)

    def resident_bytes(self) -> int:
        """The resident memory (VmRSS) of the server and its models' workers together, in
        bytes."""
        total = 0
        for pid in (self.process.pid, *self.workers()):
            with contextlib.suppress(OSError):
                lines = Path(f"/proc/{pid}/status").read_text().splitlines()
                total += int(next(line for line in lines if line.startswith("VmRSS:")).split()[1])
        return total * 1024

    def generation_counts(self) -> tuple[float, float]:
        """Tokens generated so far and requests cancelled so far, from /metrics."""
        return (
            self.metric("mlxcel_generation_tokens_total"),
            self.metric("mlxcel_requests_finished_total", reason="cancelled"),
        )

    def assert_cancelled_early(self, tokens: float, cancelled: float, max_tokens: int) -> None:
        """Since `generation_counts()` gave (tokens, cancelled), one request was cancelled before
        generating `max_tokens` (which it would have reached: send it with ignore_eos)."""
        self.wait_idle()
        now_tokens, now_cancelled = self.generation_counts()
        assert now_cancelled == cancelled + 1
        assert now_tokens - tokens < max_tokens

    def wait_idle(self, timeout: float = 120) -> None:
        """Wait until no sequence runs or waits; a server still busy after `timeout` fails."""
        deadline = time.monotonic() + timeout
        while self.metric("mlxcel_requests_running") or self.metric("mlxcel_requests_waiting"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"server still busy after {timeout}s")
            time.sleep(0.05)

    def workers(self) -> list[int]:
        """The pids of the server's child processes: its models' workers."""
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError):
                # The parent pid is the second field after the parenthesised command name.
                if int(stat.read_text().rpartition(")")[2].split()[1]) == self.process.pid:
                    pids.append(int(stat.parent.name))
        return pids

    def _lost_port_race(self) -> bool:
        """Whether the child exited because another process took its free port first."""
        return self.socket_path is None and "address already in use" in self.log().lower()

    def log(self) -> str:
        """What the server printed so far."""
        return self.log_path.read_text(errors="replace") if self.log_path else ""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._close_log()

    def stop_soon(self) -> None:
        """SIGTERM without waiting for the exit, for a server whose exit nothing checks (a
        module's): the next module's server starts meanwhile, and `stop_the_stopping` waits
        at the end of the session (each stop waits half a second at a low load)."""
        if self.process.poll() is None:
            self.process.terminate()
            STOPPING.append(self)
        self._close_log()

    def _close_log(self) -> None:
        if self._log is not subprocess.DEVNULL:
            self._log.close()


STOPPING: list[ServerProcess] = []
"""Servers sent SIGTERM by `stop_soon`, not yet seen to exit."""


def stop_the_stopping() -> None:
    """Wait for the servers `stop_soon` asked to exit; kill any that lingers."""
    while STOPPING:
        STOPPING.pop().stop()


def feed_fifo_until_exit(process: subprocess.Popen[bytes], fifo: Path, data: bytes) -> None:
    """Write `data` to whoever opens the FIFO a server loads as its model (the loader may open
    it more than once) until the server exits."""
    deadline = time.monotonic() + 60
    while process.poll() is None and time.monotonic() < deadline:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            time.sleep(0.05)
            continue
        with contextlib.suppress(BrokenPipeError):
            os.write(fd, data)
        os.close(fd)
        time.sleep(0.05)
    process.wait(timeout=5)
