"""One GGUF model split across two processes by llama.cpp's RPC backend, against the model in
one process: single-stream prefill and decode tokens/s, and eight clients' aggregate decode.

    sudo python bench/rpc.py [--tokens 64] [--rounds 3] [--threads 1]

Four set-ups of the default model (SmolLM2-135M), measured in one run, one after the other:
in one process; split (-ngl 16: its last 15 layers and the output layer on `mlxcel rpc-server`)
over loopback; over a veth pair between two network namespaces this script creates (the link two
machines would have, less the wire); and over the keyed channel (TLS and the key) on that link.
It prints each set-up's figures and the ratios the issue sets targets for: the keyed channel
against the plain link (at least 0.9x), the veth split against one process for decode (at least
0.6x). Needs root, for the namespaces. Absolute figures move with the machine's load; compare
the ratios of one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.netns import Pair, RpcServer, namespace_pair  # noqa: E402
from tests.server_process import MLXCEL, ServerProcess  # noqa: E402

from mlxcel.weights import default_model_path  # noqa: E402

SPLIT = ("--n-gpu-layers", "16")
CLIENTS = 8
GGML_PORT, CHANNEL_PORT = 50062, 50063
# About 200 tokens of prompt; each request gets a fresh first word, so no prefix is cached.
TEXT = "The history of the printing press begins with movable type. " * 16

Setup = Callable[[ExitStack, Path], ServerProcess]


def _server(
    folder: Path, name: str, threads: int, *args: str, ns: str | None = None
) -> ServerProcess:
    server = ServerProcess(
        "-m",
        str(default_model_path()),
        "--no-warmup",
        "--parallel",
        str(CLIENTS),
        "--threads",
        str(threads),
        *args,
        socket_path=folder / f"{name}.sock",
        log_path=folder / f"{name}.log",
        prefix=("ip", "netns", "exec", ns) if ns else (),
    )
    server.wait_ready(timeout=300)
    return server


def _completion(server: ServerProcess, n: int, tokens: int) -> dict[str, float]:
    with server.http() as http:
        reply = http.post(
            "/completion",
            json={
                "prompt": f"{n} {TEXT}",
                "n_predict": tokens,
                "ignore_eos": True,
                "temperature": 0,
            },
        )
    reply.raise_for_status()
    timings: dict[str, float] = reply.json()["timings"]
    return timings


def measure(server: ServerProcess, tokens: int, rounds: int) -> dict[str, float]:
    """Median single-stream prefill and decode tokens/s, and the eight clients' aggregate."""
    _completion(server, -1, 4)  # the first request pays for the first graph
    single = [_completion(server, n, tokens) for n in range(rounds)]
    aggregate = []
    for r in range(rounds):
        started = time.perf_counter()
        with ThreadPoolExecutor(CLIENTS) as pool:
            done = list(
                pool.map(lambda n: _completion(server, n, tokens), range(r * 100, r * 100 + 8))
            )
        wall = time.perf_counter() - started
        aggregate.append(sum(t["predicted_n"] for t in done) / wall)
    return {
        "prefill": statistics.median(t["prompt_per_second"] for t in single),
        "decode": statistics.median(t["predicted_per_second"] for t in single),
        "aggregate": statistics.median(aggregate),
    }


@contextmanager
def setups(folder: Path, threads: int) -> Iterator[dict[str, Setup]]:
    """How each set-up starts, on a namespace pair that lasts the run."""
    with namespace_pair("mlxc43-b", os.getpid() % 10000, "10.213.44") as pair:
        yield _setups(folder, threads, pair)


def _setups(folder: Path, threads: int, pair: Pair) -> dict[str, Setup]:
    key = folder / "rpc.key"
    subprocess.run([MLXCEL, "rpc-server", "--new-key", str(key)], check=True, capture_output=True)

    def rpc(stack: ExitStack, name: str, ns: str | None, *args: str) -> None:
        server = RpcServer(folder / f"{name}-rpc.log", ns, "--threads", str(threads), *args)
        stack.callback(server.kill)

    def one(stack: ExitStack, folder: Path) -> ServerProcess:
        return _server(folder, "one", threads)

    def loopback(stack: ExitStack, folder: Path) -> ServerProcess:
        rpc(stack, "loopback", None, "--port", str(GGML_PORT))
        return _server(folder, "loopback", threads, "--rpc", f"127.0.0.1:{GGML_PORT}", *SPLIT)

    def veth(stack: ExitStack, folder: Path) -> ServerProcess:
        rpc(stack, "veth", pair.rpc_ns, "--host", pair.rpc_addr, "--port", str(GGML_PORT))
        rpc_flag = ("--rpc", f"{pair.rpc_addr}:{GGML_PORT}")
        return _server(folder, "veth", threads, *rpc_flag, *SPLIT, ns=pair.serve_ns)

    def keyed(stack: ExitStack, folder: Path) -> ServerProcess:
        listen = f"{pair.rpc_addr}:{CHANNEL_PORT}"
        channel = ("--port", str(GGML_PORT), "--listen", listen, "--key-file", str(key))
        rpc(stack, "keyed", pair.rpc_ns, *channel)
        rpc_flag = ("--rpc", f"mlxcel://{listen}", "--rpc-key-file", str(key))
        return _server(folder, "keyed", threads, *rpc_flag, *SPLIT, ns=pair.serve_ns)

    return {"one process": one, "loopback": loopback, "veth": veth, "keyed channel": keyed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=64, help="tokens per answer")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="each process's threads")
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp, setups(Path(tmp), args.threads) as starts:
        for name, start in starts.items():
            with ExitStack() as stack:
                server = start(stack, Path(tmp))
                stack.callback(server.stop)
                results[name] = measure(server, args.tokens, args.rounds)
            figures = results[name]
            print(
                f"{name:>14}: prefill {figures['prefill']:8.1f} tok/s  decode "
                f"{figures['decode']:7.1f} tok/s  {CLIENTS} clients {figures['aggregate']:7.1f} "
                "tok/s",
                flush=True,
            )
    print()
    for top, bottom, target in (
        ("keyed channel", "veth", 0.9),
        ("veth", "one process", 0.6),
        ("loopback", "one process", None),
    ):
        ratios = "  ".join(
            f"{what} {results[top][what] / results[bottom][what]:.2f}x"
            for what in ("prefill", "decode", "aggregate")
        )
        aim = f" (target for decode: at least {target}x)" if target else ""
        print(f"{top} / {bottom}: {ratios}{aim}")


if __name__ == "__main__":
    main()
