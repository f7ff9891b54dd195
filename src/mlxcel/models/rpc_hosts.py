"""Which of a model's RPC hosts went away, for the reason its worker ended: ggml's RPC client
aborts the worker when a link breaks, without saying which (docs/distributed.md)."""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor

from mlxcel.config.rpc import split_endpoint
from mlxcel.config.settings import ModelConfig

_PROBE_TIMEOUT_S = 1.0


def _answers(entry: str) -> bool:
    host, port, _ = split_endpoint(entry)
    try:
        socket.create_connection((host, port), timeout=_PROBE_TIMEOUT_S).close()
    except OSError:
        return False
    return True


def rpc_hosts_note(config: ModelConfig) -> str:
    """What to add to a worker's end for a model on RPC hosts: the ones that no longer
    answer, else all of them (one link broke and its host is back); empty without any."""
    if not config.rpc:
        return ""
    with ThreadPoolExecutor(len(config.rpc)) as pool:
        answers = list(pool.map(_answers, config.rpc))
    gone = [entry for entry, up in zip(config.rpc, answers, strict=True) if not up]
    if gone:
        verb = "is" if len(gone) == 1 else "are"
        return f": its RPC host {', '.join(gone)} {verb} unreachable"
    return f" (a link to its RPC hosts {', '.join(config.rpc)} broke)"
