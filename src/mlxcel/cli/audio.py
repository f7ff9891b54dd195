"""The speech models' flags: how long an upload may last (the models themselves are side
models: --transcription-model, --speech-model)."""

from __future__ import annotations

import argparse
from typing import Any

from mlxcel.config import settings as defaults


def audio_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the transcription limit flags."""
    group = parser.add_argument_group("speech")
    group.add_argument(
        "--max-audio-seconds",
        type=float,
        default=defaults.DEFAULT_MAX_AUDIO_SECONDS,
        metavar="S",
        help="longest audio a transcription or translation may hold, and a chat request's "
        "input_audio clips together, else 400 audio_too_long (default: %(default)g)",
    )


def audio_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The ServerConfig fields these flags set."""
    if not args.max_audio_seconds > 0:
        parser.error("--max-audio-seconds must be more than 0")
    return {"max_audio_seconds": args.max_audio_seconds}
