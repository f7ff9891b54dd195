"""The Realtime API's flags: the models a /v1/realtime session joins and its limits."""

from __future__ import annotations

import argparse
from typing import Any

from mlxcel.config.realtime import RealtimeConfig

_DEFAULTS = RealtimeConfig()


def realtime_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the /v1/realtime flags."""
    group = parser.add_argument_group("realtime (/v1/realtime over WebSocket)")
    for kind, what in (
        ("chat", "the text model that answers in a conversation"),
        ("transcription", "the Whisper model that hears the input audio"),
        ("speech", "the voice that speaks the answers"),
    ):
        group.add_argument(
            f"--realtime-{kind}-model",
            metavar="NAME",
            help=f"{what}; unset, the server's first model of that kind or the one a session "
            "names (default: none)",
        )
    group.add_argument(
        "--realtime-max-sessions",
        type=int,
        default=_DEFAULTS.max_sessions,
        metavar="N",
        help="sessions open at once; one more gets an error event and close code 1013 "
        "(default: %(default)s)",
    )
    group.add_argument(
        "--realtime-max-session-seconds",
        type=float,
        default=_DEFAULTS.max_session_seconds,
        metavar="S",
        help="how long one session may stay open (default: %(default)g)",
    )
    group.add_argument(
        "--realtime-idle-timeout",
        type=float,
        default=_DEFAULTS.idle_timeout,
        metavar="S",
        help="seconds without a client event before a session is closed (default: %(default)g)",
    )
    group.add_argument(
        "--realtime-max-audio-seconds",
        type=float,
        default=_DEFAULTS.max_audio_seconds,
        metavar="S",
        help="seconds of input audio one session may append, all turns together "
        "(default: %(default)g)",
    )
    group.add_argument(
        "--realtime-max-message-bytes",
        type=int,
        default=_DEFAULTS.max_message_bytes,
        metavar="BYTES",
        help="bytes one client event may hold (default: %(default)s)",
    )


def realtime_config(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """The ServerConfig field these flags set."""
    for flag in ("max_sessions", "max_session_seconds", "idle_timeout", "max_audio_seconds"):
        if not getattr(args, f"realtime_{flag}") > 0:
            parser.error(f"--realtime-{flag.replace('_', '-')} must be more than 0")
    if args.realtime_max_message_bytes < 1024:
        parser.error("--realtime-max-message-bytes must be at least 1024")
    return {
        "realtime": RealtimeConfig(
            chat_model=args.realtime_chat_model,
            transcription_model=args.realtime_transcription_model,
            speech_model=args.realtime_speech_model,
            max_sessions=args.realtime_max_sessions,
            max_session_seconds=args.realtime_max_session_seconds,
            idle_timeout=args.realtime_idle_timeout,
            max_audio_seconds=args.realtime_max_audio_seconds,
            max_message_bytes=args.realtime_max_message_bytes,
        )
    }
