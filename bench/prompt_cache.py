"""The prompt cache across restarts: mlxcel's disk tier (--cache-disk) against llama-server's
own prompt cache, on the same GGUF, in one run.

    python bench/prompt_cache.py [--model coder|PATH] [--prefix-tokens 8192]
                                 [--sessions 8] [--turns 10] [--threads 2]

1. Time to first token of a long prefix (the Qwen2.5-0.5B shape: --model coder) on mlxcel:
   cold, warm from RAM (another prefix took the slot meanwhile), and warm from disk after a
   restart; the target is disk at most 10% of cold.
2. An agent-like workload: --sessions sessions of --turns turns each on one shared system
   prompt and tool list, the sessions taking turns (so they evict each other from the slots),
   the server restarted halfway; mlxcel with --cache-disk against llama-server with its prompt
   cache (--cache-ram, on by default): total time and median TTFT, as ratios.

The figures are printed as mlxcel / llama-server (below 1: mlxcel faster). On a shared machine
they move with the load: compare within one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from llama_server import build_llama_server
from servers import _free_port, _start

SRC = Path(__file__).resolve().parent.parent / "src"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ')} in the repository. " * 6,
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "query": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
    for name in ("read_file", "write_file", "list_dir", "search_code", "run_tests", "git_diff")
]


def _system(tokens: int) -> str:
    """A system prompt of about `tokens` tokens (about 1.3 tokens a word)."""
    words = "You are a careful coding agent working in a large repository of Python services."
    return " ".join([words] * max(1, int(tokens / 1.3 / len(words.split()))))


class Server:
    """mlxcel or llama-server on one GGUF, restartable with the same flags."""

    def __init__(self, name: str, model: Path, args: argparse.Namespace, disk: Path) -> None:
        self.name = name
        ctx = str(args.ctx * args.parallel)
        threads = str(args.threads)
        if name == "llama-server":
            self.command = [str(build_llama_server()), "-m", str(model), "-c", ctx]
            self.command += ["-np", str(args.parallel), "-t", threads, "-tb", threads]
            self.health = "/health"
        else:
            mlxcel = Path(sys.executable).parent / "mlxcel"
            self.command = [str(mlxcel), "serve", "-m", str(model), "-c", ctx]
            self.command += ["-np", str(args.parallel), "--threads", threads]
            self.command += ["--cache-disk", str(disk), "--log-level", "warning"]
            self.health = "/health"
        self.process: Any = None
        self.port = 0

    def start(self) -> None:
        """Start (or start again) and wait until it answers."""
        self.port = _free_port()
        src = SRC if self.name == "mlxcel" else None
        self.process = _start(
            [*self.command, "--port", str(self.port)], self.port, self.health, src
        )

    def stop(self) -> None:
        """SIGTERM, and wait: mlxcel writes its states to disk before it exits."""
        self.process.terminate()
        self.process.wait(timeout=60)

    def ttft(self, messages: list[dict[str, Any]], tools: bool, max_tokens: int) -> float:
        """Seconds to the first streamed content (or tool call) of a greedy chat answer."""
        body: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens, "stream": True}
        body |= {"temperature": 0, "tools": TOOLS} if tools else {"temperature": 0}
        started = time.monotonic()
        first = None
        url = f"http://127.0.0.1:{self.port}/v1/chat/completions"
        with httpx.stream("POST", url, json=body, timeout=3600) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if first is None and line.startswith("data: {"):
                    choices = json.loads(line[6:]).get("choices") or [{}]
                    delta = choices[0].get("delta", {})
                    if delta.get("content") or delta.get("tool_calls"):
                        first = time.monotonic() - started
        return first if first is not None else time.monotonic() - started


def prefix_ttft(server: Server, tokens: int) -> dict[str, float]:
    """Cold, warm from RAM and warm from disk after a restart: a long prefix's TTFT."""
    long = [{"role": "system", "content": _system(tokens)}, {"role": "user", "content": "Hi."}]
    other = [{"role": "system", "content": _system(tokens // 8) + " Other."}, long[1]]
    server.start()
    cold = server.ttft(long, False, 4)
    server.ttft(other, False, 4)  # takes the slot: the long prefix goes to the RAM tier
    ram = server.ttft(long, False, 4)
    server.stop()
    server.start()
    disk = server.ttft(long, False, 4)
    server.stop()
    return {"cold": cold, "ram": ram, "disk": disk}


def agents(server: Server, args: argparse.Namespace) -> dict[str, float]:
    """The sessions' turns, round-robin, the server restarted halfway: total seconds and the
    median TTFT."""
    system = {"role": "system", "content": _system(args.system_tokens)}
    sessions: list[list[dict[str, Any]]] = [[system] for _ in range(args.sessions)]
    ttfts = []
    server.start()
    started = time.monotonic()
    for turn in range(args.turns):
        if turn == args.turns // 2:
            server.stop()
            server.start()
        for index, messages in enumerate(sessions):
            ask = f"Session {index}, step {turn}: look at module_{index}_{turn}.py and report."
            messages.append({"role": "user", "content": ask})
            ttfts.append(server.ttft(messages, True, args.max_tokens))
            messages.append({"role": "assistant", "content": f"Checked module_{index}_{turn}."})
    total = time.monotonic() - started
    server.stop()
    return {"total_s": total, "median_ttft_s": statistics.median(ttfts)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="coder", help="coder (Qwen2.5-Coder-0.5B), or a GGUF")
    parser.add_argument("--prefix-tokens", type=int, default=8192)
    parser.add_argument("--system-tokens", type=int, default=2048)
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=12288, help="context per slot")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.model == "coder":
        from coder_model import coder_gguf

        model = coder_gguf()
    else:
        model = Path(args.model)
    with tempfile.TemporaryDirectory(prefix="prompt-cache-bench-") as tmp:
        ours = Server("mlxcel", model, args, Path(tmp) / "prefix")
        prefix = prefix_ttft(ours, args.prefix_tokens)
        print(
            f"model {model.name}, {args.threads} threads, prefix of ~{args.prefix_tokens} tokens:"
        )
        for name, seconds in prefix.items():
            print(f"  TTFT {name:5s} {seconds:8.3f} s  ({seconds / prefix['cold']:.3f} of cold)")
        results = {}
        for name in ("mlxcel", "llama-server"):
            server = Server(name, model, args, Path(tmp) / "agents")
            results[name] = agents(server, args)
        print(
            f"agents: {args.sessions} sessions x {args.turns} turns, "
            f"~{args.system_tokens}-token shared prefix, restarted after turn {args.turns // 2}:"
        )
        for name, figures in results.items():
            print(
                f"  {name:12s} total {figures['total_s']:8.2f} s, "
                f"median TTFT {figures['median_ttft_s']:.3f} s"
            )
        ours_f, peer = results["mlxcel"], results["llama-server"]
        print(
            f"  mlxcel / llama-server: total {ours_f['total_s'] / peer['total_s']:.2f}, "
            f"median TTFT {ours_f['median_ttft_s'] / peer['median_ttft_s']:.2f}"
        )


if __name__ == "__main__":
    main()
