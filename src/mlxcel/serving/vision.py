"""Images in chat requests: which the request names, whether the model takes them, loading."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from mlxcel.engine.types import EngineError, MediaSpan, SeesImages
from mlxcel.media.images import Image
from mlxcel.media.loader import ImageRef, load_images
from mlxcel.media.policy import MediaError, MediaPolicy
from mlxcel.models.loaded import LoadedModel
from mlxcel.protocol.chat import ChatCompletionRequest
from mlxcel.protocol.responses import FunctionCallOutputItem, MessageItem, ResponsesRequest
from mlxcel.serving.errors import invalid_request
from mlxcel.serving.tokens import check_text_size

# A media part: its modality, the request field it sits in, its URL (None for audio) and
# the field that holds the URL.
MediaPart = tuple[str, str, str | None, str]


def chat_media(request: ChatCompletionRequest) -> Iterator[MediaPart]:
    """A chat request's image and audio parts, in prompt order."""
    for i, message in enumerate(request.messages):
        for j, part in enumerate(message.content or []):
            param = f"messages.{i}.content.{j}"
            if part.image_url is not None:
                yield "image", param, part.image_url.url, f"{param}.image_url.url"
            elif part.type == "input_audio":
                yield "audio", param, None, param


def responses_media(request: ResponsesRequest) -> Iterator[MediaPart]:
    """A Responses request's input_image parts (in messages and tool outputs), in prompt order."""
    for i, item in enumerate(request.input):
        if isinstance(item, MessageItem):
            parts, field = item.content, "content"
        elif isinstance(item, FunctionCallOutputItem):
            parts, field = item.output, "output"
        else:
            continue
        for j, part in enumerate(parts):
            if part.type == "input_image":
                param = f"input.{i}.{field}.{j}"
                yield "image", param, part.image_url, f"{param}.image_url"


def history_media(urls: Sequence[str], param: str) -> Iterator[MediaPart]:
    """A stored conversation's images, named by the field that brought the conversation."""
    for url in urls:
        yield "image", param, url, param


def media_urls(parts: Iterator[MediaPart]) -> tuple[str, ...]:
    """The URLs of the image parts, in order."""
    return tuple(url for kind, _, url, _ in parts if kind == "image" and url is not None)


def image_refs(parts: Iterator[MediaPart], model: LoadedModel) -> list[ImageRef]:
    """The images to load; a 400 for a part the model cannot read."""
    modalities = model.generator.input_modalities
    refs: list[ImageRef] = []
    for kind, param, url, url_param in parts:
        if kind not in modalities:
            message = f"model does not support {kind} input"
            raise invalid_request(message, param, "unsupported_modality")
        if url is not None:
            refs.append(ImageRef(url, url_param))
    return refs


async def request_images(
    parts: Iterator[MediaPart], model: LoadedModel, policy: MediaPolicy
) -> list[Image]:
    """The request's images, fetched and decoded under the server's media policy."""
    refs = image_refs(parts, model)
    if not refs:
        return []
    try:
        return await load_images(refs, policy)
    except MediaError as exc:
        raise invalid_request(exc.message, exc.param, exc.code) from exc


def prompt_tokens(
    model: LoadedModel, text: str, images: Sequence[Image], param: str = "messages"
) -> tuple[list[int], tuple[MediaSpan, ...]]:
    """A rendered prompt's tokens, and where its images sit (embedded here, on this thread);
    a text far beyond the context is refused from its size first (a 400 naming `param`)."""
    generator = model.generator
    check_text_size(generator, text, param)
    if not images:
        return generator.tokenize(text, add_special=generator.add_bos, parse_special=True), ()
    if not isinstance(generator, SeesImages):
        raise invalid_request("model does not support image input", "messages")
    try:
        return generator.tokenize_with_images(text, images)
    except EngineError as exc:
        raise invalid_request(str(exc), "messages") from exc
