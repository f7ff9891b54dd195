"""Run the app with uvicorn on TCP or a Unix socket while the model loads behind it."""

from __future__ import annotations

import asyncio
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
        logger.error("could not load %s: %s", config.model, exc)
        app.state.load_error = str(exc)
        server.should_exit = True


def serve(config: ServerConfig) -> int:
    """Serve until interrupted; non-zero when the model could not be loaded."""
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
    logger.info("listening on %s; loading the model", where)
    loader = threading.Thread(target=_load, args=(app, config, server), name="loader", daemon=True)
    loader.start()
    try:
        asyncio.run(server.serve(sockets=sockets))
    finally:
        loader.join(timeout=1)
        registry: ModelRegistry | None = app.state.registry
        if registry is not None:
            registry.close()
        if config.socket and config.socket.exists():
            config.socket.unlink()
    return 1 if app.state.load_error is not None else 0
