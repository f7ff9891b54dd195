"""Run the app with uvicorn on TCP or a Unix socket while the models load behind it.

The address is bound before anything else happens, so a port in use is one error line and
exit code 2; so is a model that fails to load, with nothing after it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from mlxcel.api.app import create_app
from mlxcel.config import ServerConfig
from mlxcel.engine.metrics import EngineMetrics
from mlxcel.models.registry import ModelRegistry, ModelUnavailable

logger = logging.getLogger(__name__)

# What `mlxcel serve` exits with when it cannot start: the address or a model is unusable.
EXIT_CANNOT_START = 2


def _unix_socket(path: Path) -> socket.socket:
    """A Unix socket only its owner may connect to (uvicorn's own would be 0666)."""
    if path.exists() or path.is_symlink():
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(str(path))
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    return sock


def _tcp_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port, as uvicorn would bind it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _bind(config: ServerConfig) -> socket.socket:
    """The listening socket; raises OSError (port taken, bad address) before any model work."""
    sock = _unix_socket(config.socket) if config.socket else _tcp_socket(config.host, config.port)
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _cannot_listen(config: ServerConfig, exc: OSError) -> str:
    """The one line that says why the address cannot be used and what to do instead."""
    reason = exc.strerror or str(exc)
    if config.socket:
        return f"cannot listen on unix:{config.socket}: {reason}; pass another --socket"
    where = f"http://{config.host}:{config.port}"
    if exc.errno == errno.EADDRINUSE:
        return (
            f"cannot listen on {where}: the port is in use by another program; "
            "pass another --port (or stop the server that holds it)"
        )
    return f"cannot listen on {where}: {reason}; check --host and --port"


async def _serve(
    app: FastAPI, config: ServerConfig, server: uvicorn.Server, sock: socket.socket
) -> None:
    """Serve while the models that load at startup load, and while the idle watcher runs."""
    metrics = EngineMetrics(app.state.metrics_registry)
    registry = ModelRegistry(
        config.models,
        metrics,
        lenient=not config.strict_model_names,
        max_memory=config.max_memory,
    )
    app.state.models = registry

    async def start_up() -> None:
        try:
            await registry.start_up()
        except ModelUnavailable as exc:
            logger.error("could not load %s", str(exc).removeprefix("the "))
            app.state.load_error = str(exc)
            server.should_exit = True
            return
        app.state.registry = registry
        await registry.watch_idle()

    loader = asyncio.ensure_future(start_up())
    try:
        await server.serve(sockets=[sock])
    finally:
        loader.cancel()


def serve(config: ServerConfig) -> int:
    """Serve until interrupted; EXIT_CANNOT_START when the address or a model that loads at
    startup is unusable."""
    try:
        sock = _bind(config)
    except OSError as exc:
        logger.error("%s", _cannot_listen(config, exc))
        return EXIT_CANNOT_START
    app = create_app(config)
    uv_config = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(uv_config)
    where = f"unix:{config.socket}" if config.socket else f"http://{config.host}:{config.port}"
    logger.info("listening on %s; loading the models", where)
    try:
        asyncio.run(_serve(app, config, server, sock))
    finally:
        registry: ModelRegistry | None = getattr(app.state, "models", None)
        if registry is not None:
            registry.close()
        if config.socket and config.socket.exists():
            config.socket.unlink()
    return EXIT_CANNOT_START if app.state.load_error is not None else 0
