"""`mlxcel launch`: mlx-openai-server's `launch` flags, turned into `mlxcel serve` arguments."""

from __future__ import annotations

import argparse

from mlxcel.cli.models import fail
from mlxcel.config.file import MODEL_TYPES, unservable
from mlxcel.logs import LOG_LEVELS

# `mlxcel launch` flags (mlx-openai-server's) and the `mlxcel serve` flag each one becomes.
LAUNCH_FLAGS = {
    "--model-path": "--model",
    "--served-model-name": "--alias",
    "--context-length": "--ctx-size",
    "--max-tokens": "--n-predict",
    "--max-concurrency": "--parallel",
    "--temperature": "--temp",
    "--top-p": "--top-p",
    "--top-k": "--top-k",
    "--queue-size": "--queue-size",
    "--queue-timeout": "--queue-timeout",
    "--reasoning-parser": "--reasoning-parser",
    "--tool-call-parser": "--tool-call-parser",
    "--chat-template-file": "--chat-template-file",
    "--config": "--config",
    "--host": "--host",
    "--port": "--port",
}
LAUNCH_PORT = 8000


def launch_arguments(parser: argparse.ArgumentParser) -> None:
    for flag, serve_flag in LAUNCH_FLAGS.items():
        parser.add_argument(flag, metavar="VALUE", help=f"as `mlxcel serve {serve_flag}`")
    parser.add_argument("--model-type", choices=list(MODEL_TYPES), default="lm")
    parser.add_argument("--log-level", type=str.lower, choices=LOG_LEVELS, default="info")


def launch_argv(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """`mlxcel serve` arguments for mlx-openai-server's `launch` flags."""
    kind = MODEL_TYPES[args.model_type]
    why = unservable(kind)
    if why is not None:
        fail(parser, f"--model-type {args.model_type}: {why}")
    values = vars(args)
    argv = ["--log-level", args.log_level]
    if args.port is None:
        argv += ["--port", str(LAUNCH_PORT)]
    for flag, serve_flag in LAUNCH_FLAGS.items():
        value = values[flag[2:].replace("-", "_")]
        if value is not None:
            argv += [serve_flag, value]
    return argv
