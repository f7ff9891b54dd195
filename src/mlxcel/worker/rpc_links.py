"""A model's --rpc entries made ready for ggml, in its worker: a raw ggml port is used as is
(with a warning when it is off this machine), a keyed one gets a loopback port here whose
connections the channel carries to the host (backends/llamacpp/rpc_channel.py)."""

from __future__ import annotations

import logging
import os

from mlxcel.config.rpc import is_loopback, split_endpoint
from mlxcel.config.settings import ModelConfig

logger = logging.getLogger(__name__)


def rpc_endpoints(config: ModelConfig) -> tuple[tuple[str, str], ...]:
    """Each --rpc entry as (the ggml endpoint to register, the entry as given); ValueError
    names a host that cannot be reached or refuses the key."""
    from mlxcel.backends.llamacpp.rpc import RpcError, check_reachable
    from mlxcel.backends.llamacpp.rpc_channel import ChannelClient, ChannelError, read_key

    if not config.rpc:
        return ()
    # ggml's RPC client aborts the worker when a host goes away; that is no bug to debug, so
    # ggml is not to attach gdb for a backtrace first (seconds, and a screenful of log).
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    endpoints = []
    try:
        key = read_key(config.rpc_key_file) if config.rpc_key_file is not None else None
        for entry in config.rpc:
            host, port, keyed = split_endpoint(entry)
            if keyed and key is not None:
                endpoints.append((ChannelClient(host, port, key, entry).open(), entry))
                continue
            if not is_loopback(host):
                logger.warning(
                    "--rpc %s: llama.cpp's RPC link has no authentication or encryption, and "
                    "its server trusts every byte: anyone on the path can read the prompts and "
                    "take over the rpc-server. Use mlxcel rpc-server --listen and --rpc "
                    "mlxcel://%s:PORT, an SSH tunnel or WireGuard (docs/distributed.md)",
                    entry,
                    host,
                )
            check_reachable(f"{host}:{port}", entry)
            endpoints.append((f"{host}:{port}", entry))
    except (ChannelError, RpcError) as exc:
        raise ValueError(str(exc)) from None
    return tuple(endpoints)
