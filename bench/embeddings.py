"""Embedding throughput, one run, same model (all-MiniLM-L6-v2) and inputs for every side:

    python bench/embeddings.py [--sentences 256] [--rounds 3] [--threads N] [--infinity PATH]

- in process: sentence-transformers on torch, ONNX Runtime (the model exported with
  torch.onnx), and llama.cpp (the same weights as a BERT GGUF), at batch 32;
- ours: `mlxcel serve --embedding-model default` (ONNX Runtime on Linux), POST /v1/embeddings
  at batch 32, against the best in-process engine (target >= 0.9x);
- infinity-emb's server (`infinity_emb v2`, its own venv: its pins replace numpy and uvicorn,
  so it cannot share ours) on the same folder, POST /embeddings at batch 32 (target: ours
  >= 1.2x); given with --infinity, or found on PATH;
- cross-request batching: 16 concurrent single-sentence clients against the same 16 requests
  one at a time (target >= 3x).

Each side runs `--rounds` times, interleaved, and keeps its best round (the machine is shared).

    python bench/embeddings.py --images [--shape tiny|base] [--images-count 64]

measures images instead, on a random CLIP folder (bench/image_embeddings.py): the server
against its engine in process, ONNX Runtime against torch, and infinity-emb where installed.

    python bench/embeddings.py --against OTHER/src [--rounds 3]

measures this checkout's server (B) against another source tree's (A), interleaved A/B: 8
concurrent clients of one sentence each, and batches of 32 one at a time; the medians and B/A.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bert_gguf import convert
from bench.compare import _free_port, _start

BATCH = 32
OURS = "mlxcel /v1/embeddings"
INFINITY = "infinity-emb /embeddings"
CLIENTS = 16
# The concurrency of the A/B measurement (--against), and its requests per round.
AB_CLIENTS = 8
AB_REQUESTS = 128
TEXT = (
    "the quick brown fox jumps over a lazy dog while people watch from the river bank in the "
    "morning light and a train passes slowly across the old stone bridge"
)
WORDS = TEXT.split()


def sentences(count: int, seed: int = 0) -> list[str]:
    """Sentences of 8 to 24 words."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=rng.integers(8, 25))) for _ in range(count)]


def rate(run: Callable[[list[str]], object], texts: list[str]) -> float:
    """Sentences per second, at batch 32."""
    began = time.perf_counter()
    for start in range(0, len(texts), BATCH):
        run(texts[start : start + BATCH])
    return len(texts) / (time.perf_counter() - began)


def onnx_engine(model_dir: Path, out: Path, threads: int) -> Callable[[list[str]], object]:
    """MiniLM exported to ONNX, mean-pooled by hand, on ONNX Runtime's CPU provider."""
    import onnxruntime as ort
    import torch
    from transformers import AutoModel, AutoTokenizer

    from mlxcel.backends.embeddings.onnx_models import session_options

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModel.from_pretrained(str(model_dir)).eval().requires_grad_(False)

    class Hidden(torch.nn.Module):
        def forward(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> object:
            return model(input_ids=ids, attention_mask=mask, token_type_ids=types)[0]

    sample = tokenizer(["a b", "c"], padding=True, return_tensors="pt")
    names = ["input_ids", "attention_mask", "token_type_ids"]
    torch.onnx.export(
        Hidden(),
        tuple(sample[n] for n in names),
        str(out),
        input_names=names,
        output_names=["hidden"],
        dynamic_axes={n: {0: "batch", 1: "tokens"} for n in [*names, "hidden"]},
        dynamo=False,
    )
    # The server's own options (threads, no spinning): the two sides differ by the server only.
    options = session_options(threads)
    session = ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])

    def run(texts: list[str]) -> object:
        encoded = tokenizer(texts, padding=True, return_tensors="np")
        hidden = session.run(None, {n: encoded[n].astype(np.int64) for n in names})[0]
        mask = encoded["attention_mask"][..., None]
        return (hidden * mask).sum(1) / mask.sum(1)

    return run


def engines(model_dir: Path, gguf: Path, work: Path, threads: int) -> dict[str, Callable]:
    """Each in-process engine's batch function."""
    import llama_cpp
    import torch
    from sentence_transformers import SentenceTransformer

    torch.set_num_threads(threads)
    st = SentenceTransformer(str(model_dir), device="cpu")
    llama = llama_cpp.Llama(
        str(gguf), embedding=True, n_ctx=2048, n_batch=2048, n_ubatch=2048,
        n_threads=threads, verbose=False,
    )  # fmt: skip
    return {
        "sentence-transformers (torch)": lambda b: st.encode(b, batch_size=BATCH),
        "onnxruntime": onnx_engine(model_dir, work / "minilm.onnx", threads),
        "llama.cpp (F32 GGUF)": lambda b: llama.embed(b),
    }


def infinity_server(binary: str, model_dir: Path, threads: int) -> tuple[Any, str]:
    """infinity-emb's server on the folder (torch engine, batch 32), and its embeddings URL."""
    port = _free_port()
    command = [binary, "v2", "--model-id", str(model_dir), "--port", str(port)]
    command += ["--batch-size", str(BATCH), "--device", "cpu", "--no-model-warmup"]
    os.environ.update(DO_NOT_TRACK="1", INFINITY_ANONYMOUS_USAGE_STATS="0")
    os.environ["OMP_NUM_THREADS"] = str(threads)
    return _start(command, port, "/health"), f"http://127.0.0.1:{port}/embeddings"


def main() -> None:
    """Measure every side and print the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--infinity", help="infinity_emb executable (default: from PATH)")
    parser.add_argument(
        "--against", type=Path, help="another mlxcel source tree: measure the two servers A/B"
    )
    parser.add_argument("--images", action="store_true", help="measure CLIP image embeddings")
    parser.add_argument("--shape", choices=("tiny", "base"), default="base")
    parser.add_argument("--images-count", type=int, default=64)
    args = parser.parse_args()
    infinity = args.infinity or shutil.which("infinity_emb")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.images:
        from bench.image_embeddings import image_bench

        image_bench(args, infinity)
        return
    if args.against is not None:
        boundary(args)
        return
    from mlxcel.weights import default_embedding_model

    model_dir = default_embedding_model()
    texts = sentences(args.sentences)
    singles = sentences(CLIENTS, seed=1)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        gguf = convert(model_dir, work / "minilm.gguf")
        local = engines(model_dir, gguf, work, args.threads)
        port = _free_port()
        command = [sys.executable, "-m", "mlxcel.cli", "serve", "--port", str(port)]
        command += ["--threads", str(args.threads), "--embedding-model", "default"]
        servers = [_start(command, port, "/health")]
        url = f"http://127.0.0.1:{port}/v1/embeddings"
        try:
            with httpx.Client(timeout=600) as http:

                def ours(batch: list[str]) -> object:
                    return http.post(url, json={"input": batch}).raise_for_status()

                sides = [*local.items(), (OURS, ours)]
                if infinity:
                    process, peer_url = infinity_server(infinity, model_dir, args.threads)
                    servers.append(process)

                    def peer(batch: list[str]) -> object:
                        body = {"input": batch, "model": str(model_dir)}
                        return http.post(peer_url, json=body).raise_for_status()

                    sides.append((INFINITY, peer))
                best: dict[str, float] = {}
                batching = Batching()
                # The client threads start before any timing, and every request goes through
                # the one keep-alive client: both arms pay the same small client cost.
                with ThreadPoolExecutor(CLIENTS) as pool:
                    list(pool.map(lambda s: ours([s]), singles))
                    for _ in range(args.rounds):
                        for name, run in sides:
                            run(texts[:BATCH])
                            best[name] = max(best.get(name, 0.0), rate(run, texts))
                        batching.measure(ours, local["onnxruntime"], pool, singles)
        finally:
            for server in servers:
                server.terminate()
                server.wait(timeout=30)
    report(best, batching, args)


class Batching:
    """The cross-request batching arms (each round's best kept), and the engine's own gain
    from one forward of the 16 sentences over 16 forwards of one: no server can batch
    the requests into less time than that one forward, so serial / batch-of-16 bounds the gain."""

    def __init__(self) -> None:
        self.serial_s = self.concurrent_s = self.alone_s = self.together_s = float("inf")

    def measure(
        self, ours: Callable, engine: Callable, pool: ThreadPoolExecutor, singles: list[str]
    ) -> None:
        self.serial_s = min(self.serial_s, timed(lambda: [ours([s]) for s in singles]))
        self.concurrent_s = min(
            self.concurrent_s, timed(lambda: list(pool.map(lambda s: ours([s]), singles)))
        )
        self.alone_s = min(self.alone_s, timed(lambda: [engine([s]) for s in singles]))
        self.together_s = min(self.together_s, timed(lambda: engine(singles)))


def timed(run: Callable[[], object]) -> float:
    """Seconds `run` takes."""
    began = time.perf_counter()
    run()
    return time.perf_counter() - began


def boundary(args: argparse.Namespace) -> None:
    """This checkout's server (B) against the one in --against (A), both up, measured in turn."""
    here = Path(__file__).resolve().parent.parent / "src"
    singles = sentences(AB_REQUESTS, seed=2)
    texts = sentences(args.sentences)
    servers = {}
    try:
        for name, src in (("A", args.against), ("B", here)):
            port = _free_port()
            command = [sys.executable, "-m", "mlxcel.cli", "serve", "--port", str(port)]
            command += ["--threads", str(args.threads), "--embedding-model", "default"]
            servers[name] = (_start(command, port, "/health", src), port)
        runs: dict[str, list[tuple[float, float]]] = {"A": [], "B": []}
        with httpx.Client(timeout=600, limits=httpx.Limits(max_connections=AB_CLIENTS)) as http:
            for round_ in range(1, args.rounds + 1):
                for name, (_, port) in servers.items():
                    url = f"http://127.0.0.1:{port}/v1/embeddings"

                    def post(batch: list[str], url: str = url) -> object:
                        return http.post(url, json={"input": batch}).raise_for_status()

                    post(texts[:BATCH])
                    with ThreadPoolExecutor(AB_CLIENTS) as pool:
                        began = time.perf_counter()
                        list(pool.map(lambda s: post([s]), singles))
                        concurrent = len(singles) / (time.perf_counter() - began)
                    figures = (concurrent, rate(post, texts))
                    runs[name].append(figures)
                    print(
                        f"round {round_} {name}: {figures[0]:.1f} sentences/s from "
                        f"{AB_CLIENTS} concurrent single-sentence clients, {figures[1]:.1f} at "
                        f"batch {BATCH}",
                        flush=True,
                    )
    finally:
        for process, _ in servers.values():
            process.terminate()
            process.wait(timeout=30)
    med = {n: [statistics.median(f[i] for f in runs[n]) for i in range(2)] for n in runs}
    print(f"medians, B/A (B: this checkout, A: {args.against}):")
    labels = (f"{AB_CLIENTS} concurrent clients", f"batch {BATCH}, one at a time")
    for i, label in enumerate(labels):
        b, a = med["B"][i], med["A"][i]
        print(f"  {label + ':':30}{b:.1f} / {a:.1f} = {b / a:.3f}x")


def report(best: dict[str, float], batching: Batching, args: object) -> None:
    """The table and the ratios."""
    print(f"all-MiniLM-L6-v2, batch {BATCH}, {args.sentences} sentences, {args.threads} threads")  # type: ignore[attr-defined]
    for name, value in best.items():
        print(f"  {name:32s} {value:8.1f} sentences/s")
    ours = best.pop(OURS)
    server = best.pop(INFINITY, None)
    peer = max(best, key=lambda n: best[n])
    print(f"ours / best in-process ({peer}): {ours / best[peer]:.2f}x (target >= 0.9x)")
    if server is None:
        print("ours / infinity-emb: not measured (no infinity_emb: give --infinity PATH)")
    else:
        print(f"ours / infinity-emb server: {ours / server:.2f}x (target >= 1.2x)")
    b = batching
    print(
        f"{CLIENTS} concurrent single-sentence clients vs one at a time: "
        f"{b.serial_s / b.concurrent_s:.2f}x ({b.serial_s:.3f} s vs {b.concurrent_s:.3f} s; "
        "target >= 3x)"
    )
    round_trip_ms = (b.serial_s - b.alone_s) / CLIENTS * 1e3
    print(
        f"  onnxruntime in process, the same {CLIENTS}: one at a time {b.alone_s:.3f} s, as one "
        f"batch {b.together_s:.3f} s ({b.alone_s / b.together_s:.2f}x); the server's round trip "
        f"adds {round_trip_ms:.1f} ms a request; bound on the gain, one at a time through the "
        f"server / one batch in process: {b.serial_s / b.together_s:.2f}x"
    )


if __name__ == "__main__":
    main()
