"""Per-token cost of p-less sampling against plain top-p, on the same model in one run.

    python bench/p_less.py [--shape smollm2-135m|qwen2.5-0.5b ...] [--threads 1] [--steps 256]

For the default model (SmolLM2-135M, a 49k vocabulary) and a random-weight Q4_0 GGUF of
Qwen2.5-0.5B's shape (152k, built once into bench/.cache by bench/models.py), mlxcel's own
llama.cpp generator decodes one sequence under each sampler set-up, the sequences taking turns
token by token, every other truncation off (top_k 0, min_p 0) so each sampler sees the whole
vocabulary. It prints the median time per token of each and p-less's difference from top-p as
a share of it (target: within 2%). Then the samplers alone on a vocabulary of that size: the
llama.cpp chain applied to a logits array, and, where mlx is installed, the MLX slot sampler's
mx ops, each with its cost as a share of that llama.cpp decoded token.
Absolute numbers move with the machine's load; the ratios from one run are what to compare.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import _logger as llama_logger

from mlxcel.backends.llamacpp.generator import LlamaCppGenerator, LlamaCppOptions
from mlxcel.backends.llamacpp.sampling import build_chain
from mlxcel.engine.types import Feed, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import CACHE_DIR, SHAPES, build

# Every set-up samples at temperature 1 from the whole vocabulary but for its own truncation.
SETUPS = {
    "top-p 0.95": {"top_p": 0.95},
    "p-less": {"p_less": True},
    "p-less-norm": {"p_less_norm": True},
}
BASELINE = "top-p 0.95"
PROMPT_TOKENS = 32
WARM_STEPS = 4


def params(setup: str) -> SamplingParams:
    fields: dict[str, object] = {"top_p": 1.0, **SETUPS[setup]}
    return SamplingParams(max_tokens=1 << 20, temperature=1.0, top_k=0, min_p=0.0, seed=0, **fields)  # type: ignore[arg-type]


def model_file(shape: str | None, cache: Path) -> Path:
    """The default model's GGUF for None, else the shape's random-weight GGUF."""
    if shape is None:
        from mlxcel.weights import default_model_path

        return default_model_path()
    return build(SHAPES[shape], cache).path


def decode_ms(path: Path, threads: int, steps: int) -> tuple[dict[str, float], int]:
    """Median ms per decoded token (forward pass and sampling) of each set-up; the vocabulary.

    Each set-up decodes in a slot of its own and the slots take turns token by token, so a
    change in the machine's load falls on all of them alike.
    """
    # llama.cpp rounds the context to 256s, and each slot's share must come out whole.
    room = -(-(PROMPT_TOKENS + WARM_STEPS + steps + 8) // 256) * 256
    options = LlamaCppOptions(
        ctx_size=room * len(SETUPS),
        threads=threads,
        parallel=len(SETUPS),
        batch_size=512,
        ubatch_size=512,
    )
    generator = LlamaCppGenerator(path, options)
    prompt = [(1000 + 7 * i) % generator.n_vocab for i in range(PROMPT_TOKENS)]
    times: dict[str, list[float]] = {setup: [] for setup in SETUPS}
    last: dict[str, int] = {}
    try:
        for slot, setup in enumerate(SETUPS):
            generator.open_slot(slot, params(setup))
            sample = generator.step([Feed(slot, prompt, True)])[0]
            assert sample is not None
            last[setup] = sample.token
        for step in range(WARM_STEPS + steps):
            for slot, setup in enumerate(SETUPS):
                began = time.perf_counter()
                sample = generator.step([Feed(slot, (last[setup],), True)])[0]
                if step >= WARM_STEPS:
                    times[setup].append((time.perf_counter() - began) * 1000)
                assert sample is not None
                last[setup] = sample.token
    finally:
        generator.close()
    medians = {setup: statistics.median(values) for setup, values in times.items()}
    return medians, generator.n_vocab


def _timed(run: Callable[[], None], repeats: int) -> float:
    """Median µs of one call of `run`."""
    run()
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        times.append((time.perf_counter() - began) * 1e6)
    return statistics.median(times)


def logits_like(n_vocab: int) -> np.ndarray:
    """Logits shaped like a language model's: a normal spread, a few tokens standing out."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(n_vocab).astype(np.float32) * 2
    logits[rng.choice(n_vocab, 8, replace=False)] += 8
    return logits


def llama_sampler_us(n_vocab: int, repeats: int) -> dict[str, float]:
    """Median µs of each set-up's llama.cpp chain over a fresh candidate array of n_vocab."""
    fresh = np.zeros(n_vocab, dtype=[("id", np.int32), ("logit", np.float32), ("p", np.float32)])
    fresh["id"] = np.arange(n_vocab)
    fresh["logit"] = logits_like(n_vocab)
    data = (llama_cpp.llama_token_data * n_vocab)()
    array = llama_cpp.llama_token_data_array(
        ctypes.cast(data, ctypes.POINTER(llama_cpp.llama_token_data)), n_vocab, -1, False
    )
    result = {}
    for setup in ["copy only", *SETUPS]:
        chain = None if setup == "copy only" else build_chain(None, n_vocab, 0, params(setup))

        def run(chain: object = chain) -> None:
            ctypes.memmove(data, fresh.ctypes.data, fresh.nbytes)
            array.size, array.selected, array.sorted = n_vocab, -1, False
            if chain is not None:
                llama_cpp.llama_sampler_apply(chain, ctypes.byref(array))

        result[setup] = _timed(run, repeats)
        if chain is not None:
            llama_cpp.llama_sampler_free(chain)
    copy = result.pop("copy only")
    return {setup: us - copy for setup, us in result.items()}


def mlx_sampler_us(n_vocab: int, repeats: int) -> dict[str, float] | None:
    """Median µs of each set-up's MLX slot sampler on one row of n_vocab logits (evaluated)."""
    try:
        import mlx.core as mx

        from mlxcel.backends.mlx.sampling import SlotSampler
    except ImportError:
        return None
    logits = mx.array(logits_like(n_vocab))
    mx.eval(logits)
    result = {}
    for setup in SETUPS:
        sampler = SlotSampler(params(setup), n_vocab=n_vocab, end_of_generation=[], dry=None)
        result[setup] = _timed(lambda s=sampler: mx.eval(s.choose(logits)[0]), repeats)
    return result


def report(name: str, values: dict[str, float], unit: str, per_token_ms: float) -> None:
    """One line per set-up: its figure, its ratio to top-p, its cost over top-p per decoded
    token; a sampler alone (in µs) also as its whole cost per decoded token."""
    base = values[BASELINE]
    scale = 1 if unit == "ms" else 1e-3
    for setup, value in values.items():
        extra = (value - base) * scale / per_token_ms * 100
        alone = "" if unit == "ms" else f"  (alone {value * scale / per_token_ms * 100:5.2f}%)"
        print(
            f"  {name:14}{setup:13}{value:9.3f} {unit}  {value / base:5.3f}x top-p"
            f"  {extra:+6.2f}% of a decoded token{alone}"
        )


def main() -> None:
    """Measure each model and print the figures and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--shape",
        action="append",
        choices=sorted(SHAPES),
        help="random-weight model shapes to measure (default: qwen2.5-0.5b), after the default",
    )
    parser.add_argument("--cache", type=Path, default=CACHE_DIR, help="where --shape builds")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=256, help="timed tokens per set-up")
    parser.add_argument("--repeats", type=int, default=200, help="sampler-alone calls")
    args = parser.parse_args()
    llama_logger.set_verbose(False)
    for shape in [None, *(args.shape or ["qwen2.5-0.5b"])]:
        path = model_file(shape, args.cache)
        decode, n_vocab = decode_ms(path, args.threads, args.steps)
        per_token = decode[BASELINE]
        print(f"{shape or 'default model'} ({path.name}, vocabulary {n_vocab}):")
        report("decode", decode, "ms", per_token)
        report("llama.cpp", llama_sampler_us(n_vocab, args.repeats), "us", per_token)
        mlx = mlx_sampler_us(n_vocab, args.repeats)
        if mlx is not None:
            report("MLX sampler", mlx, "us", per_token)


if __name__ == "__main__":
    main()
