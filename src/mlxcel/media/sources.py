"""Where an image's bytes come from: a data: URI, a checked remote fetch, an allowed file."""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import stat
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pybase64

from mlxcel.media.addresses import Resolver, resolve
from mlxcel.media.fetch import fetch
from mlxcel.media.images import FORMATS
from mlxcel.media.policy import MediaError, MediaPolicy


def is_data_uri(url: str) -> bool:
    """Whether `url` is a data: URI (which `data_uri` reads), not a source to fetch."""
    return url[:5].lower() == "data:"


def data_uri(url: str) -> bytes:
    """The bytes of a base64 `data:image/...` URI."""
    header, sep, payload = url[5:].partition(",")
    if not sep:
        raise MediaError("malformed data: URI (no comma)", "invalid_image_url")
    mime, *options = header.split(";")
    if "base64" not in options:
        raise MediaError("data: URIs must be base64 encoded", "invalid_image_url")
    mime = mime.strip().lower()
    if mime not in FORMATS:
        allowed = ", ".join(FORMATS)
        raise MediaError(f"image type {mime!r} is not supported: send {allowed}", "invalid_image")
    return decode_base64(payload)


_ALPHABET = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def decode_base64(payload: str) -> bytes:
    """Strict base64 (whitespace allowed), with a 400 when it is not. Base64 without
    whitespace, as clients send it, is checked and decoded in one pass by pybase64's SIMD
    decoder (0.03 ms for a 600 KB image here, where Python's strict a2b_base64 took 1.3 ms,
    of the 8-9 ms the server added to such a request's time to first token); anything else is
    checked with bytes operations (b64decode's own `validate` runs a regex, slow on a
    megabyte)."""
    invalid = MediaError("image data is not valid base64", "invalid_image")
    try:
        return pybase64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        pass  # whitespace, or not base64 at all: the checks below say which
    try:
        data = "".join(payload.split()).encode("ascii")
    except UnicodeEncodeError as exc:
        raise invalid from exc
    body = data.rstrip(b"=")
    if body.translate(None, _ALPHABET) or len(data) - len(body) > 2:
        raise invalid
    try:
        return base64.b64decode(data)
    except (binascii.Error, ValueError) as exc:
        raise invalid from exc


def local_file(url: str, policy: MediaPolicy, max_bytes: int) -> bytes:
    """A file:// URL's bytes, only from inside --allowed-local-media (symlinks resolved)."""
    if policy.local_dir is None:
        raise MediaError(
            "local media files are not read; start the server with --allowed-local-media DIR",
            "media_not_allowed",
        )
    parts = urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise MediaError("file:// URLs must name a local path", "invalid_image_url")
    root = policy.local_dir.resolve()
    # resolve() follows every symlink, so a link pointing out of the directory lands outside.
    path = Path(unquote(parts.path)).resolve()
    if not path.is_relative_to(root):
        raise MediaError(
            "local media path is outside the directory --allowed-local-media allows",
            "media_not_allowed",
        )
    try:
        # O_NOFOLLOW: a link swapped in after the check is not followed. O_NONBLOCK: a FIFO
        # opens at once instead of holding this thread until a writer comes (eight such
        # requests held every thread of the pool, and every request that needs one).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    except OSError as exc:
        raise MediaError(
            f"could not read the local media file: {exc.strerror}", "media_fetch_failed"
        ) from exc
    # What was opened, not the path: a FIFO, a device or a directory is refused before a read.
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise MediaError("local media path is not a regular file", "media_fetch_failed")
    with os.fdopen(fd, "rb") as file:
        return file.read(max_bytes + 1)


async def image_bytes(
    url: str, policy: MediaPolicy, max_bytes: int, resolver: Resolver = resolve
) -> bytes:
    """The encoded image at a URL other than a data: URI: at most `max_bytes` + 1 bytes (more
    means too large)."""
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme in ("http", "https"):
        return await fetch(url, policy, max_bytes, resolver)
    if scheme == "file":
        return await asyncio.to_thread(local_file, url, policy, max_bytes)
    raise MediaError(
        "image_url must be a data: URI, an http(s):// URL or a file:// URL", "invalid_image_url"
    )
