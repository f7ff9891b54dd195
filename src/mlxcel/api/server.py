"""Run the app with uvicorn on TCP or a Unix socket while the model loads behind it.

The address is bound before anything else happens, so a port in use is one error line and
exit code 2; so is a model that fails to load, with nothing after it.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import threading
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from mlxcel.api.app import create_app
from mlxcel.config import ServerConfig
from mlxcel.engine.metrics import EngineMetrics
from mlxcel.engine.registry import ModelRegistry, load_text_model
from mlxcel.parsers.tools import detect_parser
from mlxcel.serving.reasoning import reasoning_parser_name

logger = logging.getLogger(__name__)

# What `mlxcel serve` exits with when it cannot start: the address or the model is unusable.
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


def _load(app: FastAPI, config: ServerConfig, server: uvicorn.Server) -> None:
    try:
        registry = ModelRegistry(strict_names=config.strict_model_names)
        model = load_text_model(config, EngineMetrics(app.state.metrics_registry))
        source = model.chat_template.source if model.chat_template else ""
        if config.tool_call_parser == "auto":
            parser = detect_parser(source or None)
            logger.info("tool-call parser: %s (auto, from the chat template)", parser)
        if config.reasoning_parser == "auto":
            # deepseek_r1 or qwen3 for <think> tags: decided per prompt, by who opens the tag.
            reasoning = reasoning_parser_name("auto", "", source) or "none"
            logger.info("reasoning parser: %s (auto, from the chat template)", reasoning)
        registry.add(model)
        app.state.registry = registry
    except Exception as exc:
        app.state.load_error = str(exc)
        server.should_exit = True
        reason = str(exc)
        # The backends' errors usually name the file already.
        where = "" if str(config.model) in reason else f" {config.model}"
        logger.error("could not load the model%s: %s", where, reason)


def serve(config: ServerConfig) -> int:
    """Serve until interrupted; EXIT_CANNOT_START when the address or the model is unusable."""
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
    logger.info("listening on %s; loading the model", where)
    loader = threading.Thread(target=_load, args=(app, config, server), name="loader", daemon=True)
    loader.start()
    try:
        asyncio.run(server.serve(sockets=[sock]))
    finally:
        loader.join(timeout=1)
        registry: ModelRegistry | None = app.state.registry
        if registry is not None:
            registry.close()
        if config.socket and config.socket.exists():
            config.socket.unlink()
    return EXIT_CANNOT_START if app.state.load_error is not None else 0
