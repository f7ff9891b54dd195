"""--rpc, --tensor-split and --rpc-key-file: the llama.cpp RPC hosts a GGUF model's layers are
spread over (docs/distributed.md), checked where they are read."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Any

SCHEME = "mlxcel://"
"""An --rpc entry through the keyed channel (`mlxcel rpc-server --listen`), not a raw ggml port."""
MAX_SERVERS = 16
"""GGML_RPC_MAX_SERVERS (ggml-rpc.h)."""


def split_endpoint(entry: str) -> tuple[str, int, bool]:
    """An --rpc entry as (host, port, keyed); ValueError says what is wrong with it."""
    keyed = entry.startswith(SCHEME)
    host, _, port = entry.removeprefix(SCHEME).rpartition(":")
    # ggml splits an endpoint at its first colon, so an IPv6 literal cannot be one.
    if not host or ":" in host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"'{entry}' is not HOST:PORT or {SCHEME}HOST:PORT")
    return host, int(port), keyed


def rpc_servers(value: Any) -> tuple[str, ...]:
    """--rpc's value (comma-separated, or a list in a config file) as checked entries."""
    items = value if isinstance(value, list) else str(value).split(",")
    servers = tuple(str(item).strip() for item in items if str(item).strip())
    if not servers:
        raise ValueError("expected HOST:PORT[,HOST:PORT...]")
    if len(servers) > MAX_SERVERS:
        raise ValueError(f"at most {MAX_SERVERS} RPC servers (llama.cpp's limit)")
    for server in servers:
        split_endpoint(server)
    return servers


def tensor_split(value: Any) -> tuple[float, ...]:
    """--tensor-split's proportions (`3,1` or `3/1` as llama-server takes them, or a list)."""
    items = value if isinstance(value, list) else str(value).replace("/", ",").split(",")
    try:
        split = tuple(float(item) for item in items)
    except (TypeError, ValueError):
        raise ValueError(f"expected proportions such as 3,1, got {value!r}") from None
    if not split or any(x < 0 for x in split) or not any(split):
        raise ValueError("expected proportions of 0 or more, one of them above 0")
    return split


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (where a raw ggml port is safe)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def rpc_problem(servers: tuple[str, ...], key_file: Path | None) -> str | None:
    """Why these RPC settings cannot work together, or None."""
    keyed = any(split_endpoint(s)[2] for s in servers)
    if keyed and key_file is None:
        return f"--rpc {SCHEME}HOST:PORT needs --rpc-key-file (the key the rpc-server holds)"
    if key_file is not None and not keyed:
        return f"--rpc-key-file is for --rpc {SCHEME}HOST:PORT entries"
    if key_file is not None and not key_file.is_file():
        return f"--rpc-key-file {key_file}: no such file"
    return None
