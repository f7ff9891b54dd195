"""One MLX model on two ranks against one, tensor and pipeline parallel, in one run.

    sudo python bench/distributed.py [--shape tiny,qwen2.5-0.5b] [--prompt-tokens 256]
                                     [--decode-tokens 64] [--rounds 2]
    python bench/distributed.py --hostfile hosts.json --model DIR   # your own machines

For each shape (built once into bench/.cache: the tests' tiny Qwen2, and Qwen2.5-0.5B's layers,
hidden 896, 24 layers, 14 heads, 2 KV heads, with the tiny tokenizer's vocabulary), it serves the
model on one rank, then on two ranks in each mode, rank 0 and rank 1 in two network namespaces
over a veth pair (tests/netns.py; Linux, root), and times one request a round: `--prompt-tokens`
of prompt (prefill tokens/s) then `--decode-tokens` greedy tokens (decode tokens/s), from the
server's own `timings`. It prints each configuration's best round, its ratio to one rank, and
what the link adds per decoded token.

On one machine both ranks share its cores, so the ratios here measure correctness's price, the
link's cost, not a speed-up; the figures that matter come from machines that each hold a part.
With `--hostfile` (rank 1 and up started on their machines: docs/distributed.md), it serves
`--model` with that hostfile instead, so Apple machines give the numbers to compare: one rank
(run it on rank 0's machine alone) against two, each mode.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from models import CACHE_DIR
from tests import mlx_model
from tests.netns_ranks import HTTP, Namespaces, children, ranks_apart, write_hostfile

MLXCEL = str(Path(sys.executable).parent / "mlxcel")
PORT = 18544
# Qwen2.5-0.5B's layers; the vocabulary stays the tiny tokenizer's.
SHAPES: dict[str, dict[str, int]] = {
    "tiny": {},
    "qwen2.5-0.5b": {
        "HIDDEN": 896,
        "HEADS": 14,
        "KV_HEADS": 2,
        "HEAD_DIM": 64,
        "LAYERS": 24,
        "INTERMEDIATE": 4864,
    },
}
MODES = ("tensor", "pipeline")


def build(shape: str) -> Path:
    """The shape's random-weight Qwen2 folder, built once."""
    target = CACHE_DIR / f"mlx-dist-{shape}"
    if (target / "model.safetensors").exists():
        return target
    saved = {name: getattr(mlx_model, name) for name in SHAPES[shape]}
    try:
        for name, value in SHAPES[shape].items():
            setattr(mlx_model, name, value)
        return mlx_model.build_model(target, "qwen2", seed=3)
    finally:
        for name, value in saved.items():
            setattr(mlx_model, name, value)


def _wait(process: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited: {log.read_text()[-2000:]}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise TimeoutError(url)


@contextlib.contextmanager
def server(command: list[str], url: str, log: Path) -> Iterator[str]:
    """A server for the block; stopped after it."""
    with open(log, "wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait(process, url, log)
            yield url
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def measure(url: str, args: argparse.Namespace) -> tuple[float, float]:
    """The best round's prefill and decode tokens/s."""
    best = (0.0, 0.0)
    for round_ in range(args.rounds + 1):
        # Each round's prompt differs from the last, so no prefix is reused.
        prompt = [(7 * i + round_) % 500 + 20 for i in range(args.prompt_tokens)]
        body = {"prompt": prompt, "max_tokens": args.decode_tokens, "temperature": 0}
        answer = httpx.post(url + "/v1/completions", json={**body, "ignore_eos": True}, timeout=600)
        answer.raise_for_status()
        timings = answer.json()["timings"]
        if round_:  # the first is a warm-up
            figures = (timings["prompt_per_second"], timings["predicted_per_second"])
            best = (max(best[0], figures[0]), max(best[1], figures[1]))
    return best


def _serve(model: Path, *extra: str) -> list[str]:
    return [MLXCEL, "serve", "-m", str(model), "--threads", "1", *extra]


def run_shape(shape: str, model: Path, args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """One rank, then two in each mode, in namespaces (or over `--hostfile`)."""
    logs = CACHE_DIR / "dist-logs"
    logs.mkdir(parents=True, exist_ok=True)
    results = {}
    local = f"http://127.0.0.1:{PORT}"
    with server(_serve(model, "--port", str(PORT)), local, logs / "one.log") as url:
        results["one rank"] = measure(url, args)
    for mode in MODES:
        # A step on a loaded machine may take long: the bench measures speed, not faults.
        split = ("--parallel-mode", mode, "--rank-timeout", "600")
        if args.hostfile is not None:
            command = _serve(
                model, "--port", str(PORT), "--distributed", str(args.hostfile), *split
            )
            with server(command, local, logs / f"{mode}.log") as url:
                results[mode] = measure(url, args)
            continue
        with ranks_apart(f"mlxc44-b{os.getpid() % 10000}") as spaces:
            results[mode] = _in_namespaces(spaces, model, split, logs / f"{mode}.log", args)
    return results


def _in_namespaces(
    spaces: Namespaces, model: Path, split: tuple[str, str], log: Path, args: argparse.Namespace
) -> tuple[float, float]:
    hosts = write_hostfile(CACHE_DIR / "dist-hosts.json")
    rank1_log = open(log.with_suffix(".rank1.log"), "wb")  # noqa: SIM115
    rank1 = subprocess.Popen(
        spaces.run(1, [MLXCEL, "serve", "--distributed", str(hosts), "--rank", "1"]),
        stdout=rank1_log,
        stderr=subprocess.STDOUT,
    )
    try:
        where = ("--host", HTTP[1], "--port", str(PORT), "--distributed", str(hosts), *split)
        command = spaces.run(0, _serve(model, *where))
        with server(command, f"http://{HTTP[1]}:{PORT}", log) as url:
            return measure(url, args)
    finally:
        for pid in children(rank1.pid):
            with contextlib.suppress(OSError):
                os.kill(pid, 9)
        rank1.kill()
        rank1.wait()
        rank1_log.close()


def report(shape: str, results: dict[str, tuple[float, float]], args: argparse.Namespace) -> None:
    """Each configuration against one rank."""
    one_prefill, one_decode = results["one rank"]
    tokens = f"{args.prompt_tokens} prompt tokens, {args.decode_tokens} decoded"
    print(f"{shape}: {tokens} (best of {args.rounds})")
    for name, (prefill, decode) in results.items():
        line = f"  {name:9} prefill {prefill:8.1f} tok/s  decode {decode:7.1f} tok/s"
        if name != "one rank":
            link_ms = 1000 / decode - 1000 / one_decode
            line += (
                f"  = {prefill / one_prefill:.2f}x / {decode / one_decode:.2f}x one rank;"
                f" {link_ms:+.1f} ms a decoded token"
            )
        print(line, flush=True)


def main() -> None:
    """Build the shapes, serve each three ways, print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="tiny,qwen2.5-0.5b", help="comma-separated shapes")
    parser.add_argument("--model", type=Path, help="an MLX folder (with --hostfile)")
    parser.add_argument("--hostfile", type=Path, help="serve over your own ranks")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.hostfile is not None:
        if args.model is None:
            parser.error("--hostfile needs --model (the folder every machine holds)")
        report(args.model.name, run_shape(args.model.name, args.model, args), args)
        return
    print(f"load average {os.getloadavg()[0]:.1f}; both ranks share this machine's cores")
    for shape in args.shape.split(","):
        report(shape, run_shape(shape, build(shape), args), args)


if __name__ == "__main__":
    main()
