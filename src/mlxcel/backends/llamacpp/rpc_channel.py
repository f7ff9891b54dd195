"""The keyed channel that carries llama.cpp's RPC link between hosts (docs/distributed.md).

ggml's RPC protocol has no authentication and its server trusts every byte, so its port stays
on loopback and this channel faces the network instead: TLS 1.3 for secrecy and integrity, and,
before a byte is forwarded to ggml, a challenge in which each end proves it holds the shared
key: HMAC-SHA256 over both ends' fresh nonces and the hash of the server's TLS certificate. The
certificate is a throwaway one made at start, not checked by a CA: what binds it is the MAC, so
a relay in the middle, which must show its own certificate, fails the check on both ends."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import hashlib
import hmac
import logging
import os
import secrets
import socket
import ssl
import tempfile
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

MIN_KEY_BYTES = 16
_MAGIC = b"mlxcel-rpc/1\n"
_NONCE = 32
_MAC = 32
_OK, _REFUSED = b"\x01", b"\x00"
_PROBE, _RELAY = b"P", b"R"
_HANDSHAKE_TIMEOUT_S = 10.0
_MAX_UNPROVEN = 16
"""Connections still in their handshake at once; more are closed at once."""
_CHUNK = 1 << 18

T = TypeVar("T")


class ChannelError(RuntimeError):
    """The channel could not be opened; the message names the host and why."""


def read_key(path: Path) -> bytes:
    """The shared key in `path` (its bytes, surrounding whitespace dropped)."""
    try:
        key = path.read_bytes().strip()
    except OSError as exc:
        raise ChannelError(f"key file {path}: {exc.strerror}") from None
    if len(key) < MIN_KEY_BYTES:
        raise ChannelError(
            f"key file {path}: a key needs at least {MIN_KEY_BYTES} bytes "
            "(mlxcel rpc-server --new-key FILE writes one)"
        )
    if path.stat().st_mode & 0o077:
        logger.warning("key file %s can be read by other users: chmod 600 it", path)
    return key


def new_key(path: Path) -> None:
    """Write a fresh random key to `path`, readable by its owner only; never overwrites."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(secrets.token_hex(32) + "\n")


def _mac(key: bytes, role: bytes, server_nonce: bytes, client_nonce: bytes, cert: bytes) -> bytes:
    message = role + server_nonce + client_nonce + hashlib.sha256(cert).digest()
    return hmac.new(key, message, hashlib.sha256).digest()


def _server_tls() -> tuple[ssl.SSLContext, bytes]:
    """A TLS 1.3 server context with a fresh self-signed certificate, and the certificate."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    private = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mlxcel rpc-server")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=3650))
        .sign(private, hashes.SHA256())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    with tempfile.TemporaryDirectory() as folder:
        chain = Path(folder) / "chain.pem"
        fd = os.open(chain, os.O_WRONLY | os.O_CREAT, 0o600)
        with os.fdopen(fd, "wb") as file:
            file.write(
                private.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
            file.write(cert.public_bytes(serialization.Encoding.PEM))
        context.load_cert_chain(chain)
    return context, cert.public_bytes(serialization.Encoding.DER)


def _client_tls() -> ssl.SSLContext:
    # No CA: the server proves itself with the key, bound to the certificate it showed.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


def _no_delay(writer: asyncio.StreamWriter) -> None:
    """No Nagle delay (ggml's messages are small and answered one by one), and keepalives,
    so a host that vanishes without a word (a cable, a partition) ends the link in about
    half a minute instead of leaving a request waiting on it."""
    sock = writer.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    # TCP_USER_TIMEOUT bounds data left unacknowledged, which keepalives do not probe.
    tuning = (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 4))
    for option, value in (*tuning, ("TCP_USER_TIMEOUT", 30_000)):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, ConnectionError):
        while data := await reader.read(_CHUNK):
            writer.write(data)
            await writer.drain()


async def _relay(one: tuple[Any, Any], other: tuple[Any, Any]) -> None:
    """Copy both ways until either side ends, then close both (ggml then sees the end)."""
    tasks = [
        asyncio.ensure_future(_pipe(one[0], other[1])),
        asyncio.ensure_future(_pipe(other[0], one[1])),
    ]
    await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        task.cancel()
    for writer in (one[1], other[1]):
        writer.close()


class _LoopThread:
    """An asyncio loop on a daemon thread of its own: ggml's calls block their threads."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(_quiet)
        threading.Thread(target=self.loop.run_forever, name=name, daemon=True).start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)


def _quiet(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    # A client that fails the TLS handshake is one refused client, not a traceback.
    logger.warning("rpc channel: %s", context.get("exception") or context.get("message"))


class ChannelServer:
    """The network side of `mlxcel rpc-server --listen`: admits key holders and forwards
    their bytes to ggml's RPC server on a loopback port."""

    def __init__(self, key: bytes, ggml_port: int) -> None:
        self._key = key
        self._ggml_port = ggml_port
        self._tls, self._cert = _server_tls()
        self._unproven = 0
        self._thread = _LoopThread("rpc-channel")

    def listen(self, host: str, port: int) -> None:
        """Start listening (raises OSError when the address cannot be bound)."""
        self._thread.run(
            asyncio.start_server(
                self._serve, host, port, ssl=self._tls, ssl_handshake_timeout=_HANDSHAKE_TIMEOUT_S
            )
        )

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if self._unproven >= _MAX_UNPROVEN:
            writer.close()
            return
        self._unproven += 1
        try:
            purpose = await asyncio.wait_for(self._challenge(reader, writer), _HANDSHAKE_TIMEOUT_S)
        except (OSError, EOFError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            purpose = None
        finally:
            self._unproven -= 1
        if purpose is None:
            logger.warning("rpc channel: refused %s: it did not prove it holds the key", peer)
            writer.close()
            return
        if purpose != _RELAY:
            writer.close()
            return
        logger.info("rpc channel: %s proved the key; forwarding to ggml", peer)
        _no_delay(writer)
        try:
            ggml = await asyncio.open_connection("127.0.0.1", self._ggml_port)
        except OSError as exc:
            logger.error("rpc channel: ggml's RPC server is not answering: %s", exc)
            writer.close()
            return
        _no_delay(ggml[1])
        await _relay((reader, writer), ggml)

    async def _challenge(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bytes | None:
        server_nonce = os.urandom(_NONCE)
        writer.write(_MAGIC + server_nonce)
        await writer.drain()
        answer = await reader.readexactly(1 + _NONCE + _MAC)
        purpose, client_nonce, mac = answer[:1], answer[1 : 1 + _NONCE], answer[1 + _NONCE :]
        expected = _mac(self._key, b"client", server_nonce, client_nonce, self._cert)
        if not hmac.compare_digest(mac, expected):
            writer.write(_REFUSED)
            await writer.drain()
            return None
        writer.write(_OK + _mac(self._key, b"server", server_nonce, client_nonce, self._cert))
        await writer.drain()
        return purpose


class ChannelClient:
    """The serving side: a loopback port for ggml's RPC client that carries each of its
    connections over the keyed channel to `host:port`."""

    def __init__(self, host: str, port: int, key: bytes, shown: str) -> None:
        self.shown = shown
        self._host, self._port, self._key = host, port, key
        self._tls = _client_tls()
        self._thread = _LoopThread("rpc-channel")
        self.local_port = 0

    def open(self) -> str:
        """Prove the key to the host once, then listen on loopback; the ggml endpoint."""
        self._thread.run(self._probe(), _HANDSHAKE_TIMEOUT_S * 2)
        server = self._thread.run(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.local_port = server.sockets[0].getsockname()[1]
        return f"127.0.0.1:{self.local_port}"

    async def _probe(self) -> None:
        _, writer = await self._connect(_PROBE)
        writer.close()

    async def _connect(self, purpose: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self._host, self._port, ssl=self._tls),
                _HANDSHAKE_TIMEOUT_S,
            )
        except (OSError, asyncio.TimeoutError) as exc:
            errno = getattr(exc, "errno", None)
            why = os.strerror(errno) if errno else str(exc) or "timed out"
            raise ChannelError(f"RPC host {self.shown} is unreachable: {why}") from None
        try:
            await asyncio.wait_for(self._prove(reader, writer, purpose), _HANDSHAKE_TIMEOUT_S)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
            writer.close()
            raise ChannelError(
                f"RPC host {self.shown} broke off the key exchange (not an mlxcel rpc-server "
                "--listen port?)"
            ) from None
        except ChannelError:
            writer.close()
            raise
        _no_delay(writer)
        return reader, writer

    async def _prove(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, purpose: bytes
    ) -> None:
        cert = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        hello = await reader.readexactly(len(_MAGIC) + _NONCE)
        if not hello.startswith(_MAGIC):
            raise ChannelError(f"RPC host {self.shown} is not an mlxcel rpc-server --listen port")
        server_nonce, client_nonce = hello[len(_MAGIC) :], os.urandom(_NONCE)
        mac = _mac(self._key, b"client", server_nonce, client_nonce, cert)
        writer.write(purpose + client_nonce + mac)
        await writer.drain()
        if await reader.readexactly(1) != _OK:
            raise ChannelError(f"RPC host {self.shown} refused the key")
        expected = _mac(self._key, b"server", server_nonce, client_nonce, cert)
        if not hmac.compare_digest(await reader.readexactly(_MAC), expected):
            raise ChannelError(f"RPC host {self.shown} did not prove it holds the key")

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            remote = await self._connect(_RELAY)
        except ChannelError as exc:
            logger.error("%s", exc)
            writer.close()
            return
        await _relay((reader, writer), remote)
