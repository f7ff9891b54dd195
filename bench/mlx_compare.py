"""mlxcel against mlx-lm's own server on the same MLX model, in one run.

    python bench/mlx_compare.py [--model DIR] [--rounds 3] [--max-tokens 64]

Builds (once, into bench/.cache) the tests' tiny random-weight Llama (tests/mlx_model.py)
with its end-of-generation tokens' output rows zeroed, so a greedy pick never ends a request
early (mlx-lm's server has no ignore_eos), unless `--model` names a folder. Then serves it in
turn with `mlx_lm server` (8 sequences decoded together) and `mlxcel serve --backend mlx -np 8`,
each at 1 and 8 clients (bench/serve.py's load, 2 requests a client), interleaved for `--rounds`
with the first of each round alternating, and prints every round with the machine's load, then
the medians' ratios: single-stream decode and 8-stream aggregate decode (from the median time
per output token of a request after its first, which counts every pause a stream sees) and the
median TTFT at 8. A round where a request stopped before max_tokens says so: its figures do not
compare.
MLX sizes its CPU threads itself and neither server takes a thread flag for it, so
bench/compare.py's three ways of giving threads are one way here: each server's default.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from models import CACHE_DIR
from safetensors.numpy import load_file, save_file
from serve import make_prompts, run_level, summarize
from servers import _free_port, _start
from tests.mlx_model import build_model

SERVERS = ("mlx_lm server", "mlxcel")
# mlx-lm's server loads the model its --model names under this name.
MODEL_NAME = "default_model"


def build_bench_model(target: Path) -> Path:
    """The tests' tiny Llama in `target`, its end-of-generation tokens' logits always 0: below
    the largest of the others, so greedy decoding runs to max_tokens on any server."""
    build_model(target)
    weights = load_file(target / "model.safetensors")
    ends = json.loads((target / "generation_config.json").read_text())["eos_token_id"]
    weights["lm_head.weight"][ends] = 0
    save_file(weights, str(target / "model.safetensors"), {"format": "pt"})
    return target


def command(name: str, model: Path, port: int) -> list[str]:
    """The server's command line, 8 sequences at once, on `port`."""
    if name == "mlx_lm server":
        line = [sys.executable, "-m", "mlx_lm", "server", "--model", str(model)]
        return [*line, "--decode-concurrency", "8", "--log-level", "WARNING", "--port", str(port)]
    mlxcel = Path(sys.executable).parent / "mlxcel"
    line = [str(mlxcel), "serve", "-m", str(model), "--backend", "mlx", "-np", "8"]
    return [*line, "--log-level", "warning", "--port", str(port)]


def measure(name: str, model: Path, args: argparse.Namespace) -> tuple[float, float, float, int]:
    """Single-stream decode tok/s, 8-stream aggregate tok/s, median TTFT at 8 (ms) and how
    many requests stopped early."""
    port = _free_port()
    process = _start(command(name, model, port), port, "/health")
    base = f"http://127.0.0.1:{port}/v1"
    try:
        levels = {}
        for level in (1, 8):
            prompts = make_prompts(level * 2, args.prompt_tokens, False, level)
            samples, wall = asyncio.run(
                run_level(base, MODEL_NAME, prompts, level, args.max_tokens)
            )
            levels[level] = summarize(level, samples, wall)
    finally:
        process.terminate()
        process.wait()
    return (
        1000 / levels[1]["tpot_median_ms"],
        8 * 1000 / levels[8]["tpot_median_ms"],
        levels[8]["ttft_median_ms"],
        int(levels[1]["stopped_early"] + levels[8]["stopped_early"]),
    )


def main() -> None:
    """Build or find the model, run the rounds, print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, help="an MLX folder (default: a tiny Llama)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    model = args.model or CACHE_DIR / "mlx-tiny-llama-no-eos"
    if args.model is None and not (model / "model.safetensors").exists():
        build_bench_model(model)
    runs: dict[str, list[tuple[float, float, float, int]]] = {name: [] for name in SERVERS}
    for round_ in range(1, args.rounds + 1):
        order = SERVERS if round_ % 2 else SERVERS[::-1]
        for name in order:
            figures = measure(name, model, args)
            runs[name].append(figures)
            print(
                f"round {round_} {name + ':':15} decode {figures[0]:.1f} tok/s at 1 stream, "
                f"{figures[1]:.1f} aggregate at 8; median TTFT at 8 {figures[2]:.0f} ms; "
                f"load {os.getloadavg()[0]:.1f}"
                + (f"; {figures[3]} requests stopped early" if figures[3] else ""),
                flush=True,
            )
    theirs, ours = (
        [statistics.median(f[i] for f in runs[name]) for i in range(3)] for name in SERVERS
    )
    print("medians, mlxcel / mlx_lm server:")
    print(f"  single-stream decode: {ours[0]:.1f} / {theirs[0]:.1f} = {ours[0] / theirs[0]:.2f}x")
    print(f"  8-stream aggregate:   {ours[1]:.1f} / {theirs[1]:.1f} = {ours[1] / theirs[1]:.2f}x")
    print(
        f"  median TTFT at 8, theirs/ours: {theirs[2]:.0f} / {ours[2]:.0f} ms = "
        f"{theirs[2] / ours[2]:.2f}x"
    )


if __name__ == "__main__":
    main()
