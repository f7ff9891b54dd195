"""The servers bench/compare.py measures: how each starts, and what one run of load costs it.

Beside bench/serve.py's latencies, each measurement reads two figures the machine's load does
not move much: the CPU seconds of the server's busiest thread (its engine thread: llama-server's
main loop, mlxcel's engine thread in the model's worker) from /proc's schedstat, and the number
of engine steps the load took (llama-server's `n_decode_total`, mlxcel's
`mlxcel_decode_steps_total`), with the sequences per step.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_server import build_llama_server
from serve import make_prompts, run_level, summarize

# Each server's /metrics samples for engine steps and for sequences per step, where it has them.
STEP_SAMPLES = {
    "llama-server": ("llamacpp:n_decode_total", "llamacpp:n_busy_slots_per_decode"),
    "mlxcel": ("mlxcel_decode_steps_total", "mlxcel_busy_slots_per_decode"),
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(
    command: list[str], port: int, health: str, src: Path | None = None
) -> subprocess.Popen[bytes]:
    """Start a server (mlxcel imported from `src` when given) and wait for `health`."""
    env = {**os.environ, "PYTHONPATH": str(src)} if src is not None else None
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{command[0]} exited early: {' '.join(command)}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}{health}", timeout=2).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    process.kill()
    raise TimeoutError(" ".join(command))


def command(name: str, path: Path, threads: int | None) -> tuple[list[str], str]:
    """The command line that serves `path` with `threads` threads (None: the server's own
    default), 8 slots and 4,096 tokens of context each (ending with its port flag), and the
    route that answers once it is up."""
    if name == "llama-server":
        line = [str(build_llama_server()), "-m", str(path), "-np", "8", "-c", str(8 * 4096)]
        line += _thread_flags("-t", "-tb", threads)
        return [*line, "--metrics", "--port"], "/health"
    if name == "llama_cpp.server":
        line = [sys.executable, "-m", "llama_cpp.server", "--model", str(path), "--n_ctx", "4096"]
        line += _thread_flags("--n_threads", "--n_threads_batch", threads)
        # By default a new request interrupts the running one; queue them instead.
        return [*line, "--interrupt_requests", "False", "--port"], "/v1/models"
    mlxcel = Path(sys.executable).parent / "mlxcel"
    line = [str(mlxcel), "serve", "-m", str(path), "-np", "8", "-c", str(8 * 4096)]
    line += _thread_flags("--threads", "--threads-batch", threads)
    return [*line, "--log-level", "warning", "--port"], "/health"


def _thread_flags(generation: str, batch: str, threads: int | None) -> list[str]:
    """A server's two thread flags at `threads` each, or none for its own default."""
    return [] if threads is None else [generation, str(threads), batch, str(threads)]


@dataclass
class Measured:
    """One server's figures at each concurrency level, and at the last level: its busiest
    thread's CPU seconds, its engine steps and sequences per step (0 where it does not say),
    and the machine's 1-minute load average after it."""

    levels: dict[int, dict]
    engine_cpu_s: float
    steps: float
    busy_per_step: float
    load: float
    extra: tuple[float, float] | None = None
    """What `measure`'s `extra` returned."""


def _thread_cpu(pid: int) -> dict[tuple[int, str], float]:
    """CPU seconds of every thread of `pid` and of its children (schedstat's first field)."""
    pids = [pid]
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and int(_stat(entry)[1]) == pid:
                pids.append(int(entry))
        except OSError:
            continue
    times = {}
    for p in pids:
        for tid in os.listdir(f"/proc/{p}/task"):
            try:
                with open(f"/proc/{p}/task/{tid}/schedstat") as handle:
                    times[(p, tid)] = int(handle.read().split()[0]) / 1e9
            except OSError:
                continue
    return times


def _stat(pid: str) -> list[str]:
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()


def _samples(port: int, names: tuple[str, ...]) -> list[float]:
    page = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    found = dict.fromkeys(names, 0.0)
    for line in page.splitlines():
        series, _, value = line.rpartition(" ")
        name = series.partition("{")[0]
        if name in found:
            found[name] += float(value)
    return [found[name] for name in names]


def measure(
    name: str,
    path: Path,
    levels: list[int],
    prompt_tokens: int,
    max_tokens: int,
    threads: int | None,
    extra: Callable[[str], tuple[float, float]] | None = None,
) -> Measured:
    """Start the server, run bench/serve.py's load at each level (2 requests per client),
    then `extra` with its base URL if given, then stop it."""
    line, health = command(name, path, threads)
    port = _free_port()
    process = _start([*line, str(port)], port, health)
    base = f"http://127.0.0.1:{port}/v1"
    steps_names = STEP_SAMPLES.get(name)
    try:
        results, cpu, steps, busy = {}, 0.0, 0.0, 0.0
        for level in levels:
            before_cpu = _thread_cpu(process.pid)
            before = _samples(port, steps_names) if steps_names else [0.0, 0.0]
            prompts = make_prompts(level * 2, prompt_tokens, False, level)
            samples, wall = asyncio.run(run_level(base, "default", prompts, level, max_tokens))
            results[level] = summarize(level, samples, wall)
            after_cpu = _thread_cpu(process.pid)
            cpu = max(after_cpu[k] - before_cpu.get(k, 0.0) for k in after_cpu)
            after = _samples(port, steps_names) if steps_names else [0.0, 0.0]
            # Both servers' gauge is the mean since the start: this level's mean from two.
            steps = after[0] - before[0]
            busy = (after[0] * after[1] - before[0] * before[1]) / steps if steps else 0.0
        load = os.getloadavg()[0]
        more = extra(base) if extra is not None else None
        return Measured(results, cpu, steps, busy, load, more)
    finally:
        process.terminate()
        process.wait()
