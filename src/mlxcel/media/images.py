"""Decoding an image under the pixel limit: first frame, RGB, and a digest of its pixels."""

from __future__ import annotations

import hashlib
import io
import warnings
from collections.abc import Callable
from dataclasses import dataclass

from PIL import Image as PILImage

from mlxcel.media.policy import MediaError
from mlxcel.media.recent import Recent

# Where an image sits in a rendered prompt (libmtmd's default marker, which it is given).
MEDIA_MARKER = "<__media__>"

# Images decoded recently, by what they were read from (a data: URI's text, a fetched body): a
# picture sent again (the next turn of a conversation) is neither read (a data: URI's base64)
# nor decoded nor hashed with sha256 again. The source itself is the key: Python's own hash
# of it (3x quicker than sha256, kept on the string) finds it, and a whole comparison confirms
# it, so nothing but the same text is taken for it. Bounded by count and by the bytes of the
# pixels and sources kept.
RECENT_IMAGES = 16
RECENT_BYTES = 64 * 1024 * 1024

# Formats a request may send, by the MIME types that name them.
FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP", "image/gif": "GIF"}


@dataclass(frozen=True)
class Image:
    """A decoded image: RGB rows of `width` x `height` pixels, and a digest that names it."""

    width: int
    height: int
    rgb: bytes
    digest: str
    """sha256 of the size and pixels: the same picture in two encodings is one image."""

    def to_pil(self) -> PILImage.Image:
        """The image as a Pillow RGB image (for processors that take one)."""
        return PILImage.frombytes("RGB", (self.width, self.height), self.rgb)


RecentKey = tuple[int, str | bytes]
"""An image's source (a data: URI's text, a fetched body) and the pixel limit it was read under."""


def _kept_bytes(key: RecentKey, decoded: tuple[Image, int]) -> int:
    return len(key[1]) + len(decoded[0].rgb)


_recent: Recent[RecentKey, tuple[Image, int]] = Recent(RECENT_IMAGES, RECENT_BYTES, _kept_bytes)


def recent_key(source: str | bytes, max_pixels: int) -> RecentKey:
    """What an image read from `source` (a data: URI's text, a fetched body) under a pixel
    limit is kept by."""
    return max_pixels, source


def recent(key: RecentKey) -> tuple[Image, int] | None:
    """The image kept under `key`, and its encoded size in bytes, if one was decoded recently."""
    return _recent.get(key)


def decode_kept(
    key: RecentKey, read: Callable[[], bytes], max_pixels: int, param: str | None = None
) -> tuple[Image, int]:
    """`decode` of the encoded image `read` returns, kept under `key` with its size in bytes."""
    data = read()
    decoded = decode(data, max_pixels, param), len(data)
    _recent.put(key, decoded)
    return decoded


def decode(data: bytes, max_pixels: int, param: str | None = None) -> Image:
    """Decode PNG, JPEG, WebP or GIF (its first frame); refuse more than `max_pixels`."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PILImage.DecompressionBombWarning)
            opened = PILImage.open(io.BytesIO(data), formats=list(FORMATS.values()))
            width, height = opened.size
            # The header's size is checked before any pixel is decoded (decompression bombs).
            if width * height > max_pixels:
                raise MediaError(
                    f"image is {width}x{height} = {width * height} pixels, more than the limit "
                    f"of {max_pixels} (--media-max-pixels)",
                    "image_too_many_pixels",
                    param,
                )
            opened.seek(0)
            rgb = opened.convert("RGB")
    except MediaError:
        raise
    except (PILImage.DecompressionBombError, PILImage.DecompressionBombWarning) as exc:
        raise MediaError(f"image refused: {exc}", "image_too_many_pixels", param) from exc
    except Exception as exc:
        raise MediaError(
            "could not decode the image: send PNG, JPEG, WebP or GIF", "invalid_image", param
        ) from exc
    pixels = rgb.tobytes()
    digest = hashlib.sha256(f"{width}x{height}:".encode())
    digest.update(pixels)  # not prefixed with the size by a copy of every pixel
    return Image(width, height, pixels, digest.hexdigest())
