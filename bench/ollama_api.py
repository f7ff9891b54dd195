"""What Ollama's API costs over OpenAI's on the same server: /api/chat against
/v1/chat/completions, both streamed, on one mlxcel server and model.

    python bench/ollama_api.py [--model PATH.gguf] [--rounds 3] [--requests 4] [--max-tokens 64]
    python bench/compare.py --ollama [...]          (the same, from the comparison script)

Each round sends `--requests` greedy chats one at a time through each route, the route going
first alternating by round, so the machine's load falls on both alike. Both routes run the
same prompt through the same chat path, so they generate the same tokens; per request the time
to the first text and the decode rate after it (tokens from the route's own counters) are
taken, and the medians over every request are printed with their ratio, Ollama over OpenAI
(decode: higher is better; TTFT: lower is better).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from servers import _free_port, _start

from mlxcel.weights import default_model_path

PROMPT = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
Timing = tuple[float, float]
"""Seconds to the first text, and tokens a second after it."""


def _timed(lines: Iterator[str], text_of: Callable[[dict], str]) -> tuple[float, float]:
    """When the first and last text came, reading `lines` as they arrive."""
    first = last = 0.0
    for chunk in lines:
        if not chunk.strip():
            continue
        text = text_of(json.loads(chunk))
        if text:
            last = time.perf_counter()
            first = first or last
    return first, last


def openai_chat(http: httpx.Client, tokens: int) -> Timing:
    """One streamed /v1/chat/completions request."""
    body = {
        "model": "default",
        "messages": PROMPT,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    counted = [0]

    def text_of(event: dict) -> str:
        if event.get("usage"):
            counted[0] = event["usage"]["completion_tokens"]
        choices = event.get("choices") or [{}]
        return str(choices[0].get("delta", {}).get("content") or "")

    start = time.perf_counter()
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        data = (line[6:] for line in response.iter_lines() if line.startswith("data: "))
        first, last = _timed((line for line in data if line != "[DONE]"), text_of)
    return first - start, (counted[0] - 1) / (last - first)


def ollama_chat(http: httpx.Client, tokens: int) -> Timing:
    """One streamed /api/chat request."""
    body = {
        "model": "default",
        "messages": PROMPT,
        "options": {"num_predict": tokens, "temperature": 0},
    }
    counted = [0]

    def text_of(line: dict) -> str:
        if line.get("done"):
            counted[0] = line["eval_count"]
        return str(line.get("message", {}).get("content") or "")

    start = time.perf_counter()
    with http.stream("POST", "/api/chat", json=body) as response:
        response.raise_for_status()
        first, last = _timed(response.iter_lines(), text_of)
    return first - start, (counted[0] - 1) / (last - first)


ROUTES = {"openai": openai_chat, "ollama": ollama_chat}


def measure(port: int, rounds: int, requests: int, tokens: int) -> dict[str, list[Timing]]:
    """Every request's timings, by route, rounds interleaved."""
    runs: dict[str, list[Timing]] = {name: [] for name in ROUTES}
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600) as http:
        openai_chat(http, 8)  # warm up: the prompt's prefix cached for both alike
        for round_ in range(rounds):
            order = list(ROUTES) if round_ % 2 == 0 else list(reversed(ROUTES))
            for name in order:
                runs[name] += [ROUTES[name](http, tokens) for _ in range(requests)]
    return runs


def report(runs: dict[str, list[Timing]]) -> None:
    """The medians per route and Ollama's ratios over OpenAI."""
    medians = {
        name: (statistics.median(t for t, _ in got), statistics.median(r for _, r in got))
        for name, got in runs.items()
    }
    for name, (ttft, rate) in medians.items():
        print(f"{name:>7}: TTFT {ttft * 1000:7.1f} ms   decode {rate:7.1f} tok/s", flush=True)
    (o_ttft, o_rate), (a_ttft, a_rate) = medians["ollama"], medians["openai"]
    print(
        f"ollama/openai: decode {o_rate / a_rate:.3f}x (higher is better), "
        f"TTFT {o_ttft / a_ttft:.3f}x (lower is better)",
        flush=True,
    )


def ollama_ratio(model: Path, rounds: int, requests: int, tokens: int, threads: int | None) -> None:
    """Start mlxcel on `model`, measure both routes, print the ratio."""
    port = _free_port()
    flags = ["--threads", str(threads)] if threads else []
    command = [str(Path(sys.executable).parent / "mlxcel"), "serve", "-m", str(model)]
    process = _start([*command, "--port", str(port), "--ctx-size", "2048", *flags], port, "/health")
    try:
        report(measure(port, rounds, requests, tokens))
    finally:
        process.terminate()
        process.wait(timeout=60)


def main() -> None:
    """Parse the flags and measure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=None, help="GGUF (default: SmolLM2)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=4, help="per route per round")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    model = args.model or default_model_path()
    ollama_ratio(model, args.rounds, args.requests, args.max_tokens, args.threads)


if __name__ == "__main__":
    main()
