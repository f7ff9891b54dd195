"""Deciding between managed and connect mode, and setting up each."""

import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

from mlxcel.client._endpoint import Endpoint
from mlxcel.client._launch import ServerProcess, free_port, resolve_binary, server_args
from mlxcel.errors import MlxcelError

API_KEY_ENV = "MLXCEL_API_KEY"
DEFAULT_HOST = "127.0.0.1"
# Unix socket connections ignore the host, but the URL needs one.
SOCKET_ROOT_URL = "http://localhost"


def is_managed(
    model: object,
    *,
    base_url: str | None,
    socket: str | os.PathLike[str] | None,
    host: str | None,
    port: int | None,
    binary: object,
    server_kwargs: Mapping[str, Any],
) -> bool:
    """Return whether these arguments ask for a spawned server; raise if they are ambiguous."""
    if base_url is not None and socket is not None:
        raise MlxcelError("pass base_url= or socket=, not both")
    if base_url is not None and model is not None:
        raise MlxcelError("pass a model to spawn a server, or base_url= to connect, not both")
    if socket is not None and (host is not None or port is not None):
        raise MlxcelError("socket= and host=/port= are alternatives; pass one of them")
    if model is None and (base_url is not None or socket is not None):
        given = {"host": host, "port": port, "binary": binary}
        spawn_only = [name for name, value in given.items() if value is not None]
        spawn_only += sorted(server_kwargs)
        if spawn_only:
            raise MlxcelError(
                f"only a spawned server takes {', '.join(spawn_only)}; "
                "base_url=/socket= without a model connects to a running one"
            )
        return False
    return True


def resolve_api_key(api_key: str | None) -> str | None:
    """Return api_key, else the first key in $MLXCEL_API_KEY (which the server reads too)."""
    if api_key is not None:
        return api_key
    keys = [key.strip() for key in os.environ.get(API_KEY_ENV, "").split(",")]
    return next((key for key in keys if key), None)


def connect_endpoint(
    base_url: str | None, socket: str | os.PathLike[str] | None, api_key: str | None
) -> Endpoint:
    """Return the endpoint of an already running server."""
    if socket is not None:
        return Endpoint(SOCKET_ROOT_URL, uds=os.fspath(socket), api_key=api_key, local=True)
    root = str(base_url).rstrip("/")
    return Endpoint(root.removesuffix("/v1"), api_key=api_key)


def launch(
    model: str | os.PathLike[str] | None,
    *,
    binary: str | os.PathLike[str] | None,
    host: str | None,
    port: int | None,
    socket: str | os.PathLike[str] | None,
    api_key: str | None,
    server_kwargs: Mapping[str, Any],
) -> tuple[ServerProcess, Endpoint]:
    """Spawn `mlxcel serve` and return it with its endpoint; it is not ready yet."""
    command = resolve_binary(binary)
    env = dict(os.environ)
    if api_key is not None:
        # Through the environment, so the key never shows in the process list.
        env[API_KEY_ENV] = api_key
    # Without api_key= the child inherits $MLXCEL_API_KEY, whose first key the client sends.
    api_key = resolve_api_key(api_key)
    if host is not None or port is not None:
        host = host or DEFAULT_HOST
        port = port or free_port(host)
        args = server_args(model, socket_path=None, host=host, port=port, options=server_kwargs)
        url_host = f"[{host}]" if ":" in host else host
        endpoint = Endpoint(f"http://{url_host}:{port}", api_key=api_key, local=True)
        return ServerProcess(command + args, env=env, cleanup_dir=None), endpoint
    # mkdtemp makes the directory 0700, so only this user can reach the socket in it.
    cleanup_dir = tempfile.mkdtemp(prefix="mlxcel-") if socket is None else None
    uds = os.fspath(socket) if socket is not None else os.path.join(str(cleanup_dir), "mlxcel.sock")
    try:
        args = server_args(
            model,
            socket_path=uds,
            host=None,
            port=None,
            options=server_kwargs,
            own_socket_dir=cleanup_dir is not None,
        )
        process = ServerProcess(command + args, env=env, cleanup_dir=cleanup_dir)
    except BaseException:
        if cleanup_dir is not None:
            shutil.rmtree(cleanup_dir, ignore_errors=True)
        raise
    return process, Endpoint(SOCKET_ROOT_URL, uds=uds, api_key=api_key, local=True)
