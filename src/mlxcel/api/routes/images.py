"""POST /images/generations and /images/edits, and GET /images/files/{id} for `url` answers
(served under /v1 and without it)."""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse
from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException

from mlxcel.api.auth import require_api_key
from mlxcel.api.body_check import CheckedJsonRoute
from mlxcel.api.errors import validation_error
from mlxcel.api.routes.text import unless_disconnected
from mlxcel.api.sse import typed_event_stream
from mlxcel.api.state import image_model_for
from mlxcel.engine.image_types import ImageJob
from mlxcel.logs import current_request
from mlxcel.models.images import ImageModel
from mlxcel.protocol.errors import APIError, invalid_request
from mlxcel.protocol.images import ImageEditRequest, ImageRequest
from mlxcel.serving.image_files import ImageFiles
from mlxcel.serving.image_uploads import MAX_INPUT_IMAGES, edit_inputs
from mlxcel.serving.images import (
    ImageAnswer,
    ImageRun,
    create_images,
    image_events,
    prepare,
    stream_error,
)

router = APIRouter(route_class=CheckedJsonRoute, dependencies=[Depends(require_api_key)])

IMAGE_FIELDS = ("image", "image[]")
# Form fields besides the files: every option, a few times over.
MAX_FORM_FIELDS = 100


async def _answer(
    request: Request, model: ImageModel, stream: bool, job: ImageJob, answer: ImageAnswer
) -> dict[str, Any] | StreamingResponse:
    files: ImageFiles = request.app.state.image_files
    base_url = str(request.base_url).rstrip("/")
    run = ImageRun(model.queue, job, answer, files, base_url)
    if stream:
        record = current_request()
        request_id = record.request_id if record is not None else answer.task
        # Awaited up to its first event: a client that leaves while the batch waits for the
        # pipeline frees its place in the queue at once.
        events = typed_event_stream(image_events(run), request_id, stream_error)
        return await unless_disconnected(request, events)
    return await unless_disconnected(request, create_images(run))


@router.post("/images/generations", response_model=None)
async def generations(body: ImageRequest, request: Request) -> dict[str, Any] | StreamingResponse:
    """OpenAI image generation: `n` images of a prompt, whole or streamed with previews."""
    model = await image_model_for(request, body.model, "image_generation")
    job, answer = prepare(body, model.info, request.app.state.image_limits, "image_generation")
    return await _answer(request, model, body.stream, job, answer)


async def _edit_form(request: Request) -> tuple[ImageEditRequest, list[bytes], bytes | None]:
    """An edit's options, its images and its mask, from the multipart body; 400 otherwise."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if kind != "multipart/form-data":
        raise invalid_request("an edit is sent as multipart/form-data, with the image as a file")
    try:
        form = await request.form(max_files=MAX_INPUT_IMAGES + 1, max_fields=MAX_FORM_FIELDS)
    except MultiPartException as exc:
        raise invalid_request(f"the multipart body cannot be read: {exc.message}") from exc
    fields: dict[str, Any] = {}
    images: list[bytes] = []
    mask: bytes | None = None
    for key, value in form.multi_items():
        if not isinstance(value, UploadFile):
            fields[key] = value
        elif key in IMAGE_FIELDS:
            images.append(await value.read())
        elif key == "mask":
            mask = await value.read()
        else:
            raise invalid_request(f"unsupported file field '{key}'", key, "unsupported_field")
    await form.close()
    for key in ("image", "mask"):
        if key in fields:
            raise invalid_request(f"'{key}' must be sent as a file", key)
    try:
        body = ImageEditRequest.model_validate(fields)
    except ValidationError as exc:
        raise validation_error(RequestValidationError(exc.errors())) from exc
    return body, images, mask


@router.post("/images/edits", response_model=None)
async def edits(request: Request) -> dict[str, Any] | StreamingResponse:
    """OpenAI image edits: image to image, or inpainting where the mask is transparent."""
    body, images, mask = await _edit_form(request)
    model = await image_model_for(request, body.model, "image_edit")
    image, repaint = await asyncio.to_thread(edit_inputs, images, mask, body.size, model.info)
    limits = request.app.state.image_limits
    job, answer = prepare(body, model.info, limits, "image_edit", image, repaint)
    return await _answer(request, model, body.stream, job, answer)


@router.get("/images/files/{file_id}")
async def image_file(file_id: str, request: Request) -> Response:
    """An image a `url` answer links to, while it is kept."""
    files: ImageFiles = request.app.state.image_files
    found = files.get(file_id)
    if found is None:
        raise APIError(
            404,
            f"no image '{file_id}': it expired, was pushed out by newer ones, or never was",
            param="file_id",
            code="image_not_found",
        )
    return Response(found.data, media_type=found.media_type)
