"""Run the app with uvicorn on TCP or a Unix socket while the models load behind it.

The address is bound before anything else happens, so a port in use is one error line and
exit code 2; so is a model that fails to load, with nothing after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import socket
import stat
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from mlxcel.api.app import create_app
from mlxcel.api.connections import (
    MAX_HEAD_BYTES,
    ConnectionLimits,
    file_limit_for,
    guarded_protocol,
)
from mlxcel.api.shutdown import ABORT_GRACE_S, DrainingServer
from mlxcel.config.settings import ServerConfig
from mlxcel.engine.image_queue import SHUTTING_DOWN
from mlxcel.engine.metrics import EngineMetrics
from mlxcel.models.entry import ModelUnavailable
from mlxcel.models.images import ImageModel
from mlxcel.models.loaded import LoadedModel
from mlxcel.models.registry import ModelRegistry

logger = logging.getLogger(__name__)

# What `mlxcel serve` exits with when it cannot start: the address or a model is unusable.
EXIT_CANNOT_START = 2


class SocketInUse(OSError):
    """The --socket path is not ours to take: it is no socket, or a server listens on it."""


def _clear_stale_socket(path: Path) -> None:
    """Remove a socket file a server that exited left behind; refuse anything else there."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SocketInUse(f"cannot listen on unix:{path}: it exists and is not a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except ConnectionRefusedError:
            path.unlink()
            return
        except OSError as exc:
            raise SocketInUse(f"cannot listen on unix:{path}: {exc.strerror or exc}") from exc
    raise SocketInUse(
        f"cannot listen on unix:{path}: another server listens on it; stop it or pass "
        "another --socket"
    )


def _unix_socket(path: Path) -> socket.socket:
    """A Unix socket only its owner may connect to (uvicorn's own would be 0666)."""
    _clear_stale_socket(path)
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


def _tcp_socket(host: str, port: int, v6_only: bool) -> socket.socket:
    """A TCP socket bound to host:port, as uvicorn would bind it.

    Its protocol is named (IPPROTO_TCP, not 0): asyncio sets TCP_NODELAY only on connections
    whose socket says TCP, and without it a response written in two parts (head, then body)
    waits for the client's delayed ACK, 40 ms on every keep-alive request."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6 and v6_only:
        # Beside an IPv4 address (`0.0.0.0,::`), `::` must not take IPv4's port as well.
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _bind(config: ServerConfig) -> list[socket.socket]:
    """The listening sockets, one per --host address or the Unix socket; raises OSError (port
    taken, bad address) before any model work."""
    if config.socket:
        socks = [_unix_socket(config.socket)]
    else:
        socks = []
        ports = [config.port] if config.ollama_port is None else [config.port, config.ollama_port]
        try:
            for port in ports:
                for host in config.hosts:
                    socks.append(_tcp_socket(host, port, len(config.hosts) > 1))
        except OSError:
            for sock in socks:
                sock.close()
            raise
    for sock in socks:
        sock.listen(2048)
        sock.set_inheritable(True)
    return socks


def _where(config: ServerConfig) -> str:
    """The addresses served, as URLs."""
    if config.socket:
        return f"unix:{config.socket}"
    ports = [config.port] if config.ollama_port is None else [config.port, config.ollama_port]
    return ", ".join(
        f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
        for port in ports
        for host in config.hosts
    )


def _cannot_listen(config: ServerConfig, exc: OSError) -> str:
    """The one line that says why the address cannot be used and what to do instead."""
    if isinstance(exc, SocketInUse):
        return str(exc)
    reason = exc.strerror or str(exc)
    if config.socket:
        return f"cannot listen on unix:{config.socket}: {reason}; pass another --socket"
    where = _where(config)
    if exc.errno == errno.EADDRINUSE:
        return (
            f"cannot listen on {where}: the port is in use by another program; "
            "pass another --port (or stop the server that holds it)"
        )
    return f"cannot listen on {where}: {reason}; check --host and --port"


def _stop_engines(app: FastAPI) -> None:
    """End every request in flight, and every one waiting, with a shutdown error: text at its
    next token, images at their next denoising step, the other kinds' calls and streams into
    their workers (a transcription, a speech, an embedding batch) now."""
    registry: ModelRegistry | None = getattr(app.state, "models", None)
    for model in registry.loaded() if registry is not None else []:
        if isinstance(model, LoadedModel):
            model.scheduler.stop()
        elif isinstance(model, ImageModel):
            model.queue.stop()
        else:
            model.worker.abort(SHUTTING_DOWN)


async def _serve(
    app: FastAPI, config: ServerConfig, server: DrainingServer, socks: list[socket.socket]
) -> None:
    """Serve while the models that load at startup load, and while the idle watcher runs."""
    metrics = EngineMetrics(app.state.metrics_registry)
    registry = ModelRegistry(
        config.models,
        metrics,
        lenient=not config.strict_model_names,
        max_memory=config.max_memory,
        log_level=config.log_level,
        log_format=config.log_format,
        worker_timeout=config.worker_timeout,
    )
    app.state.models = registry
    if config.exit_on_stdin_close:
        server.watch_pipe(sys.stdin.fileno())

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
        await server.serve(sockets=socks)
    finally:
        loader.cancel()


def _remove_socket(path: Path, inode: tuple[int, int]) -> None:
    """Remove the socket file, unless it is no longer the one this server bound."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return
    if (info.st_dev, info.st_ino) == inode:
        path.unlink()


def _run(main: Coroutine[Any, Any, None]) -> None:
    """Run `main` on uvloop where it installs (not on Windows), else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    uvloop.run(main)


def serve(config: ServerConfig) -> int:
    """Serve until SIGTERM or SIGINT, then drain and exit 0; EXIT_CANNOT_START when the address
    or a model that loads at startup is unusable."""
    try:
        socks = _bind(config)
    except OSError as exc:
        logger.error("%s", _cannot_listen(config, exc))
        return EXIT_CANNOT_START
    bound = config.socket.lstat() if config.socket else None
    app = create_app(config)
    limits = ConnectionLimits(
        config.header_timeout,
        config.body_timeout,
        config.body_deadline,
        file_limit_for(config.max_connections),
    )
    uv_config = uvicorn.Config(
        app,
        host=config.hosts[0],
        port=config.port,
        http=guarded_protocol(limits),
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        timeout_keep_alive=config.keep_alive_timeout,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=ABORT_GRACE_S,
        # A realtime event past --realtime-max-message-bytes gets an error event and the
        # session goes on; past four times it, the socket closes (1009).
        ws_max_size=4 * config.realtime.max_message_bytes,
    )
    server = DrainingServer(
        uv_config,
        app.state.drain,
        timeout=config.shutdown_timeout,
        abort=lambda: _stop_engines(app),
    )
    logger.info("listening on %s; loading the models", _where(config))
    try:
        _run(_serve(app, config, server, socks))
    finally:
        registry: ModelRegistry | None = getattr(app.state, "models", None)
        if registry is not None:
            registry.close()
        if config.socket and bound is not None:
            _remove_socket(config.socket, (bound.st_dev, bound.st_ino))
            if config.remove_socket_dir:
                # Only an empty directory goes: whatever else someone put there stays.
                with contextlib.suppress(OSError):
                    config.socket.parent.rmdir()
    return EXIT_CANNOT_START if app.state.load_error is not None else 0
