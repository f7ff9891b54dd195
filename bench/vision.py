"""Time to first token with one 512x512 image: `mlxcel serve` against the engine in-process.

    python bench/vision.py [--rounds 7] [--against OTHER/src]

On a random tiny GGUF and a random LLaVA-style projector (224 px, 14 px patches: 256 image
tokens), built offline, with one thread on each side. Each round times a new image through:

- the engine in-process: the generator's own TTFT from the PNG's bytes (decode, tokenize with
  the image, embed, prefill, first sample);
- the server from a client whose request is ready (`ready`, the headline figure): the JSON
  body, its data: URI included, is encoded before the clock starts; the clock covers sending
  it over a kept-alive connection (httpx), everything the server does, and the first streamed
  chunk with content or a finish arriving. Against the engine: target >= 0.9x;
- the server from the openai SDK (`sdk`), with another new image: the same plus what the SDK
  itself takes to build, JSON-encode and send the ~820 KB body (15-35 ms here; no server can
  save it), printed beside the headline for what a real client sees;
- then each image of the `ready` column again, under another question (the embedding cache
  hit: target >= 3x lower). The question comes before the image, so the prefix cache cannot
  reuse the image's KV state: only the embedding cache helps.

After the rounds, the event loop while a 12 MP photo (4000x3000 JPEG, 36 MB of pixels) is read:
another client asks GET /health back to back through the photo's request, and the longest
answer is printed against the longest of as many asked while the server is idle (the photo's
decode runs on a thread; whatever of its handling runs on the event loop delays every other
request's answers and tokens by as much).

Each round also times the `ready` request through bench/bare.py (a bare ASGI app on uvicorn
running this in-process path on its event loop, on the same model): the ratio the least an
HTTP server can add here leaves, the ceiling of the server's own.

`--against OTHER/src` also serves the same model from another source tree (say `git archive`
of an earlier commit), interleaved with this one in every round (the first alternating), so
the machine's load falls on both alike: the ratio of the medians says what a change saved.
Every round is printed with the load average, and each ratio twice: of the medians, and the
median of the rounds' own ratios (whose two figures saw the same load: the steadier one when
the load moves during a run). Streams are read to their end, as a client does, so the next
request reuses the connection.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
from PIL import Image as PILImage

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench.models import CACHE_DIR, SHAPES, build, tiny
from bench.vision_models import VisionShape
from bench.vision_models import build as build_projector
from servers import _free_port, _start
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


def messages(data: bytes, question: str) -> list[dict[str, Any]]:
    content = [{"type": "text", "text": question},
               {"type": "image_url", "image_url": {"url": data_uri(data)}}]  # fmt: skip
    return [{"role": "user", "content": content}]


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


def _first(chunk: dict[str, Any]) -> bool:
    choices = chunk.get("choices") or []
    return bool(choices and (choices[0]["delta"].get("content") or choices[0]["finish_reason"]))


def ready(http: httpx.Client, data: bytes, question: str) -> float:
    """The server's TTFT for one image from a client whose JSON body is encoded already."""
    request = {"model": "m", "messages": messages(data, question), "max_tokens": 1,
               "temperature": 0, "stream": True}  # fmt: skip
    body = json.dumps(request).encode()
    headers = {"content-type": "application/json"}
    took = None
    began = time.perf_counter()
    with http.stream("POST", "/v1/chat/completions", content=body, headers=headers) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if took is None and line.startswith("data: {") and _first(json.loads(line[6:])):
                took = time.perf_counter() - began
    if took is None:
        raise RuntimeError("the stream ended without a first token")
    return took


def sdk(client: openai.OpenAI, data: bytes, question: str) -> float:
    """The server's TTFT for one image through the openai SDK, which builds the body itself
    (the data: URI is made before the clock starts, as an application holds it)."""
    content = messages(data, question)
    began = time.perf_counter()
    stream = client.chat.completions.create(
        model="m", messages=content, max_tokens=1, temperature=0, stream=True  # type: ignore[arg-type]
    )  # fmt: skip
    took = None
    for chunk in stream:
        first = chunk.choices and (chunk.choices[0].delta.content or chunk.choices[0].finish_reason)
        if first and took is None:
            took = time.perf_counter() - began
    if took is None:
        raise RuntimeError("the stream ended without a first token")
    return took


def photo() -> bytes:
    """A 4000x3000 JPEG: a gradient with noise, about as large as a phone's photo."""
    gradient = PILImage.linear_gradient("L").resize((4000, 3000))
    noise = PILImage.effect_noise((4000, 3000), 30)
    image = PILImage.merge(
        "RGB", (gradient, noise, gradient.transpose(PILImage.Transpose.ROTATE_180))
    )
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=90)
    return out.getvalue()


def longest_health(http: httpx.Client, until: threading.Event, at_least: int) -> float:
    """The longest of back-to-back GET /health answers, until `until` is set (and at least
    `at_least` of them)."""
    longest, asked = 0.0, 0
    while not until.is_set() or asked < at_least:
        began = time.perf_counter()
        http.get("/health").raise_for_status()
        longest = max(longest, time.perf_counter() - began)
        asked += 1
    return longest


def loop_stall(served: Served) -> tuple[float, float, float]:
    """The longest /health answer while the server is idle and while it reads a 12 MP photo,
    and the photo's TTFT."""
    data = photo()
    with httpx.Client(base_url=served.http.base_url) as probe:
        done = threading.Event()
        done.set()
        idle = longest_health(probe, done, 200)
        done.clear()
        took: list[float] = []

        def send() -> None:
            try:
                took.append(ready(served.http, data, "A photo:"))
            finally:
                done.set()

        worker = threading.Thread(target=send)
        worker.start()
        busy = longest_health(probe, done, 1)
        worker.join()
    return idle, busy, took[0]


@dataclass
class Floor:
    """bench/bare.py serving the same model, and its figures."""

    process: subprocess.Popen[bytes]
    http: httpx.Client
    times: list[float] = field(default_factory=list)


def start_floor(text: Path, mmproj: Path) -> Floor:
    port = _free_port()
    bare = Path(__file__).resolve().parent / "bare.py"
    command = [sys.executable, str(bare), "vision", str(port), str(text), str(mmproj)]
    floor = Floor(
        _start(command, port, "/health"), httpx.Client(base_url=f"http://127.0.0.1:{port}")
    )
    for seed in (996, 997, 998):
        ready(floor.http, picture(seed), "Warm up:")
    return floor


@dataclass
class Served:
    """One server under test, its clients, and its figures."""

    name: str
    process: ServerProcess
    http: httpx.Client
    client: openai.OpenAI
    times: dict[str, list[float]] = field(
        default_factory=lambda: {"ready": [], "sdk": [], "again": []}
    )


def start(name: str, text: Path, mmproj: Path, src: Path | None) -> Served:
    env = {"PYTHONPATH": str(src)} if src is not None else None
    process = ServerProcess("-m", str(text), "--mmproj", str(mmproj), "-c", str(CTX),
                            "-b", str(BATCH), "-ub", str(BATCH), "--cache-ram", "0",
                            env=env)  # fmt: skip
    process.wait_ready()
    served = Served(name, process, process.http(), process.openai())
    ready(served.http, picture(998), "Warm up:")
    sdk(served.client, picture(999), "Warm up:")
    return served


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def _paired(numerators: list[float], denominators: list[float]) -> float:
    """The median of the rounds' ratios: each round's two figures saw the same load."""
    return statistics.median(n / d for n, d in zip(numerators, denominators, strict=True))


def _load() -> str:
    return "load " + " ".join(f"{value:.2f}" for value in os.getloadavg())


def run_round(
    i: int,
    generator: LlamaCppGenerator,
    servers: list[Served],
    floor: Floor,
    fresh: Callable[[int], bytes],
) -> float:
    """One round: the engine, the floor, then every server in turn (the first alternating);
    printed."""
    new, other = fresh(2 * i), fresh(2 * i + 1)
    engine = in_process(generator, new, f"Question {i}:")
    floor.times.append(ready(floor.http, new, f"Question {i}:"))
    order = servers[i % len(servers) :] + servers[: i % len(servers)]
    for served in order:
        served.times["ready"].append(ready(served.http, new, f"Question {i}:"))
        served.times["sdk"].append(sdk(served.client, other, f"Question {i}:"))
        served.times["again"].append(ready(served.http, new, f"Again {i}:"))
    figures = "; ".join(
        f"{s.name} ready {_ms(s.times['ready'][-1])} sdk {_ms(s.times['sdk'][-1])} "
        f"again {_ms(s.times['again'][-1])}"
        for s in servers
    )
    print(f"round {i}: in-process {_ms(engine)}; floor {_ms(floor.times[-1])}; {figures} ms "
          f"({_load()})", flush=True)  # fmt: skip
    return engine


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--against", type=Path, help="another mlxcel source tree (its src/)")
    args = parser.parse_args()
    text = build(TEXT, CACHE_DIR).path
    mmproj = build_projector(PROJECTOR, CACHE_DIR)
    pictures = [picture(seed) for seed in range(2 * args.rounds)]
    generator = LlamaCppGenerator(text, LlamaCppOptions(CTX, 1, 1, BATCH, BATCH, mmproj=mmproj))
    in_process(generator, picture(997), "Warm up:")
    servers: list[Served] = []
    floor = start_floor(text, mmproj)
    try:
        servers.append(start("this", text, mmproj, None))
        if args.against is not None:
            servers.append(start("against", text, mmproj, args.against.resolve()))
        fresh = pictures.__getitem__
        engines = [run_round(i, generator, servers, floor, fresh) for i in range(args.rounds)]
        stalls = [(s.name, loop_stall(s)) for s in servers]
    finally:
        floor.http.close()
        floor.process.terminate()
        floor.process.wait()
        for served in servers:
            served.http.close()
            served.process.stop()
        generator.close()
    print(f"TTFT, one 512x512 image ({PROJECTOR.image_tokens} image tokens), medians of "
          f"{args.rounds} rounds ({_load()}):")  # fmt: skip
    engine = statistics.median(engines)
    print(f"  in-process {_ms(engine)} ms")
    lowest = statistics.median(floor.times)
    print(
        f"  the floor (bench/bare.py: this path on a bare uvicorn app's loop): {_ms(lowest)} ms, "
        f"{engine / lowest:.2f}x ({_paired(engines, floor.times):.2f}x round by round)"
    )
    for s in servers:
        new, through, again = (statistics.median(s.times[k]) for k in ("ready", "sdk", "again"))
        print(
            f"  {s.name}: body ready {_ms(new)} ms, {engine / new:.2f}x (target >= 0.9x; "
            f"{_paired(engines, s.times['ready']):.2f}x round by round); openai SDK "
            f"{_ms(through)} ms, {engine / through:.2f}x; same image again {_ms(again)} ms, "
            f"{new / again:.2f}x lower (target >= 3x); {new / lowest:.3f}x the floor's time"
        )
    for name, (idle, busy, took) in stalls:
        print(
            f"  {name}: a 12 MP photo (TTFT {_ms(took)} ms) held the event loop: the longest "
            f"/health answer {_ms(busy)} ms during it, {_ms(idle)} ms idle"
        )
    if len(servers) == 2:
        this, against = (s.times["ready"] for s in servers)
        print(
            f"  body ready, this tree against the other: "
            f"{statistics.median(against) / statistics.median(this):.2f}x faster "
            f"({_paired(against, this):.2f}x round by round)"
        )


if __name__ == "__main__":
    main()
