"""What `mlxcel serve` prints and exits with when it cannot start; versions; usage on typos."""

from __future__ import annotations

import importlib.metadata
import os
import pty
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import mlxcel
from tests.server_process import MLXCEL, feed_fifo_until_exit, free_port

MLXCEL_SERVER = str(Path(MLXCEL).with_name("mlxcel-server"))
# What uvicorn or the server would print once it serves; none of it may follow a failure.
SERVING = re.compile(r"Uvicorn running|Application startup|serving |Shutting down")


def _serve(*args: str) -> tuple[int, list[str]]:
    """Run `mlxcel serve ARGS` to its end: the exit code and its output lines."""
    result = subprocess.run(
        [MLXCEL, "serve", "--threads", "1", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return result.returncode, (result.stdout + result.stderr).strip().splitlines()


def test_a_taken_port_is_one_line_and_exit_code_2_before_any_model_work() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code, lines = _serve("--port", str(port))
    assert code == 2
    assert len(lines) == 1, lines
    assert f"cannot listen on http://127.0.0.1:{port}" in lines[0]
    assert "--port" in lines[0] and "ERROR" in lines[0]


def test_a_file_that_is_no_gguf_is_one_line_and_exit_code_2(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"<html>404 Not Found</html>" * 40)
    code, lines = _serve("--port", str(free_port()), "-m", str(fake))
    assert code == 2
    assert len(lines) == 1, lines
    assert "not a GGUF file" in lines[0] and str(fake) in lines[0]


def test_a_corrupt_gguf_ends_with_its_error_and_exit_code_2(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF\x03\x00\x00\x00" + os.urandom(4096))
    code, lines = _serve("--port", str(free_port()), "-m", str(corrupt))
    assert code == 2
    assert "ERROR" in lines[-1] and "could not load" in lines[-1], lines
    assert str(corrupt) in lines[-1]
    assert not [line for line in lines if SERVING.search(line)], lines


def test_version_three_ways_from_the_package_metadata() -> None:
    expected = importlib.metadata.version("mlxcel")
    assert mlxcel.__version__ == expected
    for binary, name in ((MLXCEL, "mlxcel"), (MLXCEL_SERVER, "mlxcel-server")):
        result = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
        assert result.stdout.strip() == f"{name} {expected}"
    from_python = subprocess.run(
        [sys.executable, "-c", "import mlxcel; print(mlxcel.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert from_python.stdout.strip() == expected


def test_a_typo_in_a_serve_flag_shows_the_serve_usage() -> None:
    result = subprocess.run([MLXCEL, "serve", "--prot", "9000"], capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.startswith("usage: mlxcel serve ")
    assert "[--port PORT]" in result.stderr
    assert result.stderr.strip().endswith(
        "mlxcel serve: error: unrecognized arguments: --prot 9000"
    )


@pytest.mark.slow
def test_a_slow_load_shows_a_seconds_counter_on_a_terminal(tmp_path: Path) -> None:
    fifo = tmp_path / "slow.gguf"
    os.mkfifo(fifo)
    primary, secondary = pty.openpty()
    process = subprocess.Popen(
        [MLXCEL, "serve", "--port", str(free_port()), "-m", str(fifo), "--no-warmup"],
        stdin=subprocess.DEVNULL,
        stdout=secondary,
        stderr=secondary,
    )
    os.close(secondary)
    screen = bytearray()

    def read() -> None:
        while True:
            try:
                chunk = os.read(primary, 4096)
            except OSError:  # the terminal closes when the server exits
                return
            if not chunk:
                return
            screen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    counter = re.compile(rb"\rloading slow\.gguf\.\.\. \d+s")
    deadline = time.monotonic() + 90
    while not counter.search(bytes(screen)) and time.monotonic() < deadline:
        time.sleep(0.1)
    feed_fifo_until_exit(process, fifo, b"not a gguf file")
    reader.join(timeout=10)
    os.close(primary)
    text = bytes(screen).decode(errors="replace")
    assert counter.search(bytes(screen)), text
    assert re.search(r"loading slow\.gguf: failed after \d+\.\ds", text), text
    assert process.returncode == 2
    assert "could not load" in text.strip().splitlines()[-1]
