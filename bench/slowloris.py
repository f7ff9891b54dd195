"""Normal requests while a slow-loris attack holds thousands of connections to `mlxcel serve`.

    python bench/slowloris.py [--connections 3000] [--requests 20]

Starts the server on the embedded default model, measures normal requests (each on a new
connection: GET /health and a chat completion of 8 tokens), then opens `--connections`
connections that trickle a request head one header line every few seconds (a slow-loris) and
measures the same requests while they are held open. Prints each as a median and a worst time,
with how many attacking connections the server had closed by the end (the connection cap closes
the longest-waiting ones to make room; the header timeout closes the rest).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.server_process import ServerProcess

CHAT = {"messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 8, "ignore_eos": True}


async def _timed(base: str, requests: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"health": [], "chat": [], "failed": []}
    for _ in range(requests):
        for name in ("health", "chat"):
            # A fresh connection each time: the attack is on accepting and reading heads.
            async with httpx.AsyncClient(base_url=base, timeout=60) as client:
                start = time.perf_counter()
                try:
                    if name == "health":
                        response = await client.get("/health")
                    else:
                        response = await client.post("/v1/chat/completions", json=CHAT)
                    ok = response.status_code == 200
                except httpx.HTTPError:
                    ok = False
                times[name if ok else "failed"].append(time.perf_counter() - start)
    return times


async def _loris(port: int, closed: list[int], stop: asyncio.Event) -> None:
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        closed.append(1)
        return
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    try:
        line = 0
        while not stop.is_set():
            await writer.drain()
            try:
                await asyncio.wait_for(reader.read(1), timeout=3)
            except asyncio.TimeoutError:
                line += 1
                writer.write(f"X-Slow-{line}: 1\r\n".encode())
                continue
            closed.append(1)
            return
    except OSError:
        closed.append(1)
    finally:
        writer.close()


def _report(label: str, times: dict[str, list[float]]) -> None:
    for name in ("health", "chat"):
        values = times[name]
        if values:
            print(
                f"{label:>22} {name:>6}: median {statistics.median(values) * 1000:7.1f} ms, "
                f"worst {max(values) * 1000:7.1f} ms ({len(values)} answered)"
            )
    print(f"{label:>22} failed: {len(times['failed'])}")


async def _run(server: ServerProcess, connections: int, requests: int) -> None:
    base = server.root
    _report("baseline", await _timed(base, requests))
    closed: list[int] = []
    stop = asyncio.Event()
    attackers = [
        asyncio.ensure_future(_loris(server.port, closed, stop)) for _ in range(connections)
    ]
    await asyncio.sleep(2)
    _report(f"{connections} slow conns", await _timed(base, requests))
    print(f"attacking connections the server closed: {len(closed)} of {connections}")
    stop.set()
    await asyncio.gather(*attackers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=3000)
    parser.add_argument("--requests", type=int, default=20)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        server = ServerProcess("--ctx-size", "1024", log_path=Path(tmp) / "server.log")
        try:
            server.wait_ready()
            asyncio.run(_run(server, args.connections, args.requests))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
