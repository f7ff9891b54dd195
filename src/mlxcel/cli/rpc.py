"""One GGUF model across machines (docs/distributed.md): `serve`'s --rpc flags, and
`mlxcel rpc-server`, ggml's RPC server from the build that serves the model, with the keyed
channel in front of it when it faces a network."""

from __future__ import annotations

import argparse
import logging
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from mlxcel.config import rpc
from mlxcel.config.cores import default_threads
from mlxcel.logs import configure

logger = logging.getLogger("mlxcel.rpc_server")

DEFAULT_PORT = 50052
"""ggml's RPC port, as llama.cpp's rpc-server defaults it."""
_READY_TIMEOUT_S = 30.0


def _argument(convert: Callable[[str], object]) -> Callable[[str], object]:
    def parse(value: str) -> object:
        try:
            return convert(value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def rpc_arguments(parser: argparse.ArgumentParser) -> None:
    """`serve`'s flags for a GGUF model spread over RPC hosts, as llama-server spells them."""
    add = parser.add_argument
    add(
        "--rpc",
        type=_argument(rpc.rpc_servers),
        default=(),
        metavar="HOST:PORT[,...]",
        help="llama.cpp: spread the GGUF model's layers over these RPC servers (mlxcel "
        f"rpc-server, or llama.cpp's); {rpc.SCHEME}HOST:PORT goes through the keyed channel "
        "of `mlxcel rpc-server --listen`, a bare HOST:PORT off this machine is unprotected",
    )
    add(
        "-ts",
        "--tensor-split",
        type=_argument(rpc.tensor_split),
        default=(),
        metavar="N,N,...",
        help="llama.cpp: the share of layers for each device, RPC servers first "
        "(default: by each device's free memory)",
    )
    add(
        "--rpc-key-file",
        type=Path,
        metavar="FILE",
        help=f"the key of the {rpc.SCHEME} RPC servers (mlxcel rpc-server --new-key FILE)",
    )


def check_rpc_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """What argparse cannot check of --rpc and --rpc-key-file alone."""
    problem = rpc.rpc_problem(args.rpc, args.rpc_key_file)
    if problem is not None:
        parser.error(problem)


def rpc_server_arguments(parser: argparse.ArgumentParser) -> None:
    """`mlxcel rpc-server`'s flags (llama.cpp's rpc-server's, and the keyed channel's)."""
    add = parser.add_argument
    add("--host", default="127.0.0.1", help="ggml's RPC port's address (default: %(default)s)")
    add("--port", type=int, default=DEFAULT_PORT, help="ggml's RPC port (default: %(default)s)")
    add("-t", "--threads", type=int, default=None, help="CPU threads (default: physical cores)")
    add(
        "--cache-dir",
        type=Path,
        metavar="DIR",
        help="keep tensors sent here, so a reload sends only hashes",
    )
    add(
        "--listen",
        metavar="HOST:PORT",
        help="serve the keyed channel here (ggml's port then stays on loopback)",
    )
    add("--key-file", type=Path, metavar="FILE", help="the channel's shared key (--listen)")
    add("--new-key", type=Path, metavar="FILE", help="write a fresh random key to FILE and exit")


def _fail(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    parser.exit(2, f"{parser.prog}: error: {message}\n")


def _wait_for_port(host: str, port: int, ggml: threading.Thread) -> bool:
    """Whether ggml's server came up on `host:port` (it says nothing when it does)."""
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while ggml.is_alive() and time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1).close()
            return True
        except OSError:
            time.sleep(0.05)
    return False


def _channel(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[str, int, bytes] | None:
    """--listen's address and --key-file's key, checked; None without --listen."""
    from mlxcel.backends.llamacpp.rpc_channel import ChannelError, read_key

    if (args.listen is None) != (args.key_file is None):
        _fail(parser, "--listen and --key-file go together")
    if args.listen is None:
        if not rpc.is_loopback(args.host):
            logger.warning(
                "ggml's RPC port on %s has no authentication and trusts every byte it gets: "
                "anyone who reaches it can read and write this process's memory. Use --listen "
                "with --key-file (docs/distributed.md)",
                args.host,
            )
        return None
    if not rpc.is_loopback(args.host):
        _fail(parser, "with --listen, ggml's own port stays on loopback: drop --host")
    try:
        host, port, _ = rpc.split_endpoint(args.listen)
        return host, port, read_key(args.key_file)
    except (ValueError, ChannelError) as exc:
        _fail(parser, str(exc))


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not 0 < args.port < 65536 or (args.threads is not None and args.threads < 1):
        _fail(parser, "--port must be 1-65535 and --threads at least 1")
    if args.cache_dir is not None:
        try:
            args.cache_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            _fail(parser, f"--cache-dir {args.cache_dir}: {exc.strerror}")


def run_rpc_server(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """`mlxcel rpc-server`: serve this machine's devices until interrupted."""
    from mlxcel.backends.llamacpp.rpc import start_server, supports_rpc
    from mlxcel.backends.llamacpp.rpc_channel import ChannelServer, new_key

    configure("info", "text")
    if args.new_key is not None:
        try:
            new_key(args.new_key)
        except OSError as exc:
            _fail(parser, f"--new-key {args.new_key}: {exc.strerror}")
        print(f"wrote a new key to {args.new_key}; copy it to the serving host")
        return 0
    _check(parser, args)
    channel = _channel(parser, args)
    if not supports_rpc():
        _fail(parser, "this llama-cpp-python was built without RPC (make install)")
    endpoint = f"{args.host}:{args.port}"
    threads = args.threads or default_threads()
    ggml = threading.Thread(
        target=start_server, args=(endpoint, threads, args.cache_dir), daemon=True
    )
    ggml.start()
    probe = "127.0.0.1" if args.host == "0.0.0.0" else args.host
    if not _wait_for_port(probe, args.port, ggml):
        _fail(parser, f"ggml's RPC server could not listen on {endpoint}")
    if channel is not None:
        try:
            ChannelServer(channel[2], args.port).listen(channel[0], channel[1])
        except OSError as exc:
            _fail(parser, f"--listen {args.listen}: {exc.strerror}")
    keyed = f", keyed channel on {args.listen}" if channel is not None else ""
    logger.info("ready: ggml's RPC server on %s%s", endpoint, keyed)
    try:
        while ggml.is_alive():
            ggml.join(0.5)
    except KeyboardInterrupt:
        return 0
    return 1
