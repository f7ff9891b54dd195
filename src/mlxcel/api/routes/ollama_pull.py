"""Ollama's POST /api/pull and DELETE /api/delete, on the server's own downloads
(`serving/pulls.py`, behind --allow-downloads): Hugging Face repos as Ollama names them
(`hf.co/ORG/NAME:Q4_K_M`), progress as Ollama's NDJSON status lines."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import StreamingResponse

from mlxcel.api.auth import require_api_key
from mlxcel.api.routes.ollama import OllamaRoute, ndjson_stream
from mlxcel.api.routes.pulls import downloads
from mlxcel.hub.inventory import RemoveError, remove
from mlxcel.hub.pull import PullError
from mlxcel.protocol.errors import APIError, invalid_request
from mlxcel.protocol.ollama import DeleteRequest, PullRequest
from mlxcel.serving.pulls import PullJob, PullJobs

router = APIRouter(route_class=OllamaRoute, dependencies=[Depends(require_api_key)])
_HUB_PREFIXES = ("hf.co/", "huggingface.co/", "https://huggingface.co/")


def _repo(name: str | None) -> str:
    """ORG/NAME[:SELECTOR] of an Ollama model name; 400 for Ollama's own library's names."""
    if not name:
        raise invalid_request("'model' is required", "model")
    for prefix in _HUB_PREFIXES:
        if name.startswith(prefix):
            name = name.removeprefix(prefix)
            break
    else:
        if "/" not in name.split(":")[0]:
            raise invalid_request(
                f"'{name}' is a model of Ollama's library, which mlxcel does not fetch: name a "
                "Hugging Face repo, as hf.co/ORG/NAME:Q4_K_M",
                "model",
            )
    # Ollama's tag `latest` means the repo's default file.
    return name.removesuffix(":latest")


def _line(job: PullJob) -> dict[str, Any]:
    progress = job.tracker.progress
    return {
        "status": f"pulling {progress.file or job.spec.repo}",
        "digest": progress.file,
        "total": progress.total,
        "completed": progress.done,
    }


async def _lines(job: PullJob) -> AsyncIterator[dict[str, Any]]:
    yield {"status": "pulling manifest"}
    async for event in PullJobs.events(job):
        if event["type"] == "progress":
            yield _line(job)
        elif event["type"] == "done":
            yield _line(job)
            yield {"status": "success"}
        else:
            raise APIError(400, job.error or f"the pull was {job.status}")


@router.post("/api/pull", response_model=None)
async def pull(body: PullRequest, request: Request) -> StreamingResponse | dict[str, str]:
    """Download a model: NDJSON status lines by default, one object with `stream: false`."""
    jobs = downloads(request)
    try:
        job = await jobs.start(_repo(body.model or body.name))
    except PullError as exc:
        raise invalid_request(str(exc), "model") from None
    if body.stream:
        return await ndjson_stream(_lines(job))
    await asyncio.to_thread(job.ended.wait)
    if job.status != "done":
        raise APIError(400, job.error or f"the pull was {job.status}")
    return {"status": "success"}


@router.delete("/api/delete")
async def delete(body: DeleteRequest, request: Request) -> Response:
    """Remove a pulled model from disk; 404 if there is none by that name."""
    downloads(request)
    try:
        await asyncio.to_thread(remove, _repo(body.model or body.name))
    except RemoveError as exc:
        raise APIError(409 if "in use" in str(exc) else 404, str(exc)) from None
    return Response(status_code=200)
