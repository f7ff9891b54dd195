"""bench/compare.py's printout: each server's figures, then every target as a ratio."""

from __future__ import annotations

import statistics

from servers import Measured


def engine_ratios(native: list[Measured], ours: list[Measured]) -> None:
    """What the load moves least, at 8 clients: the engine thread's CPU for the same tokens
    and the steps it took, mlxcel against llama-server (medians over the rounds)."""
    cpu = [statistics.median(m.engine_cpu_s for m in runs) for runs in (ours, native)]
    steps = [statistics.median(m.steps for m in runs) for runs in (ours, native)]
    busy = [statistics.median(m.busy_per_step for m in runs) for runs in (ours, native)]
    print(
        f"  engine-thread CPU at 8, mlxcel/llama-server: {cpu[0] / cpu[1]:.3f}x "
        f"({cpu[0]:.1f} s / {cpu[1]:.1f} s, the same tokens)"
    )
    print(
        f"  engine steps at 8, mlxcel/llama-server:      {steps[0] / steps[1]:.3f}x "
        f"({steps[0]:.0f} of {busy[0]:.2f} sequences / {steps[1]:.0f} of {busy[1]:.2f})"
    )


def report(
    native: dict[int, dict],
    theirs: dict[int, dict],
    ours: dict[int, dict],
    raw: tuple[float, float, float],
    cold: float,
    warm: float,
) -> None:
    """Each server's figures, then every target as a ratio; `raw` is the raw engine's decode
    at 1 sequence, at 8 in step and at 8 at staggered positions; `native` is llama-server's,
    `theirs` llama_cpp.server's."""
    raw1, raw8, staggered = raw
    servers = (("llama-server", native), ("llama_cpp.server", theirs), ("mlxcel serve", ours))
    for name, levels in servers:
        early = sum(levels[level]["stopped_early"] for level in levels)
        print(
            f"{name + ':':18}{levels[1]['throughput_tok_s']:.1f} tok/s at 1 client, "
            f"{levels[8]['throughput_tok_s']:.1f} at 8; median at 8: TTFT "
            f"{levels[8]['ttft_median_ms']:.0f} ms, ITL {levels[8]['itl_median_ms']:.1f} ms"
            + (f"; {early} requests stopped before max_tokens" if early else "")
        )
    # The raw engine numbers are decode only: a steady batch of sequences, every step one token
    # each. The served equivalent is the gap between tokens while the streams decode, which the
    # median inter-token latency isolates; TPOT also carries the steps in which another
    # request's prompt is evaluated (with 8 clients one arrives every few tokens), so it is shown
    # beside it. Served throughput (output tokens / wall time) pays for prefill and queueing too.
    single = 1000 / ours[1]["itl_median_ms"]
    eight = 8 * 1000 / ours[8]["itl_median_ms"]
    print(
        f"mlxcel decode: {single:.1f} tok/s at 1 stream, {eight:.1f} tok/s aggregate at 8 "
        f"(by TPOT, prompts of arriving requests included: {1000 / ours[1]['tpot_median_ms']:.1f}"
        f" and {8 * 1000 / ours[8]['tpot_median_ms']:.1f})"
    )
    print("ratios (target in brackets):")
    print(f"  single-stream decode vs raw engine:   {single / raw1:.2f}x [>= 0.97]")
    print(
        f"  8 streams vs raw engine at 8:         {eight / raw8:.2f}x [>= 0.9] "
        f"({eight / staggered:.2f}x against the raw engine at staggered positions)"
    )
    print(
        f"  single-stream decode vs llama-server: "
        f"{native[1]['itl_median_ms'] / ours[1]['itl_median_ms']:.2f}x [>= 1.0]"
    )
    print(
        f"  8 clients vs llama-server at 8:       "
        f"{ours[8]['throughput_tok_s'] / native[8]['throughput_tok_s']:.2f}x [>= 1.05]"
    )
    print(
        f"  median ITL at 8, mlxcel/llama-server: "
        f"{ours[8]['itl_median_ms'] / native[8]['itl_median_ms']:.2f}x [<= 1.05]"
    )
    print(
        f"  median TTFT at 8, llama-server/mlxcel: "
        f"{native[8]['ttft_median_ms'] / ours[8]['ttft_median_ms']:.2f}x [>= 1.5]"
    )
    print(
        f"  8 streams vs llama_cpp.server at 8:   "
        f"{ours[8]['throughput_tok_s'] / theirs[8]['throughput_tok_s']:.2f}x [>= 1.4]"
    )
    print(
        f"  median TTFT at 8, llama_cpp.server/mlxcel: "
        f"{theirs[8]['ttft_median_ms'] / ours[8]['ttft_median_ms']:.2f}x [>= 3]"
    )
    print(
        f"  2,000-token prefix TTFT cold/warm:    {cold / warm:.1f}x [>= 10] "
        f"({cold * 1000:.0f} ms -> {warm * 1000:.0f} ms)"
    )
