"""mlxcel against its engine, llama-server and its Python peer, on the same GGUF, in one run.

    python bench/compare.py [--model PATH.gguf|coder | --shape smollm2-135m|qwen2.5-0.5b]
                            [--threads 1,all,default] [--rounds 3] [--spec-model PATH.gguf|coder]

Measures on this machine, for each of `--threads`' ways of giving the servers threads (a
number: that many each; `all`: every usable core each; `default`: each server's own default,
no thread flag, as a user who passes none gets): the raw engine (llama-cpp-python's low-level
API in-process, at that many threads, or llama.cpp's default, the physical cores: prompt
evaluation, single-sequence decode, and 8 sequences decoded together), then the servers
(bench/servers.py), each with 8 slots and the same context: llama.cpp's own `llama-server`
(built once by bench/llama_server.py against the same engine libraries), llama-cpp-python's
own server (`python -m llama_cpp.server`) and `mlxcel serve`, every one at 1, 2, 4 and 8
clients (2 requests per client), which bench/plot.py draws under bench/results/; then
`--rounds` - 1 more rounds of llama-server and mlxcel alone at 1 and 8 clients, turn about
(the first of each round alternating), so the machine's load falls on both alike. Every round
is printed with the load, then each target as a ratio of the medians over the rounds, and what
load moves least: the engine thread's CPU seconds for the same tokens and the engine steps
(llama-server's n_decode_total against mlxcel_decode_steps_total) at 8 clients; last, the
speculative decoding ratio (bench/speculative.py, n-gram against plain) on `--spec-model`
where given. `--shape` builds (once, into bench/.cache) a random-weight Q4_0 GGUF of
a real model's shape with bench/models.py; every target generates until max_tokens there too.
`--model coder` is the real Qwen2.5-Coder-0.5B-Instruct (bench/coder_model.py).

    python bench/compare.py --ollama [--rounds 3] [--threads 1]

measures Ollama's /api/chat against /v1/chat/completions, streamed, on one mlxcel server and
the same model (bench/ollama_api.py): TTFT and decode rate, and their ratio.

    python bench/compare.py --against OTHER/src [--rounds 3] [--threads 1]

measures instead what the process boundary costs: `mlxcel serve` from this checkout (each
model in a worker process) and from another source tree (say `git archive` of a commit that
served in-process), interleaved A/B/A/B on the same GGUF, and prints every run, then the
medians' ratios: single-stream decode, 8-stream aggregate decode and TTFT at 8 clients.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import llama_cpp
from llama_cpp import _logger as llama_logger

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_report import engine_ratios, report
from models import CACHE_DIR, SHAPES, build
from ollama_api import ollama_ratio
from plot import write
from serve import make_prompts, run_level, summarize
from servers import Measured, _free_port, _start, measure

from mlxcel.config.cores import physical_cores, usable_cores

WARM_STEPS = 8
# Concurrency levels of the first round (the plot); later rounds measure 1 and 8 only.
LEVELS = [1, 2, 4, 8]
RESULTS = Path(__file__).resolve().parent / "results"


def _context(model: object, n_ctx: int, n_seq: int, threads: int) -> object:
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_batch, params.n_ubatch = n_ctx, 512, 512
    params.n_seq_max, params.n_threads, params.n_threads_batch = n_seq, threads, threads
    return llama_cpp.llama_init_from_model(model, params)


def raw_engine(
    path: Path, threads: int, n_seq: int, prompt_len: int, steps: int, stagger: int = 0
) -> tuple[float, float]:
    """Raw engine: prompt tokens/s, then decode tokens/s of `n_seq` greedy sequences together.

    With `stagger`, sequence i's prompt is `stagger * i` tokens longer (the mean kept at
    `prompt_len`): the sequences sit at different positions, as a server's streams do.
    """
    llama_cpp.llama_backend_init()
    llama_logger.set_verbose(False)
    model = llama_cpp.llama_model_load_from_file(
        str(path).encode(), llama_cpp.llama_model_default_params()
    )
    room = prompt_len + stagger * n_seq + WARM_STEPS + steps + 8
    ctx = _context(model, room * n_seq, n_seq, threads)
    vocab = llama_cpp.llama_model_get_vocab(model)
    batch = llama_cpp.llama_batch_init(max(512, n_seq), 0, 1)
    samplers = [llama_cpp.llama_sampler_init_greedy() for _ in range(n_seq)]

    def decode(items: list[tuple[int, int, int, bool]]) -> None:
        for i, (token, pos, seq, logits) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = token, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, logits
        batch.n_tokens = len(items)
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    lengths = [prompt_len + stagger * (2 * s - n_seq + 1) // 2 for s in range(n_seq)]
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    last = []
    began = time.perf_counter()
    for seq, length in enumerate(lengths):
        prompt = [(1000 + 7 * i) % n_vocab for i in range(length)]
        for start in range(0, length, 512):
            chunk = prompt[start : start + 512]
            decode([(t, start + i, seq, start + i == length - 1) for i, t in enumerate(chunk)])
        last.append(llama_cpp.llama_sampler_sample(samplers[seq], ctx, len(chunk) - 1))
    prefill = sum(lengths) / (time.perf_counter() - began)
    # The first decode steps are not timed: the servers are measured warm, so is the engine.
    for step in range(WARM_STEPS + steps):
        if step == WARM_STEPS:
            began = time.perf_counter()
        decode([(last[s], lengths[s] + step, s, True) for s in range(n_seq)])
        last = [llama_cpp.llama_sampler_sample(samplers[s], ctx, s) for s in range(n_seq)]
    elapsed = time.perf_counter() - began
    for sampler in samplers:
        llama_cpp.llama_sampler_free(sampler)
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return prefill, n_seq * steps / elapsed


def serve_levels(base_url: str, levels: list[int], args: argparse.Namespace) -> dict[int, dict]:
    """bench/serve.py's measurement at each concurrency level against one server."""
    results = {}
    for level in levels:
        prompts = make_prompts(level * 2, args.prompt_tokens, False, level)
        samples, wall = asyncio.run(run_level(base_url, "default", prompts, level, args.max_tokens))
        results[level] = summarize(level, samples, wall)
    return results


def prefix_ttft(base_url: str, prefix_words: int) -> tuple[float, float]:
    """TTFT of a ~2,000-token prompt cold, then again with the same prefix cached."""
    prefix = make_prompts(1, prefix_words, True, 0)[0]
    times = []
    for suffix in (" first question", " second question"):
        samples, _ = asyncio.run(run_level(base_url, "default", [prefix + suffix], 1, 4))
        times.append(samples[0].ttft)
    return times[0], times[1]


def model_file(args: argparse.Namespace) -> Path:
    """The GGUF to measure: --model, a --shape built or found in the cache, or the default."""
    if args.shape is None and str(args.model) == "coder":
        from coder_model import coder_gguf

        return coder_gguf()
    if args.shape is None:
        from mlxcel.weights import resolve_model

        return resolve_model(str(args.model) if args.model else None)
    built = build(SHAPES[args.shape], args.cache)
    print(f"model: {built.path} ({built.summary()})")
    return built.path


def measure_ours(
    path: Path, args: argparse.Namespace, src: Path | None = None
) -> tuple[dict[int, dict], float, float]:
    """mlxcel serve at 1 and 8 clients, then its cold and warm 2,000-token-prefix TTFT; from
    `src` if given, and then without the prefix TTFT (0, 0)."""
    port = _free_port()
    mlxcel = Path(sys.executable).parent / "mlxcel"
    ours_proc = _start(
        [
            str(mlxcel),
            "serve",
            "-m",
            str(path),
            "--port",
            str(port),
            "--threads",
            str(thread_count(args.threads.split(",")[0]) or physical_cores()),
            "-np",
            "8",
            "-c",
            str(8 * 4096),
            "--log-level",
            "warning",
        ],
        port,
        "/health",
        src,
    )
    try:
        ours = serve_levels(f"http://127.0.0.1:{port}/v1", [1, 8], args)
        cold, warm = prefix_ttft(f"http://127.0.0.1:{port}/v1", 2000) if src is None else (0, 0)
    finally:
        ours_proc.terminate()
        ours_proc.wait()
    return ours, cold, warm


def thread_count(mode: str) -> int | None:
    """A `--threads` way's count for each server: a number, every usable core (`all`), or None
    (`default`: each server picks its own)."""
    if mode == "all":
        return usable_cores()
    return None if mode == "default" else int(mode)


def main() -> None:
    """Run every measurement and print the ratios the throughput targets are stated in."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--model", type=Path, help="GGUF, or coder (default: the embedded SmolLM2)")
    which.add_argument(
        "--shape", choices=sorted(SHAPES), help="a random-weight Q4_0 GGUF of this model's shape"
    )
    parser.add_argument("--cache", type=Path, default=CACHE_DIR, help="where --shape builds")
    parser.add_argument(
        "--threads",
        default="1,all,default",
        help="ways to give each server threads, measured in turn: N, all, default",
    )
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=128)
    parser.add_argument(
        "--against", type=Path, help="another mlxcel source tree: measure the two servers A/B"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of llama-server and mlxcel (or A/B pairs)"
    )
    parser.add_argument(
        "--spec-model", help="measure the speculative ratio too, on this GGUF or coder"
    )
    parser.add_argument(
        "--ollama", action="store_true", help="Ollama's /api/chat against OpenAI's chat only"
    )
    args = parser.parse_args()
    path = model_file(args)
    if args.ollama:
        threads = thread_count(args.threads.split(",")[0])
        ollama_ratio(path, args.rounds, 4, args.max_tokens, threads)
        return
    if args.against is not None:
        boundary(path, args)
        return
    for mode in args.threads.split(","):
        threads = thread_count(mode)
        print(f"== threads: {mode} ({threads or 'each server its default'})", flush=True)
        compare(path, args, mode, threads)
    if args.spec_model is not None:
        speculative_ratio(path, args)


def compare(path: Path, args: argparse.Namespace, mode: str, threads: int | None) -> None:
    """The raw engine, then the servers' rounds, their ratios and round 1's plot."""
    engine_threads = threads or physical_cores()
    prefill, raw1 = raw_engine(path, engine_threads, 1, args.prompt_tokens, args.steps)
    _, raw8 = raw_engine(path, engine_threads, 8, args.prompt_tokens, args.steps)
    # Served streams start at different times, so their positions spread over max_tokens.
    stagger = args.max_tokens // 8
    _, staggered = raw_engine(path, engine_threads, 8, args.prompt_tokens, args.steps, stagger)
    print(
        f"raw engine at {engine_threads} threads: prefill {prefill:.1f} tok/s "
        f"({args.prompt_tokens}-token prompt); decode {raw1:.1f} tok/s at 1 sequence, "
        f"{raw8:.1f} tok/s aggregate at 8 in step ({staggered:.1f} with positions {stagger} "
        "tokens apart, as served streams are)"
    )
    runs = peers(path, args, threads)
    native, theirs, ours = (_median_levels(runs[name]) for name in SERVERS)
    cold, warm = runs["mlxcel"][0].extra or (0.0, 0.0)
    report(native, theirs, ours, (raw1, raw8, staggered), cold, warm)
    engine_ratios(runs["llama-server"], runs["mlxcel"])
    title = (
        f"{path.name}: {args.prompt_tokens}-token prompts, {args.max_tokens} generated, "
        f"threads {mode} -np 8; 2 requests per client; load {runs['mlxcel'][0].load:.1f}"
    )
    first = {name: {str(k): v for k, v in runs[name][0].levels.items()} for name in SERVERS}
    png = write({"title": title, "servers": first}, RESULTS, f"compare-{path.stem}-t{mode}")
    print(f"plot of round 1: {png}")


def speculative_ratio(path: Path, args: argparse.Namespace) -> None:
    """The speculative decoding target: bench/speculative.py's plain and n-gram servers on a
    copy-heavy prompt, interleaved for --rounds runs (a random-weight --shape copies nothing:
    --spec-model names a real model for it)."""
    from coder_model import coder_gguf
    from speculative import measure, report

    model = coder_gguf() if args.spec_model == "coder" else Path(args.spec_model)
    print(f"speculative decoding on {model.name}, single stream, copy-heavy prompt:")
    ngram = ["--spec-type", "ngram-simple"]
    threads = thread_count(args.threads.split(",")[0]) or physical_cores()
    report(measure(model, threads, args.rounds, 256, {"ngram": ngram}))


SERVERS = ("llama-server", "llama_cpp.server", "mlxcel")


def peers(path: Path, args: argparse.Namespace, threads: int | None) -> dict[str, list[Measured]]:
    """Round 1: every server at each of LEVELS; then llama-server and mlxcel at 1 and 8
    clients, alternately (which goes first alternates too), for the remaining rounds."""
    runs: dict[str, list[Measured]] = {name: [] for name in SERVERS}
    for round_ in range(1, args.rounds + 1):
        order = list(SERVERS) if round_ == 1 else ["llama-server", "mlxcel"]
        if round_ % 2 == 0:
            order.reverse()
        for name in order:
            levels = LEVELS if round_ == 1 else [1, 8]
            extra = _prefix_ttft if name == "mlxcel" and round_ == 1 else None
            m = measure(name, path, levels, args.prompt_tokens, args.max_tokens, threads, extra)
            runs[name].append(m)
            at8 = m.levels[8]
            print(
                f"round {round_} {name + ':':17} {m.levels[1]['throughput_tok_s']:.1f} tok/s at 1, "
                f"{at8['throughput_tok_s']:.1f} at 8; at 8: TTFT {at8['ttft_median_ms']:.0f} ms, "
                f"ITL {at8['itl_median_ms']:.1f} ms; engine thread {m.engine_cpu_s:.1f} CPU s, "
                f"{m.steps:.0f} steps of {m.busy_per_step:.2f} sequences; load {m.load:.1f}",
                flush=True,
            )
    return runs


def _prefix_ttft(base_url: str) -> tuple[float, float]:
    return prefix_ttft(base_url, 2000)


def _median_levels(runs: list[Measured]) -> dict[int, dict]:
    """Each figure's median over the runs, at the levels every run measured."""
    levels = set.intersection(*(set(m.levels) for m in runs))
    return {
        level: {
            key: statistics.median(m.levels[level][key] for m in runs)
            for key in runs[0].levels[level]
        }
        for level in sorted(levels)
    }


def _figures(levels: dict[int, dict]) -> tuple[float, float, float]:
    """Single-stream decode, 8-stream aggregate decode (tok/s, from the median inter-token
    latency) and the median TTFT at 8 clients (ms)."""
    return (
        1000 / levels[1]["itl_median_ms"],
        8 * 1000 / levels[8]["itl_median_ms"],
        levels[8]["ttft_median_ms"],
    )


def boundary(path: Path, args: argparse.Namespace) -> None:
    """This checkout's server (B) against the one in --against (A), interleaved A/B/A/B."""
    here = Path(__file__).resolve().parent.parent / "src"
    runs: dict[str, list[tuple[float, float, float]]] = {"A": [], "B": []}
    for round_ in range(1, args.rounds + 1):
        for name, src in (("A", args.against), ("B", here)):
            levels, _, _ = measure_ours(path, args, src)
            figures = _figures(levels)
            runs[name].append(figures)
            print(
                f"round {round_} {name} ({src}): decode {figures[0]:.1f} tok/s at 1 stream, "
                f"{figures[1]:.1f} aggregate at 8; median TTFT at 8 {figures[2]:.0f} ms",
                flush=True,
            )
    med = {name: [statistics.median(f[i] for f in runs[name]) for i in range(3)] for name in runs}
    print("medians, B/A (B: this checkout):")
    labels = ("single-stream decode tok/s", "8-stream aggregate tok/s", "median TTFT at 8, ms")
    for i, label in enumerate(labels):
        print(
            f"  {label + ':':28}{med['B'][i]:.1f} / {med['A'][i]:.1f} = "
            f"{med['B'][i] / med['A'][i]:.3f}x"
        )


if __name__ == "__main__":
    main()
