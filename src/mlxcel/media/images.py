"""Images: a header read under the pixel limit (in the HTTP process), then decoded (in the
model's worker): first frame, RGB, and a digest of its pixels."""

from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass

from PIL import Image as PILImage

from mlxcel.media.policy import MediaError
from mlxcel.media.recent import Recent

# Where an image or audio clip sits in a rendered prompt, as the engines are given it (libmtmd
# as its media marker): not llama-server's marker, which a message may quote (a question about
# llama.cpp, with a screenshot), and which then stays the text it is.
MEDIA_MARKER = "<__mlxcel_media__>"
# llama-server's marker (libmtmd's default): where media sit in its /completion prompts and in
# /apply-template's answers.
LLAMA_MEDIA_MARKER = "<__media__>"

# Images decoded recently in this process (a model's worker), by their encoded bytes and the
# pixel limit they were read under: a picture sent again (the next turn of a conversation) is
# neither decoded nor hashed with sha256 again. Python's own hash of the bytes (quicker than
# sha256) finds it, and a whole comparison confirms it, so nothing but the same file is taken
# for it. Bounded by count and by the bytes of the pixels and files kept.
RECENT_IMAGES = 16
RECENT_BYTES = 64 * 1024 * 1024

# Formats a request may send, by the MIME types that name them.
FORMATS = {"image/png": "PNG", "image/jpeg": "JPEG", "image/webp": "WEBP", "image/gif": "GIF"}


def image_type(head: bytes) -> str | None:
    """The MIME type of an image in one of FORMATS, by the first 12 bytes of its file; None
    for anything else (a WAV file is RIFF too, but not WEBP)."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head.startswith((b"GIF87a", b"GIF89a")):
        return "image/gif"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "image/webp"
    return None


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


@dataclass(frozen=True)
class EncodedImage:
    """An image as the request sent it (PNG, JPEG, WebP or GIF), its header read and its size
    checked: decoded where the model reads it (`decoded`, in its worker), so its pixels never
    cross between processes (a 4000x3000 photo's 36 MB held the HTTP process's event loop for
    65 ms on their way to the worker; its 8.7 MB JPEG crosses instead)."""

    data: bytes
    width: int
    height: int
    max_pixels: int
    """The pixel limit it was read under."""
    param: str | None = None
    """The request field it came in, for a 400 about it."""

    def decoded(self) -> Image:
        """Its pixels: decoded, or kept from the same file decoded recently."""
        key = (self.max_pixels, self.data)
        kept = _recent.get(key)
        if kept is None:
            kept = decode(self.data, self.max_pixels, self.param)
            _recent.put(key, kept)
        return kept


def _kept_bytes(key: tuple[int, bytes], image: Image) -> int:
    return len(key[1]) + len(image.rgb)


_recent: Recent[tuple[int, bytes], Image] = Recent(RECENT_IMAGES, RECENT_BYTES, _kept_bytes)


def checked(data: bytes, max_pixels: int, param: str | None = None) -> EncodedImage:
    """The image in `data`, its header read (not its pixels): refuses what is no PNG, JPEG,
    WebP or GIF, and more than `max_pixels`."""
    width, height = _opened(data, max_pixels, param).size
    return EncodedImage(data, width, height, max_pixels, param)


def _opened(data: bytes, max_pixels: int, param: str | None) -> PILImage.Image:
    """The image opened (its header read) and its size checked before any pixel is decoded
    (decompression bombs)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PILImage.DecompressionBombWarning)
            opened = PILImage.open(io.BytesIO(data), formats=list(FORMATS.values()))
    except (PILImage.DecompressionBombError, PILImage.DecompressionBombWarning) as exc:
        raise MediaError(f"image refused: {exc}", "image_too_many_pixels", param) from exc
    except Exception as exc:
        raise _undecodable(param) from exc
    width, height = opened.size
    if width * height > max_pixels:
        raise MediaError(
            f"image is {width}x{height} = {width * height} pixels, more than the limit "
            f"of {max_pixels} (--media-max-pixels)",
            "image_too_many_pixels",
            param,
        )
    return opened


def _undecodable(param: str | None) -> MediaError:
    return MediaError(
        "could not decode the image: send PNG, JPEG, WebP or GIF", "invalid_image", param
    )


def decode(data: bytes, max_pixels: int, param: str | None = None) -> Image:
    """Decode PNG, JPEG, WebP or GIF (its first frame); refuse more than `max_pixels`."""
    opened = _opened(data, max_pixels, param)
    width, height = opened.size
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PILImage.DecompressionBombWarning)
            opened.seek(0)
            rgb = opened.convert("RGB")
    except Exception as exc:
        raise _undecodable(param) from exc
    pixels = rgb.tobytes()
    digest = hashlib.sha256(f"{width}x{height}:".encode())
    digest.update(pixels)  # not prefixed with the size by a copy of every pixel
    return Image(width, height, pixels, digest.hexdigest())
