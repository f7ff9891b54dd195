"""Spawning and supervising a managed `mlxcel serve` child process."""

import importlib.util
import logging
import os
import shlex
import shutil
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import IO

from mlxcel.errors import (
    MlxcelError,
    ServerLaunchError,
    ServerStartupError,
    ServerTimeoutError,
)

logger = logging.getLogger(__name__)

OUTPUT_TAIL_LINES = 20
STOP_GRACE_S = 5.0
POLL_INTERVAL_S = 0.1
# Run the CLI's entry point the way its console script does, so its exit code is kept.
_MODULE_ENTRY = "import sys; from mlxcel.cli.main import main; sys.exit(main())"


def resolve_binary(binary: str | os.PathLike[str] | None) -> list[str]:
    """Return the command that runs the mlxcel CLI: binary=, $MLXCEL_BIN, PATH, this Python."""
    if binary is not None:
        return [os.fspath(binary)]
    from_env = os.environ.get("MLXCEL_BIN")
    if from_env:
        return [from_env]
    on_path = shutil.which("mlxcel")
    if on_path:
        return [on_path]
    # A venv that is not activated has the CLI importable but not on PATH.
    if importlib.util.find_spec("mlxcel.cli") is not None:
        return [sys.executable, "-c", _MODULE_ENTRY]
    raise MlxcelError(
        "cannot find the mlxcel server: pass binary=, set MLXCEL_BIN, or put mlxcel on PATH"
    )


def _option_flags(name: str, value: object) -> list[str]:
    if name == "warmup":
        return ["--no-warmup"] if value is False else []
    flag = "--" + name.replace("_", "-")
    if value is None or value is False:
        return []
    if value is True:
        return [flag]
    if isinstance(value, (list, tuple)):
        return [part for item in value for part in (flag, str(item))]
    return [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]


def server_args(
    model: str | os.PathLike[str] | None,
    *,
    socket_path: str | None,
    host: str | None,
    port: int | None,
    options: Mapping[str, object],
    own_socket_dir: bool = False,
) -> list[str]:
    """Return the `mlxcel serve` arguments; each `foo_bar=v` option becomes `--foo-bar v`.
    With `own_socket_dir`, the socket's directory is this client's to be removed by the
    server as it exits, even after this process is killed."""
    args = ["serve"]
    if model is not None:
        args += ["--model", os.fspath(model)]
    if socket_path is not None:
        args += ["--socket", socket_path]
    else:
        args += ["--host", str(host), "--port", str(port)]
    # The child's stdin is a pipe only this process writes to: when it dies, the server exits.
    args.append("--exit-on-stdin-close")
    if own_socket_dir:
        args.append("--remove-socket-dir")
    extra_args = options.get("extra_args", ())
    if isinstance(extra_args, str) or not isinstance(extra_args, Sequence):
        raise TypeError("extra_args must be a list of strings")
    for name, value in options.items():
        if name != "extra_args":
            args += _option_flags(name, value)
    return args + [str(arg) for arg in extra_args]


def free_port(host: str) -> int:
    """Return a TCP port on host that is free right now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class _OutputTail:
    """The last lines a child printed, safe to read while a thread appends."""

    def __init__(self, maxlen: int) -> None:
        self._lines: deque[str] = deque(maxlen=maxlen)
        self._lock = threading.Lock()

    def append(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)

    def snapshot(self) -> list[str]:
        with self._lock:
            return list(self._lines)


def _pump(stream: IO[str], tail: _OutputTail, pid: int) -> None:
    with stream:
        for raw in stream:
            line = raw.rstrip("\r\n")
            tail.append(line)
            logger.debug("[mlxcel serve pid=%d] %s", pid, line)


def _shutdown(
    proc: subprocess.Popen[str], reader: threading.Thread, cleanup_dir: str | None
) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            logger.warning("mlxcel server pid=%d ignored SIGTERM; killing it", proc.pid)
            proc.kill()
            proc.wait()
    if proc.stdin is not None:
        proc.stdin.close()
    # The reader ends at EOF; a grandchild still holding the pipe must not hang us.
    reader.join(timeout=1.0)
    if cleanup_dir is not None:
        shutil.rmtree(cleanup_dir, ignore_errors=True)


class ServerProcess:
    """A `mlxcel serve` child whose output is captured and which is stopped when no longer used."""

    def __init__(
        self, argv: Sequence[str], *, env: Mapping[str, str], cleanup_dir: str | None
    ) -> None:
        self.output = _OutputTail(OUTPUT_TAIL_LINES)
        try:
            # stderr joins stdout so one reader sees everything and neither pipe can fill up.
            self._proc = subprocess.Popen(
                list(argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                env=dict(env),
                text=True,
                errors="replace",
            )
        except OSError as exc:
            raise ServerLaunchError(f"cannot start the mlxcel server {argv[0]!r}: {exc}") from exc
        logger.info("started mlxcel server pid=%d: %s", self._proc.pid, shlex.join(argv))
        assert self._proc.stdout is not None
        reader = threading.Thread(
            target=_pump,
            args=(self._proc.stdout, self.output, self._proc.pid),
            name=f"mlxcel-server-{self._proc.pid}-output",
            daemon=True,
        )
        reader.start()
        # finalize also runs at interpreter exit, which covers handles that were never closed.
        self._finalizer = weakref.finalize(self, _shutdown, self._proc, reader, cleanup_dir)

    @property
    def pid(self) -> int:
        """The child's process id."""
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The child's exit code, or None while it runs."""
        return self._proc.poll()

    def exit_code(self, wait: float) -> int | None:
        """The child's exit code, waiting up to `wait` seconds for it (a connection that
        broke may be the child dying); None if it still runs."""
        try:
            return self._proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            return None

    def wait_ready(self, probe: Callable[[], bool], timeout: float) -> None:
        """Poll probe until it succeeds; raise if the child exits or timeout passes first."""
        deadline = time.monotonic() + timeout
        while True:
            returncode = self._proc.poll()
            if returncode is not None:
                self.stop()
                raise ServerStartupError(returncode, self.output.snapshot())
            if probe():
                logger.info("mlxcel server pid=%d is ready", self._proc.pid)
                return
            if time.monotonic() >= deadline:
                self.stop()
                raise ServerTimeoutError(timeout, self.output.snapshot())
            time.sleep(POLL_INTERVAL_S)

    def stop(self) -> None:
        """Stop the child (SIGTERM, then SIGKILL after a grace period); safe to call twice."""
        self._finalizer()
