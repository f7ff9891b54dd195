"""Images and audio in chat requests: which the request names, whether the model takes them,
loading them in prompt order."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from mlxcel.engine.media import TakesMedia
from mlxcel.engine.types import EngineError
from mlxcel.media.audio import AudioRef, SentMedia, load_audio
from mlxcel.media.images import MEDIA_MARKER, image_type
from mlxcel.media.loader import ImageRef, load_images
from mlxcel.media.policy import MediaError, MediaPolicy
from mlxcel.media.sources import decode_base64
from mlxcel.models.loaded import LoadedModel
from mlxcel.models.textgen import RemoteMediaModel
from mlxcel.protocol.chat import ChatCompletionRequest
from mlxcel.protocol.errors import invalid_request, refused
from mlxcel.protocol.native import MultimodalPrompt
from mlxcel.protocol.responses import FunctionCallOutputItem, MessageItem, ResponsesRequest
from mlxcel.serving.tokens import check_text_size
from mlxcel.wire.facts import MediaPrompt


@dataclass(frozen=True)
class MediaPart:
    """A media part of a request: its modality, the field it sits in, and its source: an
    image's URL (in `source_param`), or an audio clip's base64 data and claimed format."""

    kind: str
    param: str
    source: str
    source_param: str
    format: str = ""


def chat_media(request: ChatCompletionRequest) -> Iterator[MediaPart]:
    """A chat request's image and audio parts, in prompt order."""
    for i, message in enumerate(request.messages):
        for j, part in enumerate(message.content or []):
            param = f"messages.{i}.content.{j}"
            if part.image_url is not None:
                yield MediaPart("image", param, part.image_url.url, f"{param}.image_url.url")
            elif part.input_audio is not None:
                audio = part.input_audio
                yield MediaPart("audio", param, audio.data, param, audio.format)


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
            if part.type == "input_image" and part.image_url is not None:
                param = f"input.{i}.{field}.{j}"
                yield MediaPart("image", param, part.image_url, f"{param}.image_url")


def native_media(prompt: MultimodalPrompt, model: LoadedModel) -> Iterator[MediaPart]:
    """llama-server's `multimodal_data`, in order: an image where the file begins as a PNG,
    JPEG, WebP or GIF does, else (for a model that hears) an audio clip, whose decoder says
    what it is; a 400 naming the item for anything else."""
    hears = "audio" in model.generator.input_modalities
    for i, data in enumerate(prompt.multimodal_data):
        param = f"prompt.multimodal_data.{i}"
        try:
            # 16 characters of base64 are the file's first 12 bytes.
            mime = image_type(decode_base64(data.lstrip()[:16]))
        except MediaError:
            raise invalid_request("the item is not valid base64", param, "invalid_image") from None
        if mime is not None:
            yield MediaPart("image", param, f"data:{mime};base64,{data}", param)
        elif hears:
            yield MediaPart("audio", param, data, param)
        else:
            raise invalid_request(
                "the item is not a PNG, JPEG, WebP or GIF image (and the model takes no audio)",
                param,
                "invalid_image",
            )


def history_media(urls: Sequence[str], param: str) -> Iterator[MediaPart]:
    """A stored conversation's images, named by the field that brought the conversation."""
    for url in urls:
        yield MediaPart("image", param, url, param)


def media_urls(parts: Iterator[MediaPart]) -> tuple[str, ...]:
    """The URLs of the image parts, in order."""
    return tuple(part.source for part in parts if part.kind == "image")


def checked_parts(parts: Iterator[MediaPart], model: LoadedModel) -> list[MediaPart]:
    """The parts, each of a modality the model takes; else a 400 naming the first that is not."""
    modalities = model.generator.input_modalities
    checked = list(parts)
    for part in checked:
        if part.kind not in modalities:
            message = f"model does not support {part.kind} input"
            raise invalid_request(message, part.param, "unsupported_modality")
    return checked


async def request_media(
    parts: Iterator[MediaPart], model: LoadedModel, policy: MediaPolicy
) -> list[SentMedia]:
    """The request's images and audio clips in prompt order: images fetched and decoded under
    the server's media policy, clips decoded at the rate the model's projector takes."""
    checked = checked_parts(parts, model)
    if not checked:
        return []
    images = [ImageRef(p.source, p.source_param) for p in checked if p.kind == "image"]
    clips = [AudioRef(p.source, p.format, p.param) for p in checked if p.kind == "audio"]
    generator = model.generator
    rate = generator.audio_rate if isinstance(generator, TakesMedia) else None
    if clips and rate is None:
        raise invalid_request("model does not support audio input", clips[0].param)
    try:
        loaded_images = await load_images(images, policy) if images else []
        loaded_clips = []
        if clips and rate is not None:
            loaded_clips = await load_audio(clips, policy.limits, rate)
    except MediaError as exc:
        raise invalid_request(exc.message, exc.param, exc.code) from exc
    image_iter, clip_iter = iter(loaded_images), iter(loaded_clips)
    return [next(image_iter) if p.kind == "image" else next(clip_iter) for p in checked]


def laid_out(
    model: LoadedModel, text: str, media: Sequence[SentMedia], param: str = "messages"
) -> list[int] | MediaPrompt:
    """A rendered prompt as a generation takes it: its tokens, or with media a `MediaPrompt`,
    which the model's worker lays out when the generation starts (tokenized and its media
    embedded there, on the way to the engine, in one hop); a text far beyond the context is
    refused from its size first (a 400 naming `param`)."""
    generator = model.generator
    check_text_size(generator, text, param)
    if not media:
        return generator.tokenize(text, add_special=generator.add_bos, parse_special=True)
    if not isinstance(generator, TakesMedia):
        raise invalid_request("model does not support image input", "messages")
    if text.count(MEDIA_MARKER) != len(media):
        # The text itself holds the server's marker: it would take an image's place.
        raise invalid_request(f"the text may not hold {MEDIA_MARKER} beside images", param)
    return MediaPrompt(text, tuple(media))


def prompt_tokens(
    model: LoadedModel, text: str, media: Sequence[SentMedia], param: str = "messages"
) -> list[int]:
    """A rendered prompt's tokens, its media laid out by the model's worker (to count them)."""
    prompt = laid_out(model, text, media, param)
    if not isinstance(prompt, MediaPrompt):
        return prompt
    generator = model.generator
    assert isinstance(generator, RemoteMediaModel)
    try:
        return generator.tokenize_with_media(text, media)[0]
    except EngineError as exc:
        raise refused(exc, param) from exc
