"""llama-server's LoRA flags, for the -m model: --lora, --lora-scaled, --lora-init-without-apply."""

from __future__ import annotations

import argparse

from mlxcel.cli.models import fail
from mlxcel.config.adapters import LoraAdapter, from_flags


def lora_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that load LoRA adapters over the -m model at start."""
    add = parser.add_argument
    add(
        "--lora",
        action="append",
        default=[],
        metavar="FILE[,FILE]",
        help="a LoRA adapter over -m's model, named after its file (repeatable): a GGUF "
        "adapter on llama.cpp, an mlx-lm or PEFT adapter folder on MLX; scale 1",
    )
    add(
        "--lora-scaled",
        action="append",
        default=[],
        metavar="FILE:SCALE[,...]",
        help="a LoRA adapter with the scale it runs at (repeatable)",
    )
    add(
        "--lora-init-without-apply",
        action="store_true",
        help="load the adapters at global scale 0: a request's `lora` or `model`, or "
        "POST /lora-adapters, applies them",
    )


def check_lora_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The flags are for -m's model: with --config each model says its own `lora_adapters`."""
    given = args.lora or args.lora_scaled or args.lora_init_without_apply
    if args.config is not None and given:
        fail(
            parser,
            "--lora flags are for -m's model: with --config, give each model its lora_adapters",
        )


def lora_adapters(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[LoraAdapter, ...]:
    """The adapters the flags name, each file checked; a one-line start-up error if not."""
    try:
        return from_flags(args.lora, args.lora_scaled)
    except ValueError as exc:
        fail(parser, str(exc))
