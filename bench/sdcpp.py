"""Seconds per image: stable-diffusion.cpp against diffusers on a CPU, on the very same weights.

    python bench/sdcpp.py [--size 64x64] [--steps 4] [--threads 1] [--runs 3]
                          [--types f32,q8_0,q4_0]

The model is the random-weight SD 1.5 of bench/sd15_model.py (stable-diffusion.cpp fixes SD
1.x's dimensions, so nothing much smaller loads there), in the diffusers folder layout.
diffusers runs it as mlxcel does (mlxcel's own DiffusersImageGenerator, torch on the CPU,
float32, Euler, guidance 7.5). stable-diffusion.cpp (bench/sdcpp_build.py: built once from its
sdist for the CPU) runs the same folder in float32, and the single-file GGUFs its own
converter writes from that folder for every other --types entry (q8_0, q4_0), with Euler on
the discrete schedule, the same steps, size, guidance and threads. stable-diffusion.cpp holds
every convolution kernel in float16 whatever the file (its Conv2d block fixes the type), and its
converter quantises only the linear layers (a 3x3 kernel's rows are no multiple of a quant
block), so "f32" there is f16 convolutions with f32 linears, and q8_0/q4_0 shrink the linears.
Each engine lives in a process of its own (two OpenMP runtimes in one process would fight over
the cores); runs alternate between diffusers and the sd.cpp variant being
measured, so both see the same machine load. It prints the medians and sd.cpp's time as a
ratio of diffusers' (below 1: sd.cpp is faster), with `uptime`'s load before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from multiprocessing import get_context
from multiprocessing.connection import Connection
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_server import CACHE_DIR
from sd15_model import build_sd15
from sdcpp_build import build_sdcpp

PROMPT = "a red cat"
GUIDANCE = 7.5


def _serve(conn: Connection, engine: str, model: str, threads: int) -> None:
    """A worker: load one engine, then answer each (width, height, steps) with seconds."""
    started = time.perf_counter()
    if engine == "diffusers":
        from mlxcel.backends.images.diffusers_engine import DiffusersImageGenerator
        from mlxcel.engine.image_types import ImageJob

        diffusers = DiffusersImageGenerator(Path(model), threads)

        def run(width: int, height: int, steps: int) -> None:
            job = ImageJob(PROMPT, width, height, 1, steps, seed=1, guidance_scale=GUIDANCE)
            diffusers.generate(job, lambda _: None, lambda: False)

    else:
        sys.path.insert(0, str(build_sdcpp()))
        from stable_diffusion_cpp import StableDiffusion

        sdcpp = StableDiffusion(
            model_path=model, n_threads=threads, vae_decode_only=True, verbose=False
        )

        def run(width: int, height: int, steps: int) -> None:
            sdcpp.generate_image(
                PROMPT,
                width=width,
                height=height,
                cfg_scale=GUIDANCE,
                sample_method="euler",
                scheduler="discrete",
                sample_steps=steps,
                seed=1,
            )

    conn.send(time.perf_counter() - started)
    while (request := conn.recv()) is not None:
        started = time.perf_counter()
        run(*request)
        conn.send(time.perf_counter() - started)


class Worker:
    """One engine in a spawned process of its own."""

    def __init__(self, engine: str, model: Path, threads: int) -> None:
        context = get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, engine, str(model), threads))
        self._process.start()
        self.load_s: float = self._conn.recv()

    def run(self, width: int, height: int, steps: int) -> float:
        self._conn.send((width, height, steps))
        seconds: float = self._conn.recv()
        return seconds

    def close(self) -> None:
        self._conn.send(None)
        self._process.join()


def gguf(folder: Path, wtype: str) -> Path:
    """The folder as one GGUF file of `wtype` weights, written once by sd.cpp's converter."""
    path = folder.with_name(f"{folder.name}-{wtype}.gguf")
    if not path.is_file():
        sys.path.insert(0, str(build_sdcpp()))
        from stable_diffusion_cpp import StableDiffusion

        converter = StableDiffusion(verbose=False)
        partial = path.with_suffix(".partial")
        if not converter.convert(str(folder), output_path=str(partial), output_type=wtype):
            raise RuntimeError(f"stable-diffusion.cpp could not convert {folder} to {wtype}")
        partial.rename(path)
    return path


def load() -> str:
    return "load average " + ", ".join(f"{value:.2f}" for value in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="64x64")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--types", default="f32,q8_0,q4_0", help="sd.cpp weight types")
    parser.add_argument("--model", type=Path, default=CACHE_DIR / "sd15-random")
    args = parser.parse_args()
    width, height = (int(side) for side in args.size.split("x"))
    folder = build_sd15(args.model)
    models = {
        wtype: folder if wtype == "f32" else gguf(folder, wtype) for wtype in args.types.split(",")
    }
    print(f"{args.size}, {args.steps} steps, {args.threads} thread(s), {args.runs} runs; {load()}")
    diffusers = Worker("diffusers", folder, args.threads)
    print(f"  diffusers loads in {diffusers.load_s:.1f} s")
    try:
        for wtype, model in models.items():
            sdcpp = Worker("sdcpp", model, args.threads)
            print(f"  sd.cpp {wtype} ({model.name}) loads in {sdcpp.load_s:.1f} s")
            ours: list[float] = []
            theirs: list[float] = []
            try:
                # One of each first, unmeasured: the first image pays for lazy set-up.
                diffusers.run(width, height, args.steps)
                sdcpp.run(width, height, args.steps)
                for _ in range(args.runs):
                    ours.append(diffusers.run(width, height, args.steps))
                    theirs.append(sdcpp.run(width, height, args.steps))
            finally:
                sdcpp.close()
            report(wtype, statistics.median(ours), statistics.median(theirs), ours, theirs)
    finally:
        diffusers.close()
    print(f"  done; {load()}")


def report(wtype: str, ours: float, theirs: float, *runs: list[float]) -> None:
    every = " / ".join(" ".join(f"{s:.2f}" for s in run) for run in runs)
    print(f"    diffusers {ours:8.2f} s/image   sd.cpp {wtype:5} {theirs:8.2f} s/image", end="")
    print(f"   sd.cpp/diffusers {theirs / ours:6.3f}x   (runs: {every})")


if __name__ == "__main__":
    main()
