"""Replicas on Ray: prefix routing against Ray Serve's default router (power of two choices) on
the shared-prefix workload, and what the Ray path costs against local replicas.

    python bench/replicas_ray.py                                   # the issue's sizes
    python bench/replicas_ray.py --prompt-words 300 --requests 32 --levels 2,8   # brief
    python bench/replicas_ray.py --cache-ram 160 --levels 8   # room for part of the prompts

Starts a one-node Ray cluster of its own on loopback (`ray start --head`, its own temp dir, no
dashboard, ended whatever happens), then serves `--replicas` replicas of the default model at
one thread each through it (`serve --ray`), once with `replica_routing: prefix` (our router,
`models/ray_router.py`) and once with `power-of-two` (Ray's own default router). For each:
the cache-hit fraction (cached / prompt tokens, from each response's usage) and median TTFT
of the workload of bench/replicas.py, then TTFT at each concurrency of `--levels` with warm
caches (plotted in bench/results/replicas-ray-ttft.png). Then the Ray path's cost: TTFT and
decode tokens/s at concurrency 1 on distinct short prompts through Ray against the same
replicas run locally (`--replicas`, no Ray). Ratios are printed; the figures land in
bench/results/replicas-ray.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replicas import (
    RESULTS,
    default_model,
    mlxcel,
    plot,
    results_name,
    routed,
    save,
    stop,
    workload,
    workload_args,
)
from serve import make_prompts, run_level, summarize
from servers import _free_port

RAY = Path(sys.executable).parent / "ray"


@contextlib.contextmanager
def ray_head() -> Iterator[str]:
    """A one-node cluster on loopback; its address. Every process it started is ended after."""
    temp_dir = tempfile.mkdtemp(prefix="mlxcel-bench-ray-")
    port = _free_port()
    flags = ["--node-ip-address=127.0.0.1", f"--port={port}", f"--temp-dir={temp_dir}"]
    flags += ["--include-dashboard=false", "--num-cpus=2", "--disable-usage-stats"]
    head = subprocess.Popen(
        [str(RAY), "start", "--head", "--block", *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
        start_new_session=True,
    )
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while subprocess.run(
            [str(RAY), "status", f"--address={address}"], capture_output=True
        ).returncode:
            if head.poll() is not None or time.monotonic() > deadline:
                token = Path.home() / ".ray" / "auth_token"
                # A local ray.init() leaves one; the head then asks for it, `ray status` not.
                hint = f" ({token} exists: move it away)" if token.exists() else ""
                raise RuntimeError(f"the Ray head did not start{hint}")
            time.sleep(1)
        yield address
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in _session(head.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            time.sleep(2)
        head.wait(30)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _session(leader: int) -> list[int]:
    """The processes of the session the head leads (Ray's workers and replicas too)."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            if entry.name.isdigit():
                stat = (entry / "stat").read_text().rpartition(")")[2].split()
                found += [int(entry.name)] if int(stat[3]) == leader else []
    return found


def on_ray(address: str, policy: str, args: argparse.Namespace, tmp: Path) -> tuple[Any, int]:
    """The default model's replicas on the cluster, routed by `policy`."""
    config = tmp / f"ray-{policy}.yaml"
    config.write_text(
        f"ray: {{address: {address}}}\nmodels:\n  - model: {default_model()}\n"
        f"    replicas: {args.replicas}\n    threads: 1\n    parallel: 4\n    ctx_size: 16384\n"
        f"    replica_routing: {policy}\n    ray_actor_options: {{num_cpus: 1}}\n"
        + ("" if args.cache_ram is None else f"    cache_ram: {args.cache_ram}\n")
    )
    return mlxcel("--config", str(config))


def _level(port: int, prompts: list[str], clients: int, max_tokens: int) -> dict[str, Any]:
    """The prompts from `clients` clients: the cache-hit fraction (cached / prompt tokens,
    from each response's usage) and bench/serve.py's summary."""
    base = f"http://127.0.0.1:{port}/v1"
    samples, wall = asyncio.run(run_level(base, "default", prompts, clients, max_tokens, True))
    prompt_tokens = sum(s.prompt_tokens for s in samples)
    cached = sum(s.cached_tokens for s in samples)
    return {
        "hit_fraction": cached / prompt_tokens if prompt_tokens else 0.0,
        **summarize(clients, samples, wall),
    }


def routing(address: str, args: argparse.Namespace, tmp: Path) -> list[dict[str, Any]]:
    """Each policy on the shared-prefix workload through Ray, then TTFT by concurrency."""
    results = []
    for policy in ("prefix", "power-of-two"):
        process, port = on_ray(address, policy, args, tmp)
        try:
            prompts = workload(args)
            result = {"policy": policy, **_level(port, prompts, args.clients, 16)}
            result["decisions"] = routed(port)
            levels, hits = {}, {}
            for level in args.levels:
                random.Random(level).shuffle(prompts)
                warm = _level(port, prompts, level, 16)
                levels[level] = warm["ttft_median_ms"]
                hits[level] = round(warm["hit_fraction"], 3)
            result["ttft_by_level"] = levels
            result["hits_by_level"] = hits
            if policy == "prefix":
                result["single"] = single(port, args)
            results.append(result)
        finally:
            stop(process)
    return results


def single(port: int, args: argparse.Namespace) -> dict[str, float]:
    """Concurrency 1 on distinct prompts: median TTFT and decode tokens/s."""
    prompts = make_prompts(args.single_requests, 64, fixed=False, seed=args.seed)
    # One request first, so that neither side pays a first request's costs in the figures.
    _level(port, prompts[:1], 1, 8)
    level = _level(port, prompts, 1, args.single_tokens)
    return {
        "ttft_median_ms": level["ttft_median_ms"],
        "decode_tok_s": 1000.0 / level["tpot_median_ms"] if level["tpot_median_ms"] else 0.0,
    }


def local_single(args: argparse.Namespace) -> dict[str, float]:
    model = str(default_model())
    flags = ("--replicas", str(args.replicas), "--threads", "1", "-np", "4", "-c", "16384")
    process, port = mlxcel("-m", model, *flags)
    try:
        return single(port, args)
    finally:
        stop(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add = parser.add_argument
    workload_args(parser)
    add("--single-requests", type=int, default=8, help="requests at concurrency 1")
    add("--single-tokens", type=int, default=64, help="tokens each at concurrency 1")
    args = parser.parse_args()
    RESULTS.mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="mlxcel-bench-"))
    try:
        with ray_head() as address:
            results = routing(address, args, tmp)
        local = local_single(args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for result in results:
        print(
            f"{result['policy']:>12} (Ray): cache hits {result['hit_fraction']:.2f}, "
            f"median TTFT {result['ttft_median_ms']:.0f} ms, "
            f"{result['throughput_tok_s']:.1f} tok/s, "
            f"warm median TTFT by clients {result['ttft_by_level']}, "
            f"warm cache hits by clients {result['hits_by_level']}, "
            f"decisions {result['decisions']}"
        )
    by_prefix, default = results
    print(
        f"prefix / Ray's default router: cache hits {by_prefix['hit_fraction']:.2f} vs "
        f"{default['hit_fraction']:.2f}, median TTFT "
        f"{by_prefix['ttft_median_ms'] / default['ttft_median_ms']:.2f}x (target at most 0.5x)"
    )
    ray = by_prefix["single"]
    extra = ray["ttft_median_ms"] - local["ttft_median_ms"]
    ratio = ray["decode_tok_s"] / local["decode_tok_s"] if local["decode_tok_s"] else 0.0
    print(
        f"concurrency 1, Ray vs local replicas: median TTFT {ray['ttft_median_ms']:.1f} vs "
        f"{local['ttft_median_ms']:.1f} ms ({extra:+.1f} ms, target at most +10), decode "
        f"{ray['decode_tok_s']:.1f} vs {local['decode_tok_s']:.1f} tok/s ({ratio:.2f}x, "
        "target at least 0.95x)"
    )
    title = "2 replicas on Ray, shared system prompts"
    plot(results, RESULTS / results_name("replicas-ray-ttft", args, ".png"), title)
    report = {"args": vars(args), "routing": results, "single_local": local}
    save(results_name("replicas-ray", args, ".json"), report)


if __name__ == "__main__":
    main()
