"""Start the real `mlxcel serve` in a child process and wait until /health says ok."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai

MLXCEL = str(Path(sys.executable).parent / "mlxcel")


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProcess:
    """One `mlxcel serve` child on a free port or a Unix socket."""

    def __init__(
        self,
        *args: str,
        socket_path: Path | None = None,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.port = free_port()
        self.socket_path = socket_path
        where = ["--socket", str(socket_path)] if socket_path else ["--port", str(self.port)]
        self.command = [MLXCEL, "serve", *where, "--threads", "1", *args]
        self.log_path = log_path
        self._log = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(
            self.command,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
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

    def wait_ready(self, timeout: float = 120) -> None:
        """Poll /health until 200; fail with the log if the child dies first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}: {self.log()}")
            try:
                with self.http() as client:
                    if client.get("/health").status_code == 200:
                        return
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready after {timeout}s: {self.log()}")

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
        if self._log is not subprocess.DEVNULL:
            self._log.close()
