"""LoRA adapters on llama.cpp: what an adapter costs a decode, what mixing adapter sets costs a
batch, and loading an adapter at run time against reloading the model.

    python bench/lora.py [--threads N] [--tokens 96] [--rounds 2]

One server on the default model (8 slots) with two random adapters over every layer's q, v
and down projections (bench/lora_adapters.py). Reports:
- decode tokens/s of one client with an adapter and without (the server's own timings), and
  their ratio;
- output tokens/s of 8 clients on one adapter against 8 over two (4 each): llama.cpp applies
  one adapter set to a whole decode, so two sets take turns (engine/adapters.py);
- the time POST /v1/load_lora_adapter takes against POST /models/unload + /models/load (the
  target: at least 10x less).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from lora_adapters import gguf_adapter

from mlxcel.weights import default_model_path

PROMPT = "Write a long story about a lighthouse keeper and the sea. " * 4


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(args: list[str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _port()
    command = [sys.executable, "-m", "mlxcel.cli", "serve", "--port", str(port), *args]
    process = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    root = f"http://127.0.0.1:{port}"
    for _ in range(600):
        try:
            if httpx.get(f"{root}/health", timeout=1).status_code == 200:
                return process, root
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise SystemExit(f"the server did not start; see {log}")


def _decode(http: httpx.Client, tokens: int, **body: Any) -> dict[str, Any]:
    request = {"prompt": PROMPT, "n_predict": tokens, "temperature": 0, "ignore_eos": True}
    response = http.post("/completion", json={**request, **body})
    response.raise_for_status()
    answer: dict[str, Any] = response.json()
    return answer


def _wave(root: str, tokens: int, lora: list[list[dict[str, Any]]]) -> float:
    """Output tokens/s of one request per entry of `lora`, all at once."""

    def one(choice: list[dict[str, Any]]) -> int:
        with httpx.Client(base_url=root, timeout=600) as http:
            return int(_decode(http, tokens, lora=choice, cache_prompt=False)["tokens_predicted"])

    start = time.perf_counter()
    with ThreadPoolExecutor(len(lora)) as pool:
        produced = sum(pool.map(one, lora))
    return produced / (time.perf_counter() - start)


def _timed(http: httpx.Client, *calls: tuple[str, dict[str, Any]]) -> float:
    start = time.perf_counter()
    for path, body in calls:
        http.post(path, json=body).raise_for_status()
    return time.perf_counter() - start


def main() -> None:
    """Run the three measurements and print them with their ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="mlxcel-lora-"))
    model = default_model_path()
    one, two = (gguf_adapter(model, folder / f"{n}.gguf", seed=i) for i, n in enumerate("ab"))
    flags = ["--threads", str(args.threads), "--parallel", "8", "--ctx-size", "8192"]
    process, root = _start([*flags, "--lora", str(one), "--lora", str(two)], folder / "log")
    try:
        with httpx.Client(base_url=root, timeout=600) as http:
            name = http.get("/v1/models").json()["data"][0]["id"]
            _decode(http, 8, lora=[])  # warm
            base, adapted = [], []
            for _ in range(args.rounds):
                base.append(_decode(http, args.tokens, lora=[])["timings"]["predicted_per_second"])
                with_a = _decode(http, args.tokens, lora=[{"id": 0, "scale": 1.0}])
                adapted.append(with_a["timings"]["predicted_per_second"])
            b, a = statistics.median(base), statistics.median(adapted)
            print(
                f"decode, 1 client: base {b:.1f} tok/s, with an adapter {a:.1f} tok/s, "
                f"ratio {a / b:.2f}"
            )
            first = [{"id": 0, "scale": 1.0}]
            second = [{"id": 1, "scale": 1.0}]
            same = [_wave(root, args.tokens, [first] * 8) for _ in range(args.rounds)]
            mixed = [_wave(root, args.tokens, [first, second] * 4) for _ in range(args.rounds)]
            s, m = statistics.median(same), statistics.median(mixed)
            print(
                f"8 clients: one adapter {s:.1f} tok/s, two adapters (4+4) {m:.1f} tok/s, "
                f"ratio {m / s:.2f}"
            )
            loads, reloads = [], []
            for i in range(args.rounds):
                body = {"lora_name": f"again{i}", "lora_path": str(one)}
                loads.append(_timed(http, ("/v1/load_lora_adapter", body)))
                http.post("/v1/unload_lora_adapter", json={"lora_name": f"again{i}"})
                reloads.append(
                    _timed(
                        http, ("/models/unload", {"model": name}), ("/models/load", {"model": name})
                    )
                )
            lo, re_ = statistics.median(loads), statistics.median(reloads)
            print(
                f"adapter at run time {lo * 1e3:.0f} ms, model reload {re_ * 1e3:.0f} ms, "
                f"{re_ / lo:.0f}x less (target: at least 10x)"
            )
    finally:
        process.terminate()
        process.wait(timeout=60)


if __name__ == "__main__":
    main()
