"""An edit's uploads: images checked and decoded, and a mask read from its alpha channel,
both brought to the size the edit is drawn at."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from mlxcel.engine.image_types import ImageModelInfo, Pixels
from mlxcel.protocol.errors import invalid_request
from mlxcel.serving.images import parse_size

# OpenAI's limits on an edit's uploads.
MAX_INPUT_IMAGES = 16
MAX_IMAGE_BYTES = 25 * 1024 * 1024
FORMATS = ("PNG", "JPEG", "WEBP")


def _open(data: bytes, param: str, max_side: int) -> Any:
    """The upload as a PIL image, its size checked from the header before any pixel is read."""
    from PIL import Image, UnidentifiedImageError

    if len(data) > MAX_IMAGE_BYTES:
        raise invalid_request(
            f"'{param}' is {len(data)} bytes; an image may be at most {MAX_IMAGE_BYTES}", param
        )
    try:
        image = Image.open(io.BytesIO(data))
    except Image.DecompressionBombError:
        raise invalid_request(f"'{param}' has too many pixels to decode", param) from None
    except (UnidentifiedImageError, OSError, ValueError):
        raise invalid_request(f"'{param}' is not a PNG, JPEG or WebP image", param) from None
    if image.format not in FORMATS:
        raise invalid_request(f"'{param}' is {image.format}; send a PNG, JPEG or WebP image", param)
    width, height = image.size
    if max(width, height) > max_side:
        raise invalid_request(
            f"'{param}' is {width}x{height}; this model takes sides up to {max_side}", param
        )
    try:
        image.load()
    except (OSError, ValueError):
        raise invalid_request(f"'{param}' is a damaged {image.format} image", param) from None
    return image


def _check_task(count: int, masked: bool, info: ImageModelInfo) -> None:
    if info.max_input_images == 0:
        raise invalid_request("this model draws from text only; it does no edits", "image")
    if count == 0:
        raise invalid_request("an edit needs an 'image'", "image")
    if count > MAX_INPUT_IMAGES:
        raise invalid_request(f"{count} images; an edit takes at most {MAX_INPUT_IMAGES}", "image")
    if count > info.max_input_images:
        raise invalid_request(
            f"{count} images; this model edits {info.max_input_images} image at a time", "image"
        )
    if masked and not info.inpainting:
        raise invalid_request("this model does no inpainting; send no 'mask'", "mask")
    if not masked and not info.image_to_image:
        raise invalid_request("this model only inpaints: send a 'mask'", "mask")


def _auto_size(size: tuple[int, int], info: ImageModelInfo) -> tuple[int, int]:
    """The input's own size, down to the multiples the model needs."""
    (width, height), step = size, info.multiple
    return max(step, width - width % step), max(step, height - height % step)


def edit_inputs(
    images: list[bytes], mask: bytes | None, size: str | None, info: ImageModelInfo
) -> tuple[Pixels, Pixels | None]:
    """The image to edit and the mask (255: repaint), at the edit's size; 400 for uploads the
    model cannot take (too many, not images, a mask without alpha or of another size)."""
    from PIL import Image

    _check_task(len(images), mask is not None, info)
    image = _open(images[0], "image", info.max_side)
    target = parse_size(size, info, _auto_size(image.size, info))
    pixels = np.asarray(image.convert("RGB").resize(target, Image.Resampling.LANCZOS))
    if mask is None:
        return pixels, None
    mask_image = _open(mask, "mask", info.max_side)
    if mask_image.format != "PNG" or "A" not in mask_image.getbands():
        raise invalid_request(
            "'mask' must be a PNG with an alpha channel (transparent where to edit)", "mask"
        )
    if mask_image.size != image.size:
        raise invalid_request(
            f"'mask' is {mask_image.size[0]}x{mask_image.size[1]} but the image is "
            f"{image.size[0]}x{image.size[1]}; they must be the same size",
            "mask",
        )
    alpha = mask_image.getchannel("A").resize(target, Image.Resampling.NEAREST)
    return pixels, np.where(np.asarray(alpha) == 0, 255, 0).astype(np.uint8)
