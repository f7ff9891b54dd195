"""`mlxcel serve` flags for what protects the server: connection limits and browser policy."""

from __future__ import annotations

import argparse
from typing import Any

from mlxcel.api.hosts import parse_allowed_hosts
from mlxcel.config import settings as defaults


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _hosts(text: str) -> tuple[str, ...]:
    try:
        return parse_allowed_hosts(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def security_arguments(parser: argparse.ArgumentParser) -> None:
    """Connection timeouts and cap, the Host allowlist and the OpenAPI document's access."""
    add = parser.add_argument
    add(
        "--header-timeout",
        type=_seconds,
        default=defaults.DEFAULT_HEADER_TIMEOUT,
        metavar="S",
        help="seconds a connection has to send a whole request head (default: %(default)s)",
    )
    add(
        "--body-timeout",
        type=_seconds,
        default=defaults.DEFAULT_BODY_TIMEOUT,
        metavar="S",
        help="seconds a request body may stall before the request ends with 408 "
        "(default: %(default)s)",
    )
    add(
        "--body-deadline",
        type=_seconds,
        default=defaults.DEFAULT_BODY_DEADLINE,
        metavar="S",
        help="seconds a whole request body may take to arrive, however steadily it trickles, "
        "before the request ends with 408 (default: %(default)s)",
    )
    add(
        "--keep-alive-timeout",
        type=_count,
        default=defaults.DEFAULT_KEEP_ALIVE_TIMEOUT,
        metavar="S",
        help="seconds an idle connection stays open between requests (default: %(default)s)",
    )
    add(
        "--max-connections",
        type=_count,
        default=defaults.DEFAULT_MAX_CONNECTIONS,
        metavar="N",
        help="open client connections; past it the longest-idle one is closed, or the new one "
        "gets 503 when all are busy (default: %(default)s)",
    )
    add(
        "--allowed-hosts",
        type=_hosts,
        default=(),
        metavar="NAME[,NAME]",
        help="Host header names to accept beside IP addresses, localhost and the --host name, "
        "or '*' for any; others get 400 (DNS rebinding)",
    )
    add(
        "--allow-downloads",
        action="store_true",
        help="let API clients pull models from the Hugging Face Hub, add them to the server "
        "and remove them from disk (POST /models/pull, DELETE /models/NAME, POST /models/load "
        "with a path); off by default: a server facing a network should not fetch on request",
    )
    add(
        "--public-openapi",
        action="store_true",
        help="serve /openapi.json without the API key",
    )


def check_api_keys(parser: argparse.ArgumentParser, keys: tuple[str, ...]) -> None:
    """Refuse a key no client can send: HTTP header values are ASCII, and a key with a space
    or a control character in it is not read back whole from `Authorization: Bearer KEY`."""
    for key in keys:
        bad = next((c for c in key if not "!" <= c <= "~"), None)
        if bad is not None:
            parser.error(
                f"an API key holds {bad!r} (U+{ord(bad):04X}); keys must be printable ASCII "
                "without spaces, as HTTP headers carry them"
            )


def security_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The ServerConfig fields those flags give."""
    return {
        "header_timeout": args.header_timeout,
        "body_timeout": args.body_timeout,
        "body_deadline": args.body_deadline,
        "keep_alive_timeout": args.keep_alive_timeout,
        "max_connections": args.max_connections,
        "allowed_hosts": args.allowed_hosts,
        "public_openapi": args.public_openapi,
        "allow_downloads": args.allow_downloads,
    }
