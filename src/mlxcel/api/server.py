"""Run the app with uvicorn on TCP or a Unix socket while the models load behind it."""

from __future__ import annotations

import asyncio
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


def _unix_socket(path: Path) -> socket.socket:
    """A listening Unix socket only its owner may connect to (uvicorn's own would be 0666)."""
    if path.exists() or path.is_symlink():
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old_umask)
    os.chmod(path, 0o600)
    return sock


async def _serve(
    app: FastAPI, config: ServerConfig, server: uvicorn.Server, sockets: list[socket.socket] | None
) -> None:
    """Serve while the models that load at startup load, and while the idle watcher runs."""
    metrics = EngineMetrics(app.state.metrics_registry)
    registry = ModelRegistry(config.models, metrics, max_memory=config.max_memory)
    app.state.models = registry

    async def start_up() -> None:
        try:
            await registry.start_up()
        except ModelUnavailable as exc:
            logger.error("%s", exc)
            app.state.load_error = str(exc)
            server.should_exit = True
            return
        app.state.registry = registry
        await registry.watch_idle()

    loader = asyncio.ensure_future(start_up())
    try:
        await server.serve(sockets=sockets)
    finally:
        loader.cancel()


def serve(config: ServerConfig) -> int:
    """Serve until interrupted; non-zero when a model that loads at startup could not."""
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
    sockets = [_unix_socket(config.socket)] if config.socket else None
    where = f"unix:{config.socket}" if config.socket else f"http://{config.host}:{config.port}"
    logger.info("listening on %s; loading the models", where)
    try:
        asyncio.run(_serve(app, config, server, sockets))
    finally:
        registry: ModelRegistry | None = getattr(app.state, "models", None)
        if registry is not None:
            registry.close()
        if config.socket and config.socket.exists():
            config.socket.unlink()
    return 1 if app.state.load_error is not None else 0
