"""Images in chat requests: which the request names, whether the model takes them, loading."""

from __future__ import annotations

from mlxcel.media.images import Image
from mlxcel.media.loader import ImageRef, load_images
from mlxcel.media.policy import MediaError, MediaPolicy
from mlxcel.models.loaded import LoadedModel
from mlxcel.protocol.chat import ChatCompletionRequest
from mlxcel.serving.errors import invalid_request

_KINDS = {"image_url": "image", "input_audio": "audio"}


def image_refs(request: ChatCompletionRequest, model: LoadedModel) -> list[ImageRef]:
    """The request's images in prompt order; a 400 for a part the model cannot read."""
    modalities = model.generator.input_modalities
    refs: list[ImageRef] = []
    for i, message in enumerate(request.messages):
        for j, part in enumerate(message.content or []):
            kind = _KINDS.get(part.type)
            if kind is None:
                continue
            param = f"messages[{i}].content[{j}]"
            if kind not in modalities:
                raise invalid_request(
                    f"model does not support {kind} input", param, "unsupported_modality"
                )
            if part.image_url is not None:
                refs.append(ImageRef(part.image_url.url, f"{param}.image_url.url"))
    return refs


async def request_images(
    request: ChatCompletionRequest, model: LoadedModel, policy: MediaPolicy
) -> list[Image]:
    """The request's images, fetched and decoded under the server's media policy."""
    refs = image_refs(request, model)
    if not refs:
        return []
    try:
        return await load_images(refs, policy)
    except MediaError as exc:
        raise invalid_request(exc.message, exc.param, exc.code) from exc
