"""Speculative decoding against plain decoding, single stream, copy-heavy input.

    python bench/speculative.py [--model PATH.gguf] [--draft PATH.gguf | --no-draft]
                                [--runs 3] [--size-n 12] [--threads 1]

Three `mlxcel serve` on the same GGUF: plain, with `--spec-type ngram-simple` (prompt lookup)
and with `-md` (a draft model; by default the model itself, whose greedy drafts the model
always takes: an upper bound on acceptance, at a draft that costs what the model does), all up
at once and asked in turn (A, B, C, A, B, C, ...) so the machine's load falls on each alike.
The request asks to repeat a long code block with one change, greedy, a fixed number of
tokens. Every run's decode rate (`timings.predicted_per_second`), acceptance and the load
average is printed, then each ratio of the medians against the target (>= 1.5x).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import _free_port, _start

CODE = "\n".join(
    f"def scale_{i}(values, factor):\n"
    f"    # Multiply every value by the factor, then add {i}.\n"
    f"    return [value * factor + {i} for value in values]\n"
    for i in range(10)
)
PROMPT = (
    "Repeat this Python code exactly, but rename the function scale_3 to resize_3. "
    f"Change nothing else.\n\n```python\n{CODE}```"
)


def serve(path: Path, threads: int, extra: list[str]) -> tuple[str, subprocess.Popen[bytes]]:
    port = _free_port()
    mlxcel = Path(sys.executable).parent / "mlxcel"
    command = [str(mlxcel), "serve", "-m", str(path), "--port", str(port), "-t", str(threads)]
    command += ["-c", "4096", "--log-level", "warning", *extra]
    return f"http://127.0.0.1:{port}", _start(command, port, "/health")


def one_run(base_url: str, max_tokens: int) -> dict[str, float]:
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "cache_prompt": False,
    }
    answer = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=1800).json()
    return dict(answer["timings"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, help="GGUF (default: the embedded SmolLM2)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--size-n", type=int, default=12, help="--spec-ngram-simple-size-n")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--draft", type=Path, help="the draft model (default: the model)")
    parser.add_argument("--no-draft", action="store_true", help="no draft-model server")
    args = parser.parse_args()
    from mlxcel.weights import resolve_model

    path = resolve_model(str(args.model) if args.model else None)
    spec = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(args.size_n)]
    servers = {"plain": serve(path, args.threads, []), "ngram": serve(path, args.threads, spec)}
    if not args.no_draft:
        servers["draft"] = serve(path, args.threads, ["-md", str(args.draft or path)])
    rates: dict[str, list[float]] = {name: [] for name in servers}
    try:
        for run in range(args.runs):
            for name, (url, _) in servers.items():
                timings = one_run(url, args.max_tokens)
                rates[name].append(timings["predicted_per_second"])
                drafted = timings.get("draft_n", 0)
                accepted = timings.get("draft_n_accepted", 0)
                print(
                    f"run {run + 1} {name}: {timings['predicted_per_second']:.1f} tok/s decode, "
                    f"{timings['predicted_n']} tokens"
                    + (f", {accepted}/{drafted} drafted tokens accepted" if drafted else "")
                    + f" (load {os.getloadavg()[0]:.2f})"
                )
    finally:
        for _, process in servers.values():
            process.terminate()
            process.wait()
    plain = statistics.median(rates["plain"])
    for name, label in (("ngram", "ngram-simple"), ("draft", "draft model")):
        if name in rates:
            ratio = statistics.median(rates[name]) / plain
            print(f"single-stream decode, {label} / plain (medians): {ratio:.2f}x [>= 1.5]")


if __name__ == "__main__":
    main()
