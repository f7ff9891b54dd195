"""Image embedding throughput (`python bench/embeddings.py --images`), one run, the same random
CLIP folder (tiny, or at ViT-B/32's shape with --shape base) and the same PNGs for every side:

- in process: the server's own engines, ONNX Runtime (the default on Linux) and torch, on the
  folder, at batch 16 (the server's default --media-max-images): torch / ONNX Runtime is why
  the default is what it is;
- ours: `mlxcel serve` with the folder as its only model, POST /v1/embeddings with 16 images as
  data: URIs a request, against the same engine in process (target >= 0.9x);
- infinity-emb's server on the same folder (`infinity_emb v2`, its own venv), POST /embeddings
  with the images as data: URIs (target: ours ahead), given with --infinity or found on PATH.

Each side runs `--rounds` times, interleaved, and keeps its best round (the machine is shared).
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from bench.clip_models import build_clip, png
from bench.servers import _free_port, _start

BATCH = 16
OURS = "mlxcel /v1/embeddings"
INFINITY = "infinity-emb /embeddings"


def rate(run: Callable[[list[Any]], object], items: list[Any]) -> float:
    """Images per second, at batch 16."""
    began = time.perf_counter()
    for start in range(0, len(items), BATCH):
        run(items[start : start + BATCH])
    return len(items) / (time.perf_counter() - began)


def engines(folder: Path, threads: int) -> dict[str, Callable[[list[bytes]], object]]:
    """The server's own engines on the folder, in this process, each taking encoded images."""
    from mlxcel.backends.embeddings.image_text import TorchImageTextEmbedder
    from mlxcel.backends.embeddings.image_text_onnx import OnnxImageTextEmbedder
    from mlxcel.media.images import checked

    onnx = OnnxImageTextEmbedder(folder, threads=threads, batch_tokens=1 << 20)
    torch = TorchImageTextEmbedder(folder, threads=threads, batch_tokens=1 << 20)

    def run(engine: Any) -> Callable[[list[bytes]], object]:
        return lambda batch: engine.embed_images([checked(data, 1 << 30) for data in batch])

    return {"onnxruntime (in process)": run(onnx), "torch (in process)": run(torch)}


def infinity_server(binary: str, folder: Path, threads: int) -> tuple[Any, str]:
    """infinity-emb's server on the folder (torch engine), and its embeddings URL."""
    port = _free_port()
    command = [binary, "v2", "--model-id", str(folder), "--port", str(port)]
    command += ["--batch-size", str(BATCH), "--device", "cpu", "--no-model-warmup"]
    os.environ.update(DO_NOT_TRACK="1", INFINITY_ANONYMOUS_USAGE_STATS="0")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    return _start(command, port, "/health"), f"http://127.0.0.1:{port}/embeddings"


def image_bench(args: argparse.Namespace, infinity: str | None) -> None:
    """Measure every side on images and print the ratios."""
    pictures = [png(seed, (320, 240)) for seed in range(args.images_count)]
    uris = ["data:image/png;base64," + base64.b64encode(p).decode() for p in pictures]
    with tempfile.TemporaryDirectory() as tmp:
        folder = build_clip(Path(tmp) / f"clip-{args.shape}", base=args.shape == "base")
        os.environ.setdefault("MLXCEL_CACHE_DIR", str(Path(tmp) / "cache"))
        local = engines(folder, args.threads)
        config = Path(tmp) / "models.yaml"
        config.write_text(f"models:\n  - model: {folder}\n    kind: embedding\n    name: clip\n")
        port = _free_port()
        command = [sys.executable, "-m", "mlxcel.cli", "serve", "--port", str(port)]
        command += ["--threads", str(args.threads), "--config", str(config)]
        servers = [_start(command, port, "/health")]
        try:
            with httpx.Client(timeout=600) as http:
                url = f"http://127.0.0.1:{port}/v1/embeddings"

                # Each request's JSON made once, before any timing: the client's encoding of
                # 5 MB of base64 is no part of the server's time (nor of the engine's).
                bodies: dict[str, bytes] = {}

                def body(batch: list[str]) -> bytes:
                    inputs = [{"type": "image_url", "image_url": {"url": u}} for u in batch]
                    return json.dumps({"input": inputs}).encode()

                def ours(batch: list[str]) -> object:
                    key = batch[0] + str(len(batch))
                    content = bodies.get(key) or bodies.setdefault(key, body(batch))
                    headers = {"Content-Type": "application/json"}
                    return http.post(url, content=content, headers=headers).raise_for_status()

                for start in range(0, len(uris), BATCH):
                    ours(uris[start : start + BATCH])

                sides: list[tuple[str, Callable[[list[Any]], object], list[Any]]] = [
                    *((name, run, pictures) for name, run in local.items()),
                    (OURS, ours, uris),
                ]
                if infinity:
                    process, peer_url = infinity_server(infinity, folder, args.threads)
                    servers.append(process)

                    def peer(batch: list[str]) -> object:
                        body = {"input": batch, "model": str(folder), "modality": "image"}
                        return http.post(peer_url, json=body).raise_for_status()

                    sides.append((INFINITY, peer, uris))
                best: dict[str, float] = {}
                for _ in range(args.rounds):
                    for name, run, items in sides:
                        run(items[:BATCH])
                        best[name] = max(best.get(name, 0.0), rate(run, items))
        finally:
            for server in servers:
                server.terminate()
                server.wait(timeout=30)
    report(best, args)


def report(best: dict[str, float], args: argparse.Namespace) -> None:
    """The table and the ratios."""
    print(
        f"CLIP ({args.shape}, random weights), {args.images_count} PNGs of 320x240, batch "
        f"{BATCH}, {args.threads} threads"
    )
    for name, value in best.items():
        print(f"  {name:32s} {value:8.2f} images/s")
    onnx, torch = best["onnxruntime (in process)"], best["torch (in process)"]
    print(f"onnxruntime / torch in process: {onnx / torch:.2f}x (the engine auto picks)")
    print(f"ours / onnxruntime in process: {best[OURS] / onnx:.2f}x (target >= 0.9x)")
    if INFINITY in best:
        print(f"ours / infinity-emb server: {best[OURS] / best[INFINITY]:.2f}x (target > 1x)")
    else:
        print("ours / infinity-emb: not measured (no infinity_emb: give --infinity PATH)")
