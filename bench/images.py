"""Seconds per image through `mlxcel serve` against the diffusers engine in-process, in one run.

    python bench/images.py [--model PIPELINE_DIR] [--size 64x64] [--steps 4] [--n 1] [--runs 7]

Without --model it builds (once, into bench/.cache) the tests' tiny random-weight Stable
Diffusion pipeline (bench/image_model.py). The engine is mlxcel's own DiffusersImageGenerator
called in this process; the server is `mlxcel serve --image-model` with the same pipeline,
threads, size, steps and seed, asked for b64_json PNGs over HTTP. Runs alternate between the
two so both see the same machine load; it prints the median of each and the server's speed as
a ratio of the engine's (target: >= 0.95x). Absolute numbers move with the machine's load;
ratios from one run are what to compare.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import _free_port, _start
from image_model import build_pipeline
from models import CACHE_DIR

from mlxcel.backends.images.diffusers_engine import DiffusersImageGenerator
from mlxcel.engine.image_types import ImageJob

TARGET = 0.95


def pipeline(args: argparse.Namespace) -> Path:
    """--model, or the tiny pipeline, built once into bench/.cache."""
    if args.model is not None:
        return Path(args.model)
    folder = CACHE_DIR / "tiny-sd"
    if not (folder / "model_index.json").is_file():
        build_pipeline(folder)
    return folder


def start_server(path: Path, args: argparse.Namespace) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    mlxcel = Path(sys.executable).parent / "mlxcel"
    command = [str(mlxcel), "serve", "--image-model", str(path), "--port", str(port)]
    command += ["--threads", str(args.threads), "--ctx-size", "512", "--log-level", "warning"]
    return _start(command, port, "/health"), f"http://127.0.0.1:{port}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a diffusers pipeline folder (default: the tiny one)")
    parser.add_argument("--size", default="64x64")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--n", type=int, default=1)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    path = pipeline(args)
    width, height = (int(side) for side in args.size.split("x"))
    engine = DiffusersImageGenerator(path, args.threads)
    job = ImageJob("a red cat", width, height, args.n, args.steps, seed=1)
    body = {"prompt": job.prompt, "size": args.size, "n": args.n, "steps": args.steps, "seed": 1}
    server, base_url = start_server(path, args)
    ours: list[float] = []
    raw: list[float] = []
    try:
        with httpx.Client(base_url=base_url, timeout=600) as http:
            # One of each first, unmeasured: the first batch pays for lazy set-up.
            engine.generate(job, lambda _: None, lambda: False)
            http.post("/v1/images/generations", json=body).raise_for_status()
            for _ in range(args.runs):
                started = time.perf_counter()
                engine.generate(job, lambda _: None, lambda: False)
                raw.append((time.perf_counter() - started) / args.n)
                started = time.perf_counter()
                http.post("/v1/images/generations", json=body).raise_for_status()
                ours.append((time.perf_counter() - started) / args.n)
    finally:
        server.terminate()
        server.wait()
    report(args, statistics.median(raw), statistics.median(ours))


def report(args: argparse.Namespace, raw: float, ours: float) -> None:
    ratio = raw / ours
    print(
        f"{args.size}, {args.steps} steps, n={args.n}, {args.threads} thread(s), {args.runs} runs"
    )
    print(f"  engine in-process   {raw:8.3f} s/image")
    print(f"  mlxcel serve        {ours:8.3f} s/image")
    verdict = "meets" if ratio >= TARGET else "misses"
    print(f"  server/engine speed {ratio:8.3f}x ({verdict} the {TARGET}x target)")


if __name__ == "__main__":
    main()
