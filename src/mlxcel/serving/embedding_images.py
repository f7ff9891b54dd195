"""Images among an embedding request's inputs: which items are images, whether the model takes
them, and their vectors, each read under the server's media policy and limits as chat's images
are (data: URIs by default; remote and local files only where the flags allow), decoded in the
model's worker."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlxcel.backends.embeddings import Unreadable
from mlxcel.media.images import EncodedImage, image_type
from mlxcel.media.loader import ImageRef, load_images
from mlxcel.media.policy import MediaError, MediaPolicy
from mlxcel.media.sources import decode_base64
from mlxcel.models.encoders import EmbeddingModel
from mlxcel.protocol.embeddings import BareImage, TypedImage
from mlxcel.protocol.errors import invalid_request


@dataclass(frozen=True)
class ImageInput:
    """An image among the inputs: its URL (data:, http(s):, file:) and the field it came in."""

    url: str
    param: str


def image_input(item: TypedImage | BareImage, param: str) -> ImageInput:
    """The image a typed item names. A bare `image` that is no URL is base64 (Jina's), its
    type read from its first bytes."""
    if isinstance(item, TypedImage):
        url = item.image_url if isinstance(item.image_url, str) else item.image_url.url
        return ImageInput(url, f"{param}.image_url")
    text = item.image.strip()
    if text.partition(":")[0].lower() in ("data", "http", "https", "file"):
        return ImageInput(text, f"{param}.image")
    try:
        # 16 characters of base64 are the file's first 12 bytes.
        mime = image_type(decode_base64(text[:16]))
    except MediaError:
        mime = None
    if mime is None:
        raise invalid_request(
            "'image' is neither a URL nor base64 of a PNG, JPEG, WebP or GIF image",
            f"{param}.image",
            "invalid_image",
        )
    return ImageInput(f"data:{mime};base64,{text}", f"{param}.image")


def check_takes_images(model: EmbeddingModel, images: list[ImageInput], name: str) -> None:
    """A 400 naming the first image when the model embeds text only."""
    if images and "image" not in model.info.modalities:
        raise invalid_request(
            f"the model '{name}' embeds text only, not images",
            images[0].param,
            "unsupported_modality",
        )


async def read_images(images: list[ImageInput], policy: MediaPolicy) -> list[EncodedImage]:
    """The images read and their headers checked here, under the media policy and limits; a
    400 naming the image the server refuses."""
    if not images:
        return []
    try:
        return await load_images([ImageRef(i.url, i.param) for i in images], policy)
    except MediaError as exc:
        raise invalid_request(exc.message, exc.param or "input", exc.code) from exc


async def image_vectors(
    model: EmbeddingModel, images: list[ImageInput], encoded: list[EncodedImage]
) -> list[np.ndarray]:
    """Each image's raw vector, decoded and embedded in the model's worker; a 400 naming the
    image whose pixels do not decode."""
    if not images:
        return []
    vectors = await model.embed_images(encoded)
    for image, vector in zip(images, vectors, strict=True):
        if isinstance(vector, Unreadable):
            raise invalid_request(vector.message, image.param, vector.code)
    return [v for v in vectors if not isinstance(v, Unreadable)]
