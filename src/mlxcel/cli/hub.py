"""`mlxcel pull`, `mlxcel list` and `mlxcel rm`: models on this machine's disk."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from mlxcel.hub.inventory import RemoveError, local_models, remove
from mlxcel.hub.pull import Progress, PullError, PullSpec, Tracker, plan, pull

_MIB = 2**20


def add_hub_commands(commands: Any) -> None:
    """The three subcommands, on `mlxcel`'s subparsers."""
    cache = {"type": Path, "metavar": "DIR", "help": "the Hugging Face cache to use"}
    get = commands.add_parser(
        "pull",
        help="download a model from the Hugging Face Hub",
        description="Download a model: a whole MLX or safetensors repo, or one GGUF file of a "
        "GGUF repo, chosen by its name or its quantisation (ORG/NAME:Q4_K_M). Resumes what an "
        "earlier pull left. Goes into the Hugging Face cache, where every tool finds it.",
    )
    get.add_argument("model", metavar="REPO[:FILE_OR_QUANT]")
    get.add_argument("--dir", type=Path, metavar="DIR", help="a folder instead of the cache")
    get.add_argument("--cache-dir", **cache)
    listing = commands.add_parser(
        "list", help="list the models on disk", description="List the models mlxcel can serve."
    )
    listing.add_argument("--json", action="store_true", help="one JSON object per model")
    listing.add_argument("--cache-dir", **cache)
    rm = commands.add_parser(
        "rm",
        help="remove a model from the Hugging Face cache",
        description="Remove ORG/NAME (the whole repo) or ORG/NAME:FILE.gguf from the cache.",
    )
    rm.add_argument("name", metavar="NAME")
    rm.add_argument("--yes", "-y", action="store_true", help="do not ask first")
    rm.add_argument("--cache-dir", **cache)


def _shown(progress: Progress) -> str:
    eta = progress.eta_s
    left = f", {eta:.0f}s left" if eta is not None else ""
    return (
        f"\r{progress.file}: {progress.done / _MIB:.1f}/{progress.total / _MIB:.1f} MiB, "
        f"{progress.rate / _MIB:.1f} MiB/s{left}   "
    )


def _pull(args: argparse.Namespace) -> int:
    spec = PullSpec.parse(args.model)
    files = plan(spec)
    total = sum(f.size for f in files)
    print(f"pulling {spec}: {len(files)} file(s), {total / _MIB:.1f} MiB", file=sys.stderr)
    terminal = sys.stderr.isatty()

    def report(progress: Progress) -> None:
        if terminal:
            sys.stderr.write(_shown(progress))
            sys.stderr.flush()

    path = pull(spec, files, Tracker(total, report), args.cache_dir, args.dir)
    if terminal:
        sys.stderr.write("\n")
    print(path)
    return 0


def _list(args: argparse.Namespace) -> int:
    models = local_models(args.cache_dir)
    if args.json:
        for m in models:
            fields = {"name": m.name, "kind": m.kind, "size": m.size, "path": str(m.path)}
            print(json.dumps({**fields, "quantization": m.quantization}))
        return 0
    rows = [("NAME", "KIND", "SIZE", "QUANT", "PATH")] + [
        (m.name, m.kind, f"{m.size / _MIB:.0f} MiB", m.quantization or "-", str(m.path))
        for m in models
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True)]
        print("  ".join([*cells, row[4]]))
    return 0


def _rm(args: argparse.Namespace) -> int:
    if not args.yes:
        if not sys.stdin.isatty():
            raise RemoveError(f"removing '{args.name}' needs --yes when nobody can be asked")
        answer = input(f"remove {args.name} from the cache? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            return 1
    for path in remove(args.name, args.cache_dir):
        print(f"removed {path}")
    return 0


def run_hub(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Run `pull`, `list` or `rm`; a failure is one line and exit code 1."""
    command = {"pull": _pull, "list": _list, "rm": _rm}[args.command]
    try:
        return command(args)
    except (PullError, RemoveError) as exc:
        sys.stderr.write("\n" if args.command == "pull" and sys.stderr.isatty() else "")
        print(f"mlxcel {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nmlxcel {args.command}: interrupted (run it again to resume)", file=sys.stderr)
        return 130
