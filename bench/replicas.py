"""Replicas: prefix routing against round-robin on a shared-prefix workload, and two replicas
of one thread against one worker of two threads and llama-server on the same cores.

    python bench/replicas.py                     # the issue's sizes (slow on 2 cores)
    python bench/replicas.py --prompt-words 300 --requests 32 --levels 2,8   # a brief run

Shared prefixes: `--systems` distinct system prompts of `--prompt-words` words, `--requests`
requests in a seeded random order (each a system prompt and its own question), from
`--clients` clients, on `--replicas` replicas of the default model at one thread each; for
each routing policy, the cache-hit fraction (cached / prompt tokens, from /metrics) and the
median TTFT, and their ratios. Then TTFT against concurrency (`--levels`) for each policy,
plotted under bench/results/. Equal cores: aggregate tokens/s of 8 clients on the default model.
Through Ray, against Ray Serve's default router: bench/replicas_ray.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_server import build_llama_server
from serve import make_prompts, run_level, summarize
from servers import _free_port, _start

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
MLXCEL = Path(sys.executable).parent / "mlxcel"


def default_model() -> Path:
    """The embedded default model's GGUF."""
    sys.path.insert(0, str(ROOT / "src"))
    from mlxcel.weights import resolve_model

    return resolve_model(None)


def workload(args: argparse.Namespace) -> list[str]:
    """The shared-prefix prompts, in their seeded random order."""
    rng = random.Random(args.seed)
    words = ["rule", "item", "desk", "file", "note", "case", "form", "list", "page", "part"]
    systems = [
        f"System {i}. " + " ".join(rng.choice(words) for _ in range(args.prompt_words))
        for i in range(args.systems)
    ]
    order = [i % args.systems for i in range(args.requests)]
    rng.shuffle(order)
    return [f"{systems[s]}\nQuestion {n}: what is item {n}?" for n, s in enumerate(order)]


def metric(port: int, name: str) -> float:
    page = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    return sum(
        float(line.rpartition(" ")[2])
        for line in page.splitlines()
        if line.partition("{")[0].partition(" ")[0] == name
    )


def routed(port: int) -> dict[str, float]:
    """The router's decisions so far, by kind."""
    page = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    found: dict[str, float] = {}
    for line in page.splitlines():
        if line.startswith("mlxcel_replica_routed_total{"):
            decision = line.partition('decision="')[2].partition('"')[0]
            found[decision] = found.get(decision, 0.0) + float(line.rpartition(" ")[2])
    return found


def mlxcel(*flags: str) -> tuple[Any, int]:
    port = _free_port()
    line = [str(MLXCEL), "serve", "--log-level", "warning", *flags, "--port", str(port)]
    return _start(line, port, "/health", ROOT / "src"), port


def stop(process: Any) -> None:
    process.terminate()
    process.wait(timeout=60)


def shared_prefix(
    args: argparse.Namespace, policy: str, imbalance: int | None = None
) -> dict[str, Any]:
    """One routing policy on the shared-prefix workload, and its TTFT at each level."""
    flags = ["--replicas", str(args.replicas), "--threads", "1", "--replica-routing", policy]
    if imbalance is not None:
        flags += ["--replica-imbalance", str(imbalance)]
    process, port = mlxcel(*flags, *cache_flags(args), "-np", "4", "-c", "16384")
    base = f"http://127.0.0.1:{port}/v1"
    try:
        prompts = workload(args)
        samples, wall = asyncio.run(run_level(base, "default", prompts, args.clients, 16))
        prompt = metric(port, "mlxcel_replica_prompt_tokens_total")
        cached = metric(port, "mlxcel_replica_cached_tokens_total")
        result: dict[str, Any] = {
            "policy": policy,
            "imbalance": imbalance,
            "decisions": routed(port),
            "hit_fraction": cached / prompt if prompt else 0.0,
            **summarize(args.clients, samples, wall),
        }
        levels = {}
        for level in args.levels if imbalance is None else []:
            # The same prefixes again, in a new order: the caches are warm for both policies.
            random.Random(level).shuffle(prompts)
            more, took = asyncio.run(run_level(base, "default", prompts, level, 16))
            levels[level] = summarize(level, more, took)["ttft_median_ms"]
        result["ttft_by_level"] = levels
        return result
    finally:
        stop(process)


def equal_cores(args: argparse.Namespace) -> dict[str, float]:
    """Aggregate tokens/s of 8 clients: 2 replicas x 1 thread, 1 worker x 2 threads,
    llama-server -t 2 -np 8."""
    model = str(default_model())
    prompts = make_prompts(args.requests, 64, fixed=False, seed=args.seed)
    shapes: dict[str, list[str]] = {
        "replicas 2x1": ["--replicas", "2", "--threads", "1", "-np", "4", "-c", "16384"],
        "worker 1x2": ["--threads", "2", "-np", "8", "-c", "32768"],
    }
    rates = {}
    for name, flags in shapes.items():
        process, port = mlxcel("-m", model, *flags)
        try:
            base = f"http://127.0.0.1:{port}/v1"
            samples, wall = asyncio.run(run_level(base, "default", prompts, 8, 64))
            rates[name] = summarize(8, samples, wall)["throughput_tok_s"]
        finally:
            stop(process)
    port = _free_port()
    line = [str(build_llama_server()), "-m", model, "-t", "2", "-tb", "2", "-np", "8"]
    process = _start([*line, "-c", "32768", "--port", str(port)], port, "/health")
    try:
        base = f"http://127.0.0.1:{port}/v1"
        samples, wall = asyncio.run(run_level(base, "default", prompts, 8, 64))
        rates["llama-server -t 2 -np 8"] = summarize(8, samples, wall)["throughput_tok_s"]
    finally:
        stop(process)
    return rates


def plot(
    results: list[dict[str, Any]],
    out: Path,
    title: str = "2 replicas of the default model, shared system prompts",
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for result in results:
        levels = sorted(result["ttft_by_level"])
        ax.plot(levels, [result["ttft_by_level"][n] for n in levels], "o-", label=result["policy"])
    ax.set_xlabel("concurrent clients")
    ax.set_ylabel("median TTFT (ms)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def workload_args(parser: argparse.ArgumentParser) -> None:
    """The shared-prefix workload's sizes (bench/replicas_ray.py's too)."""
    add = parser.add_argument
    add("--systems", type=int, default=8)
    add("--prompt-words", type=int, default=1500)
    add("--requests", type=int, default=64)
    add("--clients", type=int, default=8)
    add("--replicas", type=int, default=2)
    add("--levels", type=lambda s: [int(n) for n in s.split(",")], default=[1, 2, 4, 8])
    add("--seed", type=int, default=7)
    add(
        "--cache-ram",
        type=int,
        help="each replica's --cache-ram in MiB (default: the server's); 0 leaves a replica "
        "only the prefixes its slots hold, as one with memory for part of the prefixes",
    )


def cache_flags(args: argparse.Namespace) -> list[str]:
    """The replicas' --cache-ram, where one is asked for."""
    return [] if args.cache_ram is None else ["--cache-ram", str(args.cache_ram)]


def results_name(stem: str, args: argparse.Namespace, suffix: str) -> str:
    """A results file's name: a run with its own --cache-ram keeps its own files."""
    tag = "" if args.cache_ram is None else f"-cache-ram-{args.cache_ram}"
    return f"{stem}{tag}{suffix}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    workload_args(parser)
    add("--skip-equal-cores", action="store_true")
    add("--skip-routing", action="store_true")
    add(
        "--imbalances",
        type=lambda s: [int(n) for n in s.split(",")],
        default=[],
        help="also run prefix routing at each --replica-imbalance (the default's measurement)",
    )
    args = parser.parse_args()
    for imbalance in args.imbalances:
        swept = shared_prefix(args, "prefix", imbalance)
        print(
            f"imbalance {imbalance}: cache hits {swept['hit_fraction']:.2f}, median TTFT "
            f"{swept['ttft_median_ms']:.0f} ms, decisions {swept['decisions']}"
        )

    RESULTS.mkdir(exist_ok=True)
    if not args.skip_routing:
        routing(args)
    if not args.skip_equal_cores:
        rates = equal_cores(args)
        for name, rate in rates.items():
            print(f"{name:>24}: {rate:.1f} tok/s")
        peer = rates["llama-server -t 2 -np 8"]
        print(f"replicas 2x1 / llama-server: {rates['replicas 2x1'] / peer:.2f}x (target 1.1x)")
        print(f"replicas 2x1 / worker 1x2: {rates['replicas 2x1'] / rates['worker 1x2']:.2f}x")
        save("replicas-equal-cores.json", {"args": vars(args), "tok_s": rates})


def routing(args: argparse.Namespace) -> None:
    """Prefix routing against round-robin: cache hits, TTFT, and TTFT by concurrency."""
    results = [shared_prefix(args, policy) for policy in ("prefix", "round-robin")]
    routed, spread = results
    for result in results:
        print(
            f"{result['policy']:>12}: cache hits {result['hit_fraction']:.2f}, "
            f"median TTFT {result['ttft_median_ms']:.0f} ms, "
            f"{result['throughput_tok_s']:.1f} tok/s, decisions {result['decisions']}"
        )
    ratio = routed["ttft_median_ms"] / spread["ttft_median_ms"]
    print(f"prefix / round-robin median TTFT: {ratio:.2f}x (target at most 0.5x)")
    plot(results, RESULTS / results_name("replicas-ttft", args, ".png"))
    save(results_name("replicas-routing", args, ".json"), {"args": vars(args), "routing": results})


def save(name: str, report: dict[str, Any]) -> None:
    (RESULTS / name).write_text(json.dumps(report, indent=1, default=str) + "\n")
    print(f"wrote bench/results/{name}")


if __name__ == "__main__":
    main()
