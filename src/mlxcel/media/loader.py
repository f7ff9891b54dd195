"""A request's images: read from their sources and their headers checked, each limit checked on
the way; the model's worker decodes them (`EncodedImage.decoded`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from mlxcel.media.addresses import Resolver, resolve
from mlxcel.media.images import EncodedImage, checked
from mlxcel.media.policy import MediaError, MediaLimits, MediaPolicy
from mlxcel.media.recent import Recent
from mlxcel.media.sources import data_uri, image_bytes, is_data_uri

# Data: URIs read recently, by their text and the pixel limit they were read under: a picture
# sent again (the next turn of a conversation) is not base64-decoded nor its header read again
# (0.5 ms of the event loop for a 512x512 PNG). Python's own hash of the text (kept on the
# string) finds it, a whole comparison confirms it. Bounded by count and bytes.
RECENT_URIS = 16
RECENT_URI_BYTES = 64 * 1024 * 1024


def _kept_bytes(key: tuple[int, str], image: EncodedImage) -> int:
    return len(key[1]) + len(image.data)


_recent: Recent[tuple[int, str], EncodedImage] = Recent(RECENT_URIS, RECENT_URI_BYTES, _kept_bytes)


@dataclass(frozen=True)
class ImageRef:
    """An image a request names: its URL (data:, http(s):, file:) and the field it sits in."""

    url: str
    param: str | None = None


async def load_images(
    refs: Sequence[ImageRef], policy: MediaPolicy, resolver: Resolver = resolve
) -> list[EncodedImage]:
    """Every image of a request, in order, as it was sent, its header checked."""
    limits = policy.limits
    if len(refs) > limits.max_images:
        raise MediaError(
            f"the request has {len(refs)} images, more than the limit of {limits.max_images} "
            "(--media-max-images)",
            "too_many_images",
        )
    images: list[EncodedImage] = []
    total = 0
    for ref in refs:
        try:
            image = await _load(ref, policy, resolver)
        except MediaError as exc:
            exc.param = exc.param or ref.param
            raise
        total += len(image.data)
        if total > limits.max_total_bytes:
            raise MediaError(
                f"the request's media come to more than the limit of {limits.max_total_bytes} "
                "bytes (--media-max-bytes)",
                "media_too_large",
                ref.param,
            )
        images.append(image)
    return images


async def _load(ref: ImageRef, policy: MediaPolicy, resolver: Resolver) -> EncodedImage:
    """One image, its size in bytes and its header checked. Neither a data: URI's base64
    (pybase64: 0.05 ms for 600 KB) nor a header (0.02 ms) is worth a thread's hop (0.3 ms)."""
    limits = policy.limits
    if not is_data_uri(ref.url):
        data = await image_bytes(ref.url, policy, limits.max_image_bytes, resolver)
        _check_size(len(data), limits, ref.param)
        return checked(data, limits.max_pixels, ref.param)
    key = (limits.max_pixels, ref.url)
    kept = _recent.get(key)
    if kept is None:
        data = data_uri(ref.url)
        _check_size(len(data), limits, ref.param)
        kept = checked(data, limits.max_pixels, ref.param)
        _recent.put(key, kept)
    # Kept from a request under the same pixel limit, maybe not under the same byte limit.
    _check_size(len(kept.data), limits, ref.param)
    return replace(kept, param=ref.param)


def _check_size(size: int, limits: MediaLimits, param: str | None) -> None:
    if size > limits.max_image_bytes:
        raise MediaError(
            f"an image is larger than the limit of {limits.max_image_bytes} bytes "
            "(--media-max-image-bytes)",
            "image_too_large",
            param,
        )
