"""A request's images: read from their sources and decoded, each limit checked on the way."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from mlxcel.media.addresses import Resolver, resolve
from mlxcel.media.images import Image, decode_kept, recent, recent_key
from mlxcel.media.policy import MediaError, MediaLimits, MediaPolicy
from mlxcel.media.sources import data_uri, image_bytes, is_data_uri


@dataclass(frozen=True)
class ImageRef:
    """An image a request names: its URL (data:, http(s):, file:) and the field it sits in."""

    url: str
    param: str | None = None


async def load_images(
    refs: Sequence[ImageRef], policy: MediaPolicy, resolver: Resolver = resolve
) -> list[Image]:
    """Every image of a request, in order, decoded off the event loop."""
    limits = policy.limits
    if len(refs) > limits.max_images:
        raise MediaError(
            f"the request has {len(refs)} images, more than the limit of {limits.max_images} "
            "(--media-max-images)",
            "too_many_images",
        )
    images: list[Image] = []
    total = 0
    for ref in refs:
        try:
            image, size = await _load(ref, policy, resolver)
        except MediaError as exc:
            exc.param = exc.param or ref.param
            raise
        total += size
        if total > limits.max_total_bytes:
            raise MediaError(
                f"the request's media come to more than the limit of {limits.max_total_bytes} "
                "bytes (--media-max-bytes)",
                "media_too_large",
                ref.param,
            )
        images.append(image)
    return images


async def _load(ref: ImageRef, policy: MediaPolicy, resolver: Resolver) -> tuple[Image, int]:
    """One image and its encoded size. A data: URI is known by its text and decoded from
    base64 on the thread that decodes its image: sent again, it is not even base64-decoded."""
    limits = policy.limits
    source: str | bytes
    if is_data_uri(ref.url):
        source = ref.url

        def read() -> bytes:
            data = data_uri(ref.url)
            _check_size(len(data), limits, ref.param)
            return data

    else:
        body = await image_bytes(ref.url, policy, limits.max_image_bytes, resolver)
        _check_size(len(body), limits, ref.param)
        source = body

        def read() -> bytes:
            return body

    key = recent_key(source, limits.max_pixels)
    # A hash here on the event loop (quicker than reading the JSON that brought the image):
    # a picture seen recently costs no hop to a thread and back.
    loaded = recent(key)
    if loaded is None:
        loaded = await asyncio.to_thread(decode_kept, key, read, limits.max_pixels, ref.param)
    # Kept from a request under the same pixel limit, maybe not under the same byte limit.
    _check_size(loaded[1], limits, ref.param)
    return loaded


def _check_size(size: int, limits: MediaLimits, param: str | None) -> None:
    if size > limits.max_image_bytes:
        raise MediaError(
            f"an image is larger than the limit of {limits.max_image_bytes} bytes "
            "(--media-max-image-bytes)",
            "image_too_large",
            param,
        )
