"""Load generator for any OpenAI-compatible server: TTFT, ITL, TPOT and throughput.

    python bench/serve.py --base-url http://127.0.0.1:8080/v1 --concurrency 1,2,4,8

Streams /v1/completions with prompts of a given token length (random words, or one fixed
prompt), `--num-prompts` per concurrency level, and reports median and p90 of time to first
token, inter-token latency and time per output token, plus aggregate output tokens/s, as vLLM's
`bench serve` does. Writes a CSV and, with matplotlib installed, a PNG plot.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

WORDS = ["time", "person", "year", "way", "day", "thing", "man", "world", "life", "hand"]


@dataclass
class Sample:
    """One request's timings."""

    ttft: float
    itls: list[float] = field(default_factory=list)
    tokens: int = 0
    latency: float = 0.0
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    """From the usage, where asked for (`usage=True`)."""


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) of values, 0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def make_prompts(count: int, words: int, fixed: bool, seed: int) -> list[str]:
    """Prompts of about `words` tokens each (one word is about one token for these words)."""
    rng = random.Random(seed)
    if fixed:
        return [" ".join(WORDS[i % len(WORDS)] for i in range(words))] * count
    return [" ".join(rng.choice(WORDS) for _ in range(words)) for _ in range(count)]


async def one_request(
    client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int, usage: bool = False
) -> Sample:
    """Stream one completion, timing each chunk that carries text; `usage`: ask for the
    usage too and keep its prompt and cached tokens."""
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        # Every token up to max_tokens, so decode rates compare: ignore_eos for mlxcel, vLLM
        # and llama-server; llama_cpp.server reads only min_tokens.
        "ignore_eos": True,
        "min_tokens": max_tokens,
        **({"stream_options": {"include_usage": True}} if usage else {}),
    }
    start = time.perf_counter()
    sample: Sample | None = None
    finish_reason = None
    counted: dict[str, Any] = {}
    last = start
    async with client.stream("POST", "/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            counted = chunk.get("usage") or counted
            if not chunk.get("choices"):
                continue
            finish_reason = chunk["choices"][0].get("finish_reason") or finish_reason
            if not chunk["choices"][0].get("text"):
                continue
            now = time.perf_counter()
            if sample is None:
                sample = Sample(ttft=now - start)
            else:
                sample.itls.append(now - last)
            sample.tokens += 1
            last = now
    if sample is None:
        raise RuntimeError("the server streamed no text")
    sample.latency = last - start
    sample.finish_reason = finish_reason
    sample.prompt_tokens = int(counted.get("prompt_tokens") or 0)
    sample.cached_tokens = int(
        (counted.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    )
    return sample


async def run_level(
    base_url: str,
    model: str,
    prompts: list[str],
    concurrency: int,
    max_tokens: int,
    usage: bool = False,
) -> tuple[list[Sample], float]:
    """Send every prompt with at most `concurrency` in flight; samples and wall time."""
    limit = asyncio.Semaphore(concurrency)
    timeout = httpx.Timeout(600.0)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout) as client:

        async def bounded(prompt: str) -> Sample:
            async with limit:
                try:
                    return await one_request(client, model, prompt, max_tokens, usage)
                except httpx.RemoteProtocolError:
                    # A kept-alive connection the server had just closed: ask on a new one.
                    return await one_request(client, model, prompt, max_tokens, usage)

        start = time.perf_counter()
        samples = await asyncio.gather(*(bounded(p) for p in prompts))
        return list(samples), time.perf_counter() - start


def summarize(concurrency: int, samples: list[Sample], wall: float) -> dict[str, float]:
    """Median and p90 of each latency, and aggregate throughput."""
    ttfts = [s.ttft for s in samples]
    itls = [i for s in samples for i in s.itls]
    tpots = [(s.latency - s.ttft) / (s.tokens - 1) for s in samples if s.tokens > 1]
    tokens = sum(s.tokens for s in samples)
    return {
        "concurrency": concurrency,
        "requests": len(samples),
        "output_tokens": tokens,
        "throughput_tok_s": tokens / wall,
        "ttft_median_ms": statistics.median(ttfts) * 1000,
        "ttft_p90_ms": percentile(ttfts, 90) * 1000,
        "itl_median_ms": (statistics.median(itls) if itls else 0) * 1000,
        "itl_p90_ms": percentile(itls, 90) * 1000,
        "tpot_median_ms": (statistics.median(tpots) if tpots else 0) * 1000,
        "tpot_p90_ms": percentile(tpots, 90) * 1000,
        # Requests that ended before max_tokens (an end-of-generation token the server let
        # through): their decode rate is not comparable.
        "stopped_early": sum(s.finish_reason != "length" for s in samples),
    }


def benchmark(args: argparse.Namespace) -> list[dict[str, float]]:
    """Every concurrency level, one after another."""
    rows = []
    for concurrency in args.concurrency:
        prompts = make_prompts(args.num_prompts, args.prompt_tokens, args.fixed_prompt, args.seed)
        samples, wall = asyncio.run(
            run_level(args.base_url, args.model, prompts, concurrency, args.max_tokens)
        )
        row = summarize(concurrency, samples, wall)
        rows.append(row)
        print(
            f"concurrency {concurrency}: {row['throughput_tok_s']:.1f} tok/s, "
            f"TTFT median {row['ttft_median_ms']:.0f} ms p90 {row['ttft_p90_ms']:.0f} ms, "
            f"ITL median {row['itl_median_ms']:.1f} ms, TPOT median {row['tpot_median_ms']:.1f} ms"
        )
    return rows


def write_outputs(rows: list[dict[str, float]], out: Path, label: str) -> None:
    """CSV always; a PNG of throughput and TTFT against concurrency when matplotlib exists."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{label}.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    levels = [r["concurrency"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(levels, [r["throughput_tok_s"] for r in rows], marker="o")
    left.set(xlabel="concurrency", ylabel="output tokens/s", title=f"{label}: throughput")
    right.plot(levels, [r["ttft_median_ms"] for r in rows], marker="o", label="median")
    right.plot(levels, [r["ttft_p90_ms"] for r in rows], marker="x", label="p90")
    right.set(xlabel="concurrency", ylabel="ms", title=f"{label}: time to first token")
    right.legend()
    fig.tight_layout()
    fig.savefig(out / f"{label}.png")
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line options."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    parser.add_argument("--model", default="default")
    parser.add_argument(
        "--concurrency",
        default=[1, 2, 4, 8],
        type=lambda s: [int(x) for x in s.split(",")],
        help="comma-separated levels",
    )
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--fixed-prompt", action="store_true", help="the same prompt every time")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("bench/results"))
    parser.add_argument("--label", default="serve")
    return parser.parse_args(argv)


def main() -> None:
    """Run the benchmark and write its outputs."""
    args = parse_args()
    rows = benchmark(args)
    write_outputs(rows, args.out, args.label)


if __name__ == "__main__":
    main()
