"""A cold burst on one system prompt: mlxcel against llama-server on the same GGUF, in one run.

    python bench/shared_burst.py [--model PATH.gguf|coder] [--clients 4] [--prompt-words 1500]
                                 [--rounds 2]

`--clients` requests arrive at once on a freshly started server, each the same long system
prompt and its own question (an agent's first turn fanned out, a team sharing one assistant);
each server has one slot a client and every usable core (`-t`, `-tb`). mlxcel evaluates the
shared prefix once: the other requests wait for it and copy its slot (engine/sharing.py).
llama-server evaluates it in every slot. Fresh servers each round, the first of each round
alternating; every round is printed with the load, then the medians' ratios of the median
and the longest TTFT, and how many of the prompts' tokens mlxcel took from a cache.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coder_model import coder_gguf
from llama_server import build_llama_server
from replicas import default_model, stop
from serve import Sample, run_level
from servers import _free_port, _start

from mlxcel.config.cores import usable_cores

SERVERS = ("llama-server", "mlxcel")


def prompts(args: argparse.Namespace) -> list[str]:
    rng = random.Random(args.seed)
    words = ["rule", "item", "desk", "file", "note", "case", "form", "list", "page", "part"]
    system = "You file things. " + " ".join(rng.choice(words) for _ in range(args.prompt_words))
    return [f"{system}\nQuestion {n}: where is item {n}?" for n in range(args.clients)]


def command(name: str, model: Path, args: argparse.Namespace, port: int) -> list[str]:
    threads = str(usable_cores())
    flags = ["-m", str(model), "-t", threads, "-tb", threads, "-np", str(args.clients)]
    flags += ["-c", str(4096 * args.clients), "--port", str(port)]
    if name == "llama-server":
        return [str(build_llama_server()), *flags]
    return [str(Path(sys.executable).parent / "mlxcel"), "serve", "--log-level", "warning", *flags]


def burst(name: str, model: Path, args: argparse.Namespace) -> list[Sample]:
    port = _free_port()
    process = _start(command(name, model, args, port), port, "/health")
    try:
        base = f"http://127.0.0.1:{port}/v1"
        samples, _ = asyncio.run(run_level(base, "default", prompts(args), args.clients, 8, True))
        return samples
    finally:
        stop(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    add("--model", help="a GGUF, or coder (default: the embedded default model)")
    add("--clients", type=int, default=4)
    add("--prompt-words", type=int, default=1500)
    add("--rounds", type=int, default=2)
    add("--seed", type=int, default=7)
    args = parser.parse_args()
    model = coder_gguf() if args.model == "coder" else Path(args.model or default_model())
    medians: dict[str, list[float]] = {name: [] for name in SERVERS}
    longest: dict[str, list[float]] = {name: [] for name in SERVERS}
    for round_ in range(1, args.rounds + 1):
        order = SERVERS if round_ % 2 else SERVERS[::-1]
        for name in order:
            samples = burst(name, model, args)
            ttfts = [s.ttft * 1000 for s in samples]
            medians[name].append(statistics.median(ttfts))
            longest[name].append(max(ttfts))
            cached = sum(s.cached_tokens for s in samples)
            total = sum(s.prompt_tokens for s in samples)
            print(
                f"round {round_} {name:>12}: TTFT median {medians[name][-1]:.0f} ms, longest "
                f"{longest[name][-1]:.0f} ms; cached {cached} of {total} prompt tokens; "
                f"load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    ours, theirs = (statistics.median(medians[n]) for n in ("mlxcel", "llama-server"))
    print(f"{args.clients} clients at once on one {args.prompt_words}-word system prompt:")
    print(
        f"  median TTFT, llama-server/mlxcel: {theirs / ours:.2f}x ({theirs:.0f} / {ours:.0f} ms)"
    )
    ours, theirs = (statistics.median(longest[n]) for n in ("mlxcel", "llama-server"))
    print(
        f"  longest TTFT, llama-server/mlxcel: {theirs / ours:.2f}x ({theirs:.0f} / {ours:.0f} ms)"
    )


if __name__ == "__main__":
    main()
