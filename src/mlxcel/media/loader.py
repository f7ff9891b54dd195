"""A request's images: read from their sources and decoded, each limit checked on the way."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from mlxcel.media.addresses import Resolver, resolve
from mlxcel.media.images import Image, decode_recent
from mlxcel.media.policy import MediaError, MediaPolicy
from mlxcel.media.sources import image_bytes


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
            data = await image_bytes(ref.url, policy, limits.max_image_bytes, resolver)
        except MediaError as exc:
            exc.param = exc.param or ref.param
            raise
        if len(data) > limits.max_image_bytes:
            raise MediaError(
                f"an image is larger than the limit of {limits.max_image_bytes} bytes "
                "(--media-max-image-bytes)",
                "image_too_large",
                ref.param,
            )
        total += len(data)
        if total > limits.max_total_bytes:
            raise MediaError(
                f"the request's media come to more than the limit of {limits.max_total_bytes} "
                "bytes (--media-max-bytes)",
                "media_too_large",
                ref.param,
            )
        images.append(await asyncio.to_thread(decode_recent, data, limits.max_pixels, ref.param))
    return images
