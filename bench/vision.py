"""Time to first token with one 512x512 image: `mlxcel serve` against the engine in-process.

    python bench/vision.py [--runs 5]

On a random tiny GGUF and a random LLaVA-style projector (224 px, 14 px patches: 256 image
tokens), built offline. Prints, as ratios: the server's TTFT against the generator's own
(tokenize with the image, embed, prefill, first sample; target >= 0.9x, in-process / server),
and a new image's TTFT against the same image again under another question (the embedding
cache hit; target >= 3x). The question comes before the image, so the prefix cache cannot
reuse the image's KV state: only the embedding cache helps.
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import time
from pathlib import Path

import openai
from PIL import Image as PILImage

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.models import CACHE_DIR, SHAPES, build, tiny
from bench.vision_models import VisionShape
from bench.vision_models import build as build_projector
from tests.media_util import data_uri
from tests.server_process import ServerProcess

from mlxcel.backends.llamacpp.generator import LlamaCppGenerator, LlamaCppOptions
from mlxcel.engine.media import chunk_end, rows_in
from mlxcel.engine.types import Feed, SamplingParams
from mlxcel.media.images import MEDIA_MARKER, decode

TEXT = tiny(SHAPES["smollm2-135m"])
PROJECTOR = VisionShape(TEXT.hidden, image_size=224, patch_size=14, hidden=192, ffn=768,
                        heads=4, layers=6)  # fmt: skip
GREEDY = SamplingParams(max_tokens=1, temperature=0, top_p=1, top_k=0, min_p=0)
CTX, BATCH = 2048, 512


def picture(seed: int) -> bytes:
    """A 512x512 PNG, different for each seed."""
    image = PILImage.effect_noise((512, 512), 40 + seed).convert("RGB")
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def prompt(question: str) -> str:
    return f"<|im_start|>user\n{question} {MEDIA_MARKER}<|im_end|>\n<|im_start|>assistant\n"


def in_process(generator: LlamaCppGenerator, data: bytes, question: str) -> float:
    """The generator's own TTFT for one image under `question`, its slot emptied after."""
    began = time.perf_counter()
    decoded = decode(data, 1 << 30)
    tokens, spans = generator.tokenize_with_media(prompt(question), [decoded])
    generator.open_slot(0, GREEDY)
    fed, sample = 0, None
    while sample is None:
        end = chunk_end(spans, fed, BATCH, len(tokens))
        feed = Feed(0, tokens[fed:end], end == len(tokens), rows_in(spans, fed, end))
        sample = generator.step([feed])[0]
        fed = end
    took = time.perf_counter() - began
    generator.close_slot(0)
    generator.open_slot(0, GREEDY)  # reuse 0: the next request evaluates from the start
    generator.close_slot(0)
    return took


def served(client: openai.OpenAI, data: bytes, question: str) -> float:
    """The server's TTFT for one image (first streamed chunk with content or a finish). The
    stream is read to its end, as a client does, so the next request reuses the connection."""
    content = [{"type": "text", "text": question},
               {"type": "image_url", "image_url": {"url": data_uri(data)}}]  # fmt: skip
    began = time.perf_counter()
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": content}],  # type: ignore[misc,list-item]
        max_tokens=1, temperature=0, stream=True,
    )  # fmt: skip
    took = None
    for chunk in stream:
        first = chunk.choices and (chunk.choices[0].delta.content or chunk.choices[0].finish_reason)
        if first and took is None:
            took = time.perf_counter() - began
    if took is None:
        raise RuntimeError("the stream ended without a first token")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    text = build(TEXT, CACHE_DIR).path
    mmproj = build_projector(PROJECTOR, CACHE_DIR)
    fresh = [picture(seed) for seed in range(args.runs)]
    generator = LlamaCppGenerator(text, LlamaCppOptions(CTX, 1, 1, BATCH, BATCH, mmproj=mmproj))
    server = ServerProcess("-m", str(text), "--mmproj", str(mmproj), "-c", str(CTX),
                           "-b", str(BATCH), "-ub", str(BATCH), "--cache-ram", "0")  # fmt: skip
    try:
        server.wait_ready()
        client = server.openai()
        served(client, picture(99), "Warm up:")
        # Each new image through the engine, then through the server, in turn: a machine whose
        # load changes during the run slows both sides alike.
        engine_times, new_times = [], []
        for i, data in enumerate(fresh):
            engine_times.append(in_process(generator, data, f"Question {i}:"))
            new_times.append(served(client, data, f"Question {i}:"))
        # Every image seen once already, under another question: only its embedding is reused.
        again = statistics.median(
            served(client, data, f"Again {i}:") for i, data in enumerate(fresh)
        )
    finally:
        server.stop()
        generator.close()
    engine, new = statistics.median(engine_times), statistics.median(new_times)
    print(f"TTFT, one 512x512 image ({PROJECTOR.image_tokens} image tokens):")
    print(
        f"  in-process {engine * 1e3:.1f} ms, server {new * 1e3:.1f} ms: "
        f"{engine / new:.2f}x (target >= 0.9x)"
    )
    print(f"  same image again {again * 1e3:.1f} ms: {new / again:.2f}x lower (target >= 3x)")


if __name__ == "__main__":
    main()
