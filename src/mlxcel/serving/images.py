"""Images: a request's options checked against the model, one batch run through its queue,
and the answer in OpenAI's shapes (whole, or streamed as typed events)."""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from mlxcel.engine.image_queue import ImageQueue
from mlxcel.engine.image_types import (
    ImageJob,
    ImageModelInfo,
    ImageProgress,
    ImageResult,
    PartialImage,
    Pixels,
)
from mlxcel.engine.types import EngineError
from mlxcel.logs import current_request
from mlxcel.protocol.errors import (
    APIError,
    invalid_request,
    model_unavailable,
    server_busy,
    shutting_down,
)
from mlxcel.protocol.images import ImageEditRequest, ImageRequest, OutputFormat
from mlxcel.serving.image_files import ImageFiles
from mlxcel.wire.facts import MODEL_UNAVAILABLE

logger = logging.getLogger(__name__)

# OpenAI's quality names as a share of the model's default steps, and the name answers give.
QUALITY_STEPS = {
    "low": 0.5,
    "medium": 1.0,
    "auto": 1.0,
    "standard": 1.0,
    "high": 1.5,
    "hd": 1.5,
    "xhigh": 2.0,
    "max": 2.0,
}
QUALITY_NAMES = {"auto": "medium", "standard": "medium", "hd": "high"}
MEDIA_TYPES: dict[OutputFormat, str] = {
    "png": "image/png",
    "jpeg": "image/jpeg",
    "webp": "image/webp",
}
PIL_FORMATS: dict[OutputFormat, str] = {"png": "PNG", "jpeg": "JPEG", "webp": "WEBP"}
Task = Literal["image_generation", "image_edit"]


@dataclass(frozen=True)
class ImageAnswer:
    """How the images of one request go back: format, and the settings answers echo."""

    task: Task
    output_format: OutputFormat
    compression: int | None
    response_format: Literal["b64_json", "url"]
    quality: str
    size: str

    def echo(self) -> dict[str, Any]:
        """The settings OpenAI's answers and events repeat."""
        return {
            "background": "opaque",
            "output_format": self.output_format,
            "quality": self.quality,
            "size": self.size,
        }


def parse_size(size: str | None, info: ImageModelInfo, auto: tuple[int, int]) -> tuple[int, int]:
    """`WIDTHxHEIGHT` as the model takes it (multiples, bounds), or `auto`; 400 otherwise."""
    if size is None or size == "auto":
        return auto
    width_text, sep, height_text = size.lower().partition("x")
    if not sep or not width_text.isdigit() or not height_text.isdigit():
        raise invalid_request(
            f"'size' must be WIDTHxHEIGHT (like 512x512) or auto, not '{size}'", "size"
        )
    width, height = int(width_text), int(height_text)
    step, largest = info.multiple, info.max_side
    for side in (width, height):
        if side % step or not step <= side <= largest:
            raise invalid_request(
                f"'size' {size} is not one this model takes: each side must be a multiple "
                f"of {step} from {step} to {largest}",
                "size",
            )
    return width, height


def _steps(body: ImageRequest, info: ImageModelInfo) -> int:
    if body.num_inference_steps is not None:
        return body.num_inference_steps
    share = QUALITY_STEPS[body.quality or "auto"]
    return max(1, round(info.default_steps * share))


def _check_options(body: ImageRequest, info: ImageModelInfo) -> None:
    if body.background == "transparent":
        raise invalid_request(
            "'background' transparent: this model draws opaque images only", "background"
        )
    if body.negative_prompt is not None and not info.negative_prompt:
        raise invalid_request("this model takes no 'negative_prompt'", "negative_prompt")
    if body.guidance_scale is not None and not info.guidance:
        raise invalid_request("this model takes no 'guidance_scale'", "guidance_scale")


@dataclass(frozen=True)
class ImageLimits:
    """What one request may cost: pixels per image (--image-max-pixels), and the work of the
    whole batch, images x steps x pixels, at most that of one image of the most pixels at
    `max_steps` steps (--image-max-steps)."""

    max_pixels: int
    max_steps: int

    def check(self, job: ImageJob) -> None:
        """400 for a batch past the bound, before any work."""
        work = job.n * job.steps * job.width * job.height
        if work > self.max_pixels * self.max_steps:
            raise invalid_request(
                f"{job.n} image(s) of {job.width}x{job.height} at {job.steps} steps is "
                f"{work} pixel-steps, more than the {self.max_pixels * self.max_steps} this "
                f"server draws for one request ({self.max_pixels} pixels at {self.max_steps} "
                "steps: --image-max-pixels, --image-max-steps); ask for fewer images, steps "
                "or pixels",
                "n" if job.n > 1 else "num_inference_steps",
            )


def prepare(
    body: ImageRequest,
    info: ImageModelInfo,
    limits: ImageLimits,
    task: Task,
    image: Pixels | None = None,
    mask: Pixels | None = None,
) -> tuple[ImageJob, ImageAnswer]:
    """The batch a request asks for, and how its answer goes back; 400 for what the model
    cannot do, or past `limits`, before any work. An edit's image and mask come already at
    the size asked for."""
    _check_options(body, info)
    if image is not None:
        height, width = image.shape[:2]
    else:
        width, height = parse_size(body.size, info, info.default_size)
    if width * height > limits.max_pixels:
        raise invalid_request(
            f"'size' {width}x{height} is {width * height} pixels, more than the "
            f"{limits.max_pixels} "
            "this server draws in one image (--image-max-pixels)",
            "size",
        )
    seed = body.seed if body.seed is not None else secrets.randbelow(2**31)
    strength = body.strength if isinstance(body, ImageEditRequest) else None
    job = ImageJob(
        prompt=body.prompt,
        width=width,
        height=height,
        n=body.n,
        steps=_steps(body, info),
        seed=seed,
        guidance_scale=body.guidance_scale,
        negative_prompt=body.negative_prompt,
        partial_images=(body.partial_images or 0) if body.stream else 0,
        image=image,
        mask=mask,
        strength=strength,
    )
    limits.check(job)
    quality = body.quality or "auto"
    answer = ImageAnswer(
        task=task,
        output_format=body.output_format or "png",
        compression=body.output_compression,
        response_format=body.response_format or "b64_json",
        quality=QUALITY_NAMES.get(quality, quality),
        size=f"{width}x{height}",
    )
    logger.info("%d image(s) of %dx%d, %d steps, seed %d", job.n, width, height, job.steps, seed)
    return job, answer


def encode(pixels: Pixels, output_format: OutputFormat, compression: int | None) -> bytes:
    """One image in its file format; `compression` 0-100 (OpenAI's output_compression) is
    JPEG/WebP quality 100-0 and, for PNG, the zlib level (PNG stays lossless)."""
    from PIL import Image

    out = io.BytesIO()
    image = Image.fromarray(np.ascontiguousarray(pixels))
    level = 100 if compression is None else compression
    if output_format == "png":
        image.save(out, format="PNG", compress_level=round(9 * (100 - level) / 100))
    else:
        image.save(out, format=PIL_FORMATS[output_format], quality=max(1, level))
    return out.getvalue()


def _engine_error(error: EngineError) -> APIError:
    if error.code == "server_busy":
        return server_busy(str(error))
    if error.code == "shutting_down":
        return shutting_down(str(error))
    if error.code == MODEL_UNAVAILABLE:
        return model_unavailable(str(error))
    if error.code == "cancelled":
        return APIError(499, "client closed the request", code="client_closed")
    return APIError(500, f"image generation failed: {error}", code=error.code)


@dataclass(frozen=True)
class ImageRun:
    """One request's batch: the queue it goes through, and where its answer goes."""

    queue: ImageQueue
    job: ImageJob
    answer: ImageAnswer
    files: ImageFiles
    base_url: str
    """The server's own address, for `url` answers."""

    async def updates(self) -> AsyncIterator[ImageProgress | PartialImage | ImageResult]:
        """The batch's progress, previews and result; leaving early cancels it between
        denoising steps."""
        record = current_request()
        try:
            handle = self.queue.submit(record.request_id if record else "images", self.job)
        except EngineError as exc:
            raise _engine_error(exc) from exc
        try:
            await handle.started(self.queue.queue_timeout)
            async for update in handle.updates():
                if isinstance(update, ImageProgress):
                    logger.info("step %d of %d", update.step, update.total)
                elif record is not None:
                    record.token()
                yield update
        except EngineError as exc:
            raise _engine_error(exc) from exc
        finally:
            handle.cancel()

    async def encoded(self, pixels: Pixels) -> bytes:
        """One image in the format asked for, encoded off the event loop."""
        answer = self.answer
        return await asyncio.to_thread(encode, pixels, answer.output_format, answer.compression)

    def link(self, data: bytes) -> str:
        """A URL under this server that serves `data` for a while."""
        file_id = self.files.put(data, MEDIA_TYPES[self.answer.output_format])
        return f"{self.base_url}/v1/images/files/{file_id}"


def _usage(prompt_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"text_tokens": prompt_tokens, "image_tokens": 0},
        "output_tokens": 0,
        "total_tokens": prompt_tokens,
    }


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def create_images(run: ImageRun) -> dict[str, Any]:
    """Run the batch and answer with every image, as OpenAI's ImagesResponse."""
    result: ImageResult | None = None
    async for update in run.updates():
        if isinstance(update, ImageResult):
            result = update
    if result is None:
        raise APIError(500, "the image batch ended without images")
    data = []
    for pixels in result.images:
        encoded = await run.encoded(pixels)
        url = run.answer.response_format == "url"
        data.append({"url": run.link(encoded)} if url else {"b64_json": _b64(encoded)})
    return {
        "created": int(time.time()),
        "data": data,
        **run.answer.echo(),
        "usage": _usage(result.prompt_tokens),
    }


async def image_events(run: ImageRun) -> AsyncIterator[dict[str, Any]]:
    """The batch as OpenAI's stream events: `<task>.partial_image` previews, then one
    `<task>.completed` per image; and `<task>.progress` after each denoising step."""
    prefix, echo = run.answer.task, run.answer.echo()
    async for update in run.updates():
        now = int(time.time())
        if isinstance(update, ImageProgress):
            yield {
                "type": f"{prefix}.progress",
                "created_at": now,
                "step": update.step,
                "total_steps": update.total,
            }
        elif isinstance(update, PartialImage):
            yield {
                "type": f"{prefix}.partial_image",
                "b64_json": _b64(await run.encoded(update.pixels)),
                "created_at": now,
                **echo,
                "partial_image_index": update.partial_index,
                "image_index": update.index,
            }
        else:
            for index, pixels in enumerate(update.images):
                encoded = await run.encoded(pixels)
                event = {
                    "type": f"{prefix}.completed",
                    "b64_json": _b64(encoded),
                    "created_at": now,
                    **echo,
                    "usage": _usage(update.prompt_tokens),
                    "image_index": index,
                }
                if run.answer.response_format == "url":
                    event["url"] = run.link(encoded)
                yield event


def stream_error(exc: Exception, _: dict[str, Any]) -> dict[str, Any]:
    """The event that reports a failure once the stream has begun."""
    error = exc if isinstance(exc, APIError) else APIError(500, "internal server error")
    return {"type": "error", **error.body()}
