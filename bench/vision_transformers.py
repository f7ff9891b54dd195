"""A Hugging Face Qwen2-VL folder on transformers against the same shape on the GGUF path
(llama.cpp, libmtmd) and on mlx-vlm: time to first token with one image, and decode speed.

    python bench/vision_transformers.py [--runs 5] [--tokens 64]

The tiny random-weight Qwen2-VL of the tests (tests/hf_qwen2vl.py, tests/mlx_qwen2vl.py:
2 layers of 64, a one-block vision tower of 32, 8 px patches merged 2 x 2) in each engine's
format; the GGUF is the same text shape with SmolLM2's vocabulary (bench/models.py) and a
Qwen2-VL projector of the same tower (bench/mrope_models.py). Each server in turn, alone on
the machine: a new 64x64 image per run (16 image tokens) for TTFT (a one-token stream), then
`--tokens` tokens with ignore_eos for decode tokens per second. Prints the medians and
transformers' ratios to the other two (above 1: transformers is faster).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.models import CACHE_DIR, SHAPES, build, tiny
from bench.mrope_models import MropeShape
from bench.mrope_models import build as build_projector
from tests.hf_qwen2vl import build_hf_qwen2vl_model
from tests.media_util import data_uri, image_bytes
from tests.mlx_qwen2vl import build_qwen2vl_model
from tests.server_process import ServerProcess

TEXT = replace(tiny(SHAPES["qwen2-vl-2b"]), vocab=SHAPES["smollm2-135m"].vocab)
PROJECTOR = MropeShape(TEXT.hidden, patch_size=8, hidden=32, ffn=64, heads=2, layers=1)
SIDE = 64


def request(client: openai.OpenAI, seed: int, tokens: int) -> list[float]:
    """Stream one answer about a new image; the time of each content chunk from the request."""
    url = data_uri(image_bytes(size=(SIDE, SIDE), color=seed))
    content = [{"type": "text", "text": "Describe:"},
               {"type": "image_url", "image_url": {"url": url}}]  # fmt: skip
    began = time.perf_counter()
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": content}],  # type: ignore[misc,list-item]
        max_tokens=tokens, temperature=0, stream=True, extra_body={"ignore_eos": True},
    )  # fmt: skip
    times = []
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content is not None:
            times.append(time.perf_counter() - began)
    return times


def measure(args: tuple[str, ...], runs: int, tokens: int) -> tuple[float, float]:
    """Median TTFT (s) and decode tokens per second of a server started with `args`."""
    server = ServerProcess(*args, "--alias", "m", "-c", "1024", "--cache-ram", "0")
    try:
        server.wait_ready()
        client = server.openai()
        request(client, 255, 2)
        ttft = [request(client, seed, 1)[0] for seed in range(runs)]
        rates = []
        for seed in range(runs):
            times = request(client, 100 + seed, tokens)
            rates.append((len(times) - 1) / (times[-1] - times[0]))
    finally:
        server.stop()
    return statistics.median(ttft), statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="bench-vision-transformers-"))
    gguf = build(TEXT, CACHE_DIR).path
    engines = {
        "transformers": ("-m", str(build_hf_qwen2vl_model(root / "hf")), "--backend",
                         "transformers"),
        "llama.cpp": ("-m", str(gguf), "--mmproj", str(build_projector(PROJECTOR, CACHE_DIR))),
        "mlx-vlm": ("-m", str(build_qwen2vl_model(root / "mlx"))),
    }  # fmt: skip
    results = {name: measure(flags, args.runs, args.tokens) for name, flags in engines.items()}
    print(f"one {SIDE}x{SIDE} image, {args.tokens} tokens, load {os.getloadavg()[0]:.2f}:")
    for name, (ttft, rate) in results.items():
        print(f"  {name:12} TTFT {ttft * 1e3:7.1f} ms   decode {rate:7.1f} tok/s")
    ttft, rate = results["transformers"]
    for name in ("llama.cpp", "mlx-vlm"):
        other_ttft, other_rate = results[name]
        print(
            f"  transformers against {name}: TTFT {other_ttft / ttft:.2f}x, "
            f"decode {rate / other_rate:.2f}x"
        )


if __name__ == "__main__":
    main()
